//! The benchmark's database: a scratch database on a throwaway durable server
//! (fsync on, as in production), or on a server the operator names, created for
//! the run and dropped after it.

use gitops_shared::config::redact_database_url;
use gitops_shared::db;
use gitops_testkit::{PgCluster, PgOptions};

use super::BenchError;

const APPLICATION_NAME: &str = "gitops-bench";

/// A database that exists for one benchmark run.
pub struct Scratch {
    admin_url: String,
    url: String,
    name: String,
    /// The throwaway server, if this run started one.
    cluster: Option<PgCluster>,
}

impl Scratch {
    /// Creates `gitops_bench_<pid>` on `server_url`, or on a throwaway server.
    pub async fn create(server_url: Option<&str>) -> Result<Self, BenchError> {
        let (admin_url, cluster) = match server_url {
            Some(url) => (url.to_owned(), None),
            None => {
                tracing::info!("starting a throwaway durable PostgreSQL");
                let cluster = PgCluster::start(PgOptions { durable: true, max_connections: 400 })
                    .await
                    .map_err(|source| BenchError::StartServer { source })?;
                (cluster.url("postgres"), Some(cluster))
            }
        };
        let name = format!("gitops_bench_{}", std::process::id());
        let admin = db::connect(&admin_url, APPLICATION_NAME).await.map_err(BenchError::db("connect to the server"))?;
        // DDL takes no parameters; the name is ours, made of a fixed prefix and a number.
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(db::DbError::query("create the scratch database"))
            .map_err(BenchError::db("create the scratch database"))?;
        let url = with_database(&admin_url, &name);
        tracing::info!(database = %redact_database_url(&url), "scratch database created");
        Ok(Scratch { admin_url, url, name, cluster })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Drops the database, closing any connection left on it. Failing to is
    /// logged, not returned: the figures are still good.
    pub async fn remove(self) {
        let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let outcome = match db::connect(&self.admin_url, APPLICATION_NAME).await {
            Ok(admin) => admin.batch_execute(&statement).await.map_err(db::DbError::query("drop the scratch database")),
            Err(error) => Err(error),
        };
        if let Err(error) = outcome {
            tracing::warn!(%error, database = %self.name, "could not drop the scratch database; drop it by hand");
        }
        drop(self.cluster);
    }
}

/// `url` pointing at database `name` instead: the path of a URL is replaced (and
/// any `dbname` parameter removed); a key/value string gets a later `dbname`,
/// which wins.
fn with_database(url: &str, name: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!("{url} dbname={name}");
    };
    let (rest, query) = rest.split_once('?').map_or((rest, None), |(r, q)| (r, Some(q)));
    let authority = rest.split('/').next().unwrap_or(rest);
    let mut out = format!("{scheme}://{authority}/{name}");
    let params: Vec<&str> =
        query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.starts_with("dbname=")).collect();
    if !params.is_empty() {
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_name_is_replaced_in_both_url_forms() {
        assert_eq!(
            with_database("postgres://u:pw@127.0.0.1:5432/gitops?sslmode=disable&dbname=x", "b"),
            "postgres://u:pw@127.0.0.1:5432/b?sslmode=disable"
        );
        assert_eq!(with_database("postgresql://127.0.0.1", "b"), "postgresql://127.0.0.1/b");
        assert_eq!(with_database("host=127.0.0.1 dbname=gitops", "b"), "host=127.0.0.1 dbname=gitops dbname=b");
        let parsed =
            gitops_shared::db::parse_config(&with_database("host=127.0.0.1 dbname=gitops", "b")).expect("parses");
        assert_eq!(parsed.get_dbname(), Some("b"));
    }
}
