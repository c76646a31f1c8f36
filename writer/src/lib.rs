//! The writer: watches the tenants' resources and writes their intent, together
//! with the operations that carry it to the agents, into PostgreSQL. This build
//! has the writer's operational side — `migrate`, and the start-up checks of
//! `run` — and not yet its tenant controllers. A library so tests drive the code
//! the binary runs.

pub mod api;
pub mod validate;

use clap::{Args, Parser, Subcommand};
use gitops_shared::config::{self, redact_database_url};
use gitops_shared::crypto::{CryptoError, SecretBox};
use gitops_shared::db::{self, DbError, MigrationReport};
use tokio_postgres::Client;

const APPLICATION_NAME: &str = "gitops-writer";

#[derive(Debug, Parser)]
#[command(name = "gitops-writer", version, about = "The GitOps service's writer: tenant intent into PostgreSQL")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply the schema migrations this binary embeds and print the resulting version.
    Migrate(DbArgs),
    /// Run the writer. Needs the encryption keys (GITOPS_ENCRYPTION_KEYS,
    /// GITOPS_ENCRYPTION_ACTIVE_KEY) and a schema at least as new as this binary's.
    Run(DbArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// PostgreSQL URL or key/value connection string.
    #[arg(long, env = config::DATABASE_URL, hide_env_values = true)]
    pub database_url: String,
}

/// Why the writer stopped. Messages name the step; sources carry the detail.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    #[error("refusing to start without usable encryption keys")]
    Keys { source: CryptoError },
    #[error("could not connect to {database}")]
    Connect { database: String, source: DbError },
    #[error("could not migrate the database")]
    Migrate { source: DbError },
    #[error("refusing to start against this database")]
    Schema { source: DbError },
    #[error("the writer's controllers are not implemented yet; this build only migrates and checks its prerequisites")]
    ControllersMissing,
}

/// Runs one command; returns what to print on stdout.
pub async fn execute(command: Command) -> Result<String, WriterError> {
    match command {
        Command::Migrate(args) => Ok(render_migration(&migrate(&args.database_url).await?)),
        Command::Run(args) => run(&args.database_url).await.map(|()| String::new()),
    }
}

/// Applies every embedded migration not yet applied, on a dedicated connection.
pub async fn migrate(database_url: &str) -> Result<MigrationReport, WriterError> {
    let mut client = connect(database_url).await?;
    db::migrate(&mut client).await.map_err(|source| WriterError::Migrate { source })
}

/// One line per applied migration, then the resulting version.
pub fn render_migration(report: &MigrationReport) -> String {
    let mut out: String = report.applied.iter().map(|name| format!("applied {name}\n")).collect();
    if report.applied.is_empty() {
        out.push_str("no migrations to apply\n");
    }
    out.push_str(&format!("schema version {}\n", report.version));
    out
}

/// Checks what the writer needs — keys, then a database with a schema it knows —
/// and stops there: the controllers are not in this build.
pub async fn run(database_url: &str) -> Result<(), WriterError> {
    let secrets = SecretBox::from_env().map_err(|source| WriterError::Keys { source })?;
    tracing::info!(active_key = secrets.active_key_id(), "encryption keys loaded");
    let client = connect(database_url).await?;
    let schema = db::check_schema(&client).await.map_err(|source| WriterError::Schema { source })?;
    tracing::info!(schema.found = schema.found, schema.required = schema.required, "database schema checked");
    tracing::warn!("the tenant controllers are not part of this build");
    Err(WriterError::ControllersMissing)
}

async fn connect(url: &str) -> Result<Client, WriterError> {
    let database = redact_database_url(url);
    tracing::debug!(%database, "connecting");
    db::connect(url, APPLICATION_NAME).await.map_err(|source| WriterError::Connect { database, source })
}
