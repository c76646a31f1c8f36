//! The agent: serves one engine (Argo CD) instance — claims its operations and
//! reconciles Argo CD to the current rows. This build has the start-up checks of
//! `run` (schema, a registered instance) and not yet the reconciler. A library so
//! tests drive the code the binary runs.

use clap::{Args, Parser, Subcommand};
use gitops_shared::config::{self, redact_database_url};
use gitops_shared::db::{self, DbError};
use gitops_shared::instance::{EngineInstance, engine_instance_by_name};
use tokio_postgres::Client;

const APPLICATION_NAME: &str = "gitops-agent";

pub use gitops_shared::config::ENGINE_INSTANCE;

#[derive(Debug, Parser)]
#[command(name = "gitops-agent", version, about = "The GitOps service's agent for one Argo CD instance")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve an engine instance registered with `gitopsctl instance add`.
    Run(RunArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// PostgreSQL URL or key/value connection string.
    #[arg(long, env = config::DATABASE_URL, hide_env_values = true)]
    pub database_url: String,
    /// Name of the engine instance to serve.
    #[arg(long, env = ENGINE_INSTANCE)]
    pub instance: String,
}

/// Why the agent stopped. Messages name the step; sources carry the detail.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("could not connect to {database}")]
    Connect { database: String, source: DbError },
    #[error("refusing to start against this database")]
    Schema { source: DbError },
    #[error("engine instance {name:?} is not registered; register it with `gitopsctl instance add` first")]
    UnknownInstance { name: String },
    #[error("could not look up engine instance {name:?}")]
    LookUpInstance { name: String, source: DbError },
    #[error("the agent's reconciler is not implemented yet; this build only checks its prerequisites")]
    ReconcilerMissing,
}

/// Runs one command.
pub async fn execute(command: Command) -> Result<(), AgentError> {
    match command {
        Command::Run(args) => run(&args).await,
    }
}

/// Checks what the agent needs — a schema it knows and its registered instance —
/// and stops there: the reconciler is not in this build.
pub async fn run(args: &RunArgs) -> Result<(), AgentError> {
    let client = connect(&args.database_url).await?;
    let schema = db::check_schema(&client).await.map_err(|source| AgentError::Schema { source })?;
    tracing::info!(schema.found = schema.found, schema.required = schema.required, "database schema checked");
    let instance = instance(&client, &args.instance).await?;
    tracing::info!(instance.id = %instance.id, instance.name = %instance.name, "engine instance found");
    tracing::warn!("the reconciler is not part of this build");
    Err(AgentError::ReconcilerMissing)
}

/// The registered instance called `name`; an unknown name is refused.
pub async fn instance(client: &Client, name: &str) -> Result<EngineInstance, AgentError> {
    match engine_instance_by_name(client, name).await {
        Ok(instance) => Ok(instance),
        Err(DbError::NotFound { .. }) => Err(AgentError::UnknownInstance { name: name.to_owned() }),
        Err(source) => Err(AgentError::LookUpInstance { name: name.to_owned(), source }),
    }
}

async fn connect(url: &str) -> Result<Client, AgentError> {
    let database = redact_database_url(url);
    tracing::debug!(%database, "connecting");
    db::connect(url, APPLICATION_NAME).await.map_err(|source| AgentError::Connect { database, source })
}
