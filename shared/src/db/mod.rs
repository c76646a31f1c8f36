//! Database access: the connection pool, dedicated connections (TLS as the
//! connection string's `sslmode` says), embedded migrations, the start-up schema
//! check and the retry wrapper for transactions that PostgreSQL aborts on
//! serialization failures and deadlocks; and one module per table (or tight group
//! of tables) holding every statement that reads or writes it, each listed in its
//! `STATEMENTS` (the operation queue's live in `crate::queue`, its home).

pub mod admission_approval;
pub mod application;
pub mod application_state;
pub mod credential;
pub mod desired;
pub mod engine_instance;
mod error;
pub mod failover;
pub mod fleet_balance;
pub mod instance_duty;
pub mod instance_health;
pub mod instance_scale_up;
pub mod managed_environment;
mod migrate;
pub mod placed_rows;
pub mod placement;
pub mod purge;
pub mod resource_state;
pub mod resync;
pub mod rollout;
pub mod status_feed;
pub mod status_retry;
pub mod sync_operation;
pub mod tenant;
pub mod tenant_move;
mod tls;
pub mod tombstone;
pub mod writer_shard;

use std::time::Duration;

pub use error::DbError;

/// Every statement of every table module, by module: one test prepares them all
/// against the migrated schema, so a renamed column fails a test, not production.
pub const STATEMENTS: &[(&str, &[&str])] = &[
    ("admission_approval", admission_approval::STATEMENTS),
    ("application", application::STATEMENTS),
    ("application_state", application_state::STATEMENTS),
    ("credential", credential::STATEMENTS),
    ("desired", desired::STATEMENTS),
    ("engine_instance", engine_instance::STATEMENTS),
    ("failover", failover::STATEMENTS),
    ("failover (agent)", failover::AGENT_STATEMENTS),
    ("fleet_balance", fleet_balance::STATEMENTS),
    ("instance_duty", instance_duty::STATEMENTS),
    ("instance_health", instance_health::STATEMENTS),
    ("instance_scale_up", instance_scale_up::STATEMENTS),
    ("managed_environment", managed_environment::STATEMENTS),
    ("placed_rows", placed_rows::STATEMENTS),
    ("placement", placement::STATEMENTS),
    ("purge", purge::STATEMENTS),
    ("resource_state", resource_state::STATEMENTS),
    ("resync", resync::STATEMENTS),
    ("rollout", rollout::STATEMENTS),
    ("status_feed", status_feed::STATEMENTS),
    ("status_retry", status_retry::STATEMENTS),
    ("sync_operation", sync_operation::STATEMENTS),
    ("tenant", tenant::STATEMENTS),
    ("tenant_move", tenant_move::STATEMENTS),
    ("tombstone", tombstone::STATEMENTS),
    ("writer_shard", writer_shard::STATEMENTS),
    ("queue::horizon", crate::queue::HORIZON_STATEMENTS),
];
pub use migrate::{MigrationReport, SchemaVersion, check_schema, migrate, required_schema_version, schema_version};
pub use tls::{MakeRustlsConnect, RootCerts, SslMode, TlsParams, split_tls_params};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::future::BoxFuture;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row, Statement, Transaction};

/// The pool every component uses for ordinary statements.
pub type DbPool = Pool;

/// A connection taken from a [`DbPool`]; back in the pool when dropped.
pub type PooledClient = deadpool_postgres::Object;
/// What a [`PooledClient`] holds: the connection and its kept statements.
pub type PooledConnection = deadpool_postgres::ClientWrapper;
/// A transaction on a [`PooledConnection`] (it derefs to `tokio_postgres::Transaction`).
pub type PooledTransaction<'a> = deadpool_postgres::Transaction<'a>;

/// A connection string taken apart: tokio-postgres's settings (TLS off, optional
/// or mandatory, as `sslmode` says) and the connector that does the TLS.
#[derive(Debug, Clone)]
pub struct ConnectConfig {
    pub config: Config,
    pub tls: MakeRustlsConnect,
}

impl ConnectConfig {
    /// Parses `url` (URL or key/value form, `sslmode`/`sslrootcert` included) and
    /// loads the CA certificates it names.
    pub fn parse(url: &str) -> Result<Self, DbError> {
        let (config, tls) = parse_parts(url)?;
        Ok(ConnectConfig { config, tls: MakeRustlsConnect::new(&tls)? })
    }

    /// Opens one connection; its task runs until the client is dropped.
    pub async fn connect(&self) -> Result<Client, DbError> {
        let (client, connection) =
            self.config.connect(self.tls.clone()).await.map_err(|source| DbError::Connect { source })?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "database connection ended");
            }
        });
        Ok(client)
    }
}

/// Parses a connection URL or key/value string, naming what was wrong without
/// echoing the string (it may hold a password). The TLS parameters are checked
/// and reflected in `ssl_mode`, but the result has no TLS connector: connect with
/// `connect`, `pool` or `ConnectConfig`.
pub fn parse_config(url: &str) -> Result<Config, DbError> {
    parse_parts(url).map(|(config, _)| config)
}

fn parse_parts(url: &str) -> Result<(Config, TlsParams), DbError> {
    let (rest, tls) = split_tls_params(url)?;
    let mut config = rest.parse::<Config>().map_err(|source| DbError::InvalidUrl { source })?;
    config.ssl_mode(tls.mode.negotiation());
    Ok((config, tls))
}

/// Builds a pool of `size` connections. Connections are opened lazily.
pub fn pool(url: &str, size: usize, application_name: &str) -> Result<DbPool, DbError> {
    pool_with_lock_timeout(url, size, application_name, None)
}

/// [`pool`] whose sessions wait at most `lock_timeout` for any lock (None: as the
/// server says). For a component that may be killed while its statements wait: a
/// session whose client is gone only notices when its statement ends, holding its
/// locks until then.
pub fn pool_with_lock_timeout(
    url: &str,
    size: usize,
    application_name: &str,
    lock_timeout: Option<Duration>,
) -> Result<DbPool, DbError> {
    let ConnectConfig { mut config, tls } = ConnectConfig::parse(url)?;
    if config.get_application_name().is_none() {
        config.application_name(application_name);
    }
    let manager = Manager::from_config(config, tls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let mut builder = Pool::builder(manager);
    if let Some(timeout) = lock_timeout {
        let set = format!("SET lock_timeout = {}", timeout.as_millis().max(1));
        builder = builder.post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
            let set = set.clone();
            Box::pin(async move { client.batch_execute(&set).await.map_err(deadpool_postgres::HookError::Backend) })
        }));
    }
    builder
        .max_size(size.max(1))
        .wait_timeout(Some(Duration::from_secs(30)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|source| DbError::PoolBuild { source })
}

/// Opens one connection outside any pool (for LISTEN and migrations); the
/// connection task runs until the client is dropped.
pub async fn connect(url: &str, application_name: &str) -> Result<Client, DbError> {
    let mut connect = ConnectConfig::parse(url)?;
    if connect.config.get_application_name().is_none() {
        connect.config.application_name(application_name);
    }
    connect.connect().await
}

/// The connection `held` keeps between rounds (a lease keeper's own, so it never
/// waits behind a busy pool), taken from `pool` when there is none or it closed.
pub async fn held_or_pooled<'a>(
    pool: &DbPool,
    held: &'a mut Option<PooledClient>,
) -> Result<&'a mut PooledClient, DbError> {
    let client = match held.take() {
        Some(client) if !client.is_closed() => client,
        _ => pooled(pool).await?,
    };
    Ok(held.insert(client))
}

/// Takes a pooled connection.
pub async fn pooled(pool: &DbPool) -> Result<PooledClient, DbError> {
    pool.get().await.map_err(|source| DbError::Pool { source })
}

/// A connection statements are prepared on. A pooled connection prepares each
/// statement once and keeps it (and, after a few runs, its plan): a run is then one
/// exchange that binds and executes, with no parsing or planning. A bare connection
/// or transaction prepares it each time, as running SQL text does.
pub trait Statements: Sync {
    /// The connection the statements run on (a transaction's, inside it).
    fn connection(&self) -> &Client;

    /// `sql`, prepared on this connection.
    fn statement(&self, sql: &str) -> impl Future<Output = Result<Statement, tokio_postgres::Error>> + Send;

    /// Drops `sql` from the statements this connection keeps (after an error: a
    /// kept statement that fails, say because a migration changed its result
    /// columns, is prepared again on the next try instead of failing for good).
    fn forget(&self, _sql: &str) {}

    /// The rows of `sql`.
    fn rows(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> impl Future<Output = PgResult<Vec<Row>>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            let rows = self.connection().query(&statement, params).await;
            self.forget_on_error(sql, rows)
        }
    }

    /// The row of `sql`, if any (an error if more than one).
    fn row_opt(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> impl Future<Output = PgResult<Option<Row>>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            let row = self.connection().query_opt(&statement, params).await;
            self.forget_on_error(sql, row)
        }
    }

    /// The one row of `sql`.
    fn row(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> impl Future<Output = PgResult<Row>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            let row = self.connection().query_one(&statement, params).await;
            self.forget_on_error(sql, row)
        }
    }

    /// Runs `sql`; the rows it changed.
    fn run(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> impl Future<Output = PgResult<u64>> + Send {
        async move {
            let statement = self.statement(sql).await?;
            let changed = self.connection().execute(&statement, params).await;
            self.forget_on_error(sql, changed)
        }
    }

    #[doc(hidden)]
    fn forget_on_error<T>(&self, sql: &str, result: PgResult<T>) -> PgResult<T> {
        if result.is_err() {
            self.forget(sql);
        }
        result
    }
}

type PgResult<T> = Result<T, tokio_postgres::Error>;

impl Statements for Client {
    fn connection(&self) -> &Client {
        self
    }

    async fn statement(&self, sql: &str) -> PgResult<Statement> {
        self.prepare(sql).await
    }
}

impl Statements for Transaction<'_> {
    fn connection(&self) -> &Client {
        self.client()
    }

    async fn statement(&self, sql: &str) -> PgResult<Statement> {
        self.prepare(sql).await
    }
}

impl Statements for PooledClient {
    fn connection(&self) -> &Client {
        self
    }

    async fn statement(&self, sql: &str) -> PgResult<Statement> {
        self.prepare_cached(sql).await
    }

    fn forget(&self, sql: &str) {
        self.statement_cache.remove(sql, &[]);
    }
}

impl Statements for deadpool_postgres::Transaction<'_> {
    fn connection(&self) -> &Client {
        self.client()
    }

    async fn statement(&self, sql: &str) -> PgResult<Statement> {
        self.prepare_cached(sql).await
    }

    fn forget(&self, sql: &str) {
        self.statement_cache.remove(sql, &[]);
    }
}

/// How many times `in_txn_retrying` runs a transaction that PostgreSQL aborted
/// because of a serialization failure or a deadlock.
const TXN_ATTEMPTS: u32 = 5;

/// Runs `body` in a READ COMMITTED transaction and commits it, starting over when
/// PostgreSQL aborts it with a serialization failure or a deadlock. The body must
/// be safe to run again: it sees nothing of the aborted attempt.
///
/// The body returns a boxed future (`|txn| Box::pin(async move { … })`) so that
/// the compiler can see it is `Send` for every transaction lifetime.
pub async fn in_txn_retrying<T, F>(client: &mut Client, mut body: F) -> Result<T, DbError>
where
    F: for<'t> FnMut(&'t Transaction<'t>) -> BoxFuture<'t, Result<T, DbError>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let txn = client.transaction().await.map_err(DbError::query("begin"))?;
        let outcome = match body(&txn).await {
            Ok(value) => txn.commit().await.map(|()| value).map_err(DbError::query("commit")),
            Err(error) => Err(error),
        };
        if !retry_after_conflict(&outcome, attempt).await {
            return outcome;
        }
    }
}

/// [`in_txn_retrying`] on a pooled connection: the body's transaction keeps the
/// statements it prepares ([`Statements`]) on the connection.
pub async fn in_pooled_txn_retrying<T, F>(
    client: &mut deadpool_postgres::ClientWrapper,
    mut body: F,
) -> Result<T, DbError>
where
    F: for<'t> FnMut(&'t deadpool_postgres::Transaction<'t>) -> BoxFuture<'t, Result<T, DbError>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let txn = client.transaction().await.map_err(DbError::query("begin"))?;
        let outcome = match body(&txn).await {
            Ok(value) => txn.commit().await.map(|()| value).map_err(DbError::query("commit")),
            Err(error) => Err(error),
        };
        if !retry_after_conflict(&outcome, attempt).await {
            return outcome;
        }
    }
}

/// Whether a transaction that ended with `outcome` at its `attempt` runs again: it
/// was aborted by a serialization failure or a deadlock, and attempts are left (a
/// short pause first).
async fn retry_after_conflict<T>(outcome: &Result<T, DbError>, attempt: u32) -> bool {
    match outcome {
        Err(error) if error.is_retryable_conflict() && attempt < TXN_ATTEMPTS => {
            tracing::debug!(attempt, %error, "transaction conflict, running it again");
            tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
            true
        }
        _ => false,
    }
}

/// Column `name` of `row`, for the statement `action` describes.
pub fn column<'a, T>(row: &'a tokio_postgres::Row, name: &str, action: &'static str) -> Result<T, DbError>
where
    T: tokio_postgres::types::FromSql<'a>,
{
    row.try_get(name).map_err(DbError::query(action))
}
