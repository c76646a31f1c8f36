//! Test support shared by the integration tests and by `gitops-dev up`/`bench`:
//! a throwaway PostgreSQL (or the server in `GITOPS_TEST_DATABASE_URL`), a
//! migrated template database, and a fresh database per test; the Kubernetes API
//! emulator (`kube_emulator`), the Argo CD stand-in (`argocd`), and `cluster`,
//! which hands each test a Kubernetes API (the emulator, or a real cluster).

pub mod admission;
pub mod argocd;
pub mod cluster;
pub mod git_server;
pub mod kube_emulator;
mod postgres;
pub mod proxy;
pub mod random;

use std::sync::atomic::{AtomicU32, Ordering};

use gitops_shared::db::{self, DbPool};
use tokio::sync::OnceCell;

pub use postgres::{PgCluster, PgError, PgOptions, find_bin_dir};

/// A PostgreSQL server the tests use instead of a throwaway one (they create and
/// drop databases on it, so never plain `DATABASE_URL`).
pub const TEST_DATABASE_URL: &str = "GITOPS_TEST_DATABASE_URL";
/// A Kubernetes cluster the tests use instead of the emulator.
pub const TEST_KUBECONFIG: &str = "GITOPS_TEST_KUBECONFIG";

/// The server the tests of this process use, with its migrated template.
#[derive(Debug)]
pub struct TestServer {
    /// Superuser URL up to and including the '/' before the database name.
    base: String,
    /// The URL's parameters (`?sslmode=…`), kept for every database.
    params: String,
    template: String,
    /// Keeps a throwaway server alive for the whole run.
    _cluster: Option<PgCluster>,
}

static SERVER: OnceCell<TestServer> = OnceCell::const_new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

impl TestServer {
    /// The per-process server: started (and its template migrated) on first use.
    pub async fn get() -> &'static TestServer {
        SERVER
            .get_or_init(|| async {
                match TestServer::start().await {
                    Ok(server) => server,
                    Err(error) => panic!("test PostgreSQL unavailable: {error}"),
                }
            })
            .await
    }

    async fn start() -> Result<TestServer, PgError> {
        let ((base, params), cluster) = match std::env::var(TEST_DATABASE_URL).ok().filter(|u| !u.is_empty()) {
            Some(url) => (split_url(&url), None),
            None => {
                let cluster = PgCluster::start(PgOptions::default()).await?;
                ((cluster.url(""), String::new()), Some(cluster))
            }
        };
        let template = format!("gitops_tpl_{}", std::process::id());
        let admin = db::connect(&format!("{base}postgres{params}"), "gitops-testkit").await?;
        for statement in [format!("DROP DATABASE IF EXISTS {template}"), format!("CREATE DATABASE {template}")] {
            admin.batch_execute(&statement).await.map_err(db::DbError::query("create the template database"))?;
        }
        {
            let mut client = db::connect(&format!("{base}{template}{params}"), "gitops-testkit").await?;
            db::migrate(&mut client).await?;
        }
        Ok(TestServer { base, params, template, _cluster: cluster })
    }

    /// URL of database `name` on this server.
    pub fn url(&self, name: &str) -> String {
        format!("{}{name}{}", self.base, self.params)
    }

    /// A new, empty database (no migrations), for migration tests.
    pub async fn empty_db(&'static self) -> TestDb {
        self.create_db(None).await
    }

    /// A new database with the current schema.
    pub async fn migrated_db(&'static self) -> TestDb {
        self.create_db(Some(&self.template)).await
    }

    async fn create_db(&'static self, template: Option<&str>) -> TestDb {
        let name = format!("gitops_t{}_{}", std::process::id(), NEXT_DB.fetch_add(1, Ordering::Relaxed));
        let admin = db::connect(&self.url("postgres"), "gitops-testkit").await.expect("connect to the test server");
        let statement = match template {
            Some(template) => format!("CREATE DATABASE {name} TEMPLATE {template}"),
            None => format!("CREATE DATABASE {name}"),
        };
        admin.batch_execute(&statement).await.expect("create a test database");
        TestDb { server: self, name }
    }
}

/// A database owned by one test; dropped (with its connections) when the test ends.
#[derive(Debug)]
pub struct TestDb {
    server: &'static TestServer,
    pub name: String,
}

impl TestDb {
    /// A database with the current schema, on the shared test server.
    pub async fn migrated() -> TestDb {
        TestServer::get().await.migrated_db().await
    }

    /// An empty database on the shared test server.
    pub async fn empty() -> TestDb {
        TestServer::get().await.empty_db().await
    }

    pub fn url(&self) -> String {
        self.server.url(&self.name)
    }

    /// A pool of `size` connections to this database.
    pub fn pool(&self, size: usize) -> DbPool {
        db::pool(&self.url(), size, "gitops-test").expect("build a pool")
    }

    /// A dedicated connection.
    pub async fn connect(&self) -> tokio_postgres::Client {
        db::connect(&self.url(), "gitops-test").await.expect("connect to the test database")
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let url = self.server.url("postgres");
        let statement = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        // Drop runs outside any runtime guarantee; a short-lived one does the work.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                if let Ok(admin) = db::connect(&url, "gitops-testkit").await {
                    let _ = admin.batch_execute(&statement).await;
                }
            });
        })
        .join();
    }
}

/// Splits a URL into everything before the database name and its parameters.
fn split_url(url: &str) -> (String, String) {
    let (url, params) = match url.split_once('?') {
        Some((url, params)) => (url, format!("?{params}")),
        None => (url, String::new()),
    };
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let authority = rest.split('/').next().unwrap_or(rest);
            (format!("{scheme}://{authority}/"), params)
        }
        None => (url.to_owned(), params),
    }
}
