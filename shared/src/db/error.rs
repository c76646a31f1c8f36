//! `DbError`: what failed in the database layer, with the action that failed.

use tokio_postgres::error::SqlState;

/// A failure in the database layer. Messages name the action; the source keeps the
/// server's detail for operators. None of them repeats a connection string.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database URL")]
    InvalidUrl { source: tokio_postgres::Error },
    #[error("unknown sslmode in {origin}; use one of disable, prefer, require, verify-ca, verify-full")]
    UnknownSslMode { origin: &'static str },
    #[error("sslmode={mode} may not be used with sslrootcert=system; use verify-full (or leave sslmode out)")]
    WeakSslModeForSystemRoots { mode: super::tls::SslMode },
    #[error(
        "sslmode={mode} needs CA certificates to check the server against: set sslrootcert to a PEM \
         file (or to `system`, with verify-full)"
    )]
    RootCertsMissing { mode: super::tls::SslMode },
    #[error("could not read the CA certificates in sslrootcert {path:?}")]
    LoadRootCerts { path: std::path::PathBuf, source: rustls::pki_types::pem::Error },
    #[error("sslrootcert {path:?} holds no usable CA certificate")]
    NoRootCerts { path: std::path::PathBuf },
    #[error(
        "sslrootcert=system, but no CA bundle was found (set SSL_CERT_FILE, or install the \
         ca-certificates package)"
    )]
    SystemRootCertsMissing,
    #[error("could not set up TLS for database connections")]
    TlsSetup { source: rustls::Error },
    #[error("could not connect to the database")]
    Connect { source: tokio_postgres::Error },
    #[error("could not build the connection pool")]
    PoolBuild { source: deadpool_postgres::BuildError },
    #[error("could not take a connection from the pool")]
    Pool { source: deadpool_postgres::PoolError },
    #[error("database statement failed: {action}")]
    Query { action: &'static str, source: tokio_postgres::Error },
    #[error("migration failed")]
    Migrate { source: refinery::Error },
    #[error(
        "the database schema is at version {found}, this binary needs at least {required}; \
         run `gitops-writer migrate` (or the refinery CLI) first"
    )]
    SchemaTooOld { found: i64, required: i64 },
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("the listener does not listen on {channel}")]
    NotListening { channel: String },
    #[error("operation {operation} kept racing a new waiting operation of its resource")]
    KeptRacing { operation: i64 },
    #[error("rows of type {resource_type} are not confirmed deleted this way")]
    NoDeletionConfirmation { resource_type: String },
    #[error("invalid engine instance: {message}")]
    InvalidInstance { message: String },
    #[error("engine instance {name:?} already exists")]
    InstanceExists { name: String },
    #[error(
        "engine instance {name:?} still has {tenants} tenants or queued operations; move them first \
         (gitopsctl instance drain {name})"
    )]
    InstanceInUse { name: String, tenants: i64 },
    #[error("could not store credentials")]
    Credentials { source: Box<dyn std::error::Error + Send + Sync> },
    /// A tenant move that cannot start; the message says why.
    #[error("{message}")]
    InvalidMove { message: String },
}

impl DbError {
    /// Adapter for `map_err`: `client.query(..).await.map_err(DbError::query("claim"))`.
    pub fn query(action: &'static str) -> impl FnOnce(tokio_postgres::Error) -> DbError {
        move |source| DbError::Query { action, source }
    }

    /// The SQLSTATE of the server error behind this one, if any.
    pub fn sql_state(&self) -> Option<&SqlState> {
        match self {
            DbError::Query { source, .. } | DbError::Connect { source } => source.code(),
            _ => None,
        }
    }

    /// A serialization failure or deadlock: the transaction may be run again.
    pub fn is_retryable_conflict(&self) -> bool {
        matches!(
            self.sql_state(),
            Some(s) if *s == SqlState::T_R_SERIALIZATION_FAILURE || *s == SqlState::T_R_DEADLOCK_DETECTED
        )
    }

    /// A unique constraint refused the statement.
    pub fn is_unique_violation(&self) -> bool {
        matches!(self.sql_state(), Some(s) if *s == SqlState::UNIQUE_VIOLATION)
    }
}
