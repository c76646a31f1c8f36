//! The Handler behind the agent's queue consumer: for each claimed operation it
//! re-reads the current rows of the resource (never the reason it was woken),
//! builds the engine objects and drives the engine, then records on the rows what
//! only the agent can know (deletion confirmed or stuck, a sync's progress). No
//! engine call is made while a database transaction is open; statements run on a
//! pooled connection taken and returned around them.

mod application;
mod credentials;
mod moves;
mod orphans;
mod project;
mod sync;

use gitops_shared::telemetry::error_chain as chain;
use std::sync::Arc;
use std::time::Duration;

use gitops_shared::crypto::{CryptoError, SecretBox};
use gitops_shared::db::application_state::{AgentOutcome, application_state_record_outcome};
use gitops_shared::db::engine_instance::{EngineInstance, InstanceEpoch};
use gitops_shared::db::resource_state::{StateOf, resource_state_record_outcome};
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::model::{
    ApplicationId, ManagedEnvironmentId, RepositoryCredentialId, ResourceType, SyncOperationId, TenantId,
};
use gitops_shared::queue::{ClaimedOperation, Failure, Handler, Outcome};

use crate::destination::{DestinationGuard, DestinationPolicy};
use crate::engine::{Engine, EngineError};
use crate::metrics::Metrics;

/// How long a deletion may hang before the tenant is told why.
pub const DEFAULT_STUCK_DELETION_AFTER: Duration = Duration::from_secs(600);

/// Why a reconcile did not finish. Each variant knows whether trying again helps.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("database access failed")]
    Db(#[from] DbError),
    #[error("the engine call failed")]
    Engine(#[from] EngineError),
    #[error("could not open the stored credentials of {what}")]
    Credentials { what: String, source: CryptoError },
    #[error("stored credentials of {what} are not valid JSON")]
    CredentialsFormat { what: String, source: serde_json::Error },
    /// Not done yet; try again later (the tenant reads `tenant_message`).
    #[error("{operator}")]
    NotYet { operator: String, tenant_message: String },
    /// Cannot be done as the rows stand.
    #[error("{operator}")]
    Refused { operator: String, tenant_message: String },
}

impl ReconcileError {
    pub(crate) fn not_yet(operator: impl Into<String>, tenant_message: impl Into<String>) -> Self {
        ReconcileError::NotYet { operator: operator.into(), tenant_message: tenant_message.into() }
    }

    pub(crate) fn refused(operator: impl Into<String>, tenant_message: impl Into<String>) -> Self {
        ReconcileError::Refused { operator: operator.into(), tenant_message: tenant_message.into() }
    }

    /// The failure recorded on the operation: the full chain for operators, a
    /// short message for the tenant (sanitised once more by the queue).
    pub fn to_failure(&self) -> Failure {
        let operator_error = chain(self);
        match self {
            ReconcileError::Db(_) => Failure::Transient {
                operator_error,
                tenant_message: "a temporary internal error occurred; retrying".into(),
            },
            ReconcileError::Engine(EngineError::Transient { .. }) => Failure::Transient {
                operator_error,
                tenant_message: "Argo CD is temporarily unavailable; retrying".into(),
            },
            ReconcileError::Engine(EngineError::Instance { .. }) => Failure::Transient {
                operator_error,
                tenant_message: "the Argo CD instance serving this namespace is unavailable; retrying until an \
                                 operator restores it"
                    .into(),
            },
            ReconcileError::Engine(EngineError::Conflict { .. }) => Failure::Conflict {
                operator_error,
                tenant_message: "Argo CD's object changed meanwhile; retrying".into(),
            },
            ReconcileError::Engine(EngineError::Refused { tenant_message, .. }) => {
                Failure::Permanent { operator_error, tenant_message: tenant_message.clone() }
            }
            // A key the agent does not have is the instance's configuration, not the tenant's input.
            ReconcileError::Credentials { source: CryptoError::UnknownKey { .. }, .. } => Failure::Transient {
                operator_error,
                tenant_message: "the service cannot read the stored credentials now; retrying until an operator \
                                 restores its keys"
                    .into(),
            },
            ReconcileError::Credentials { .. } | ReconcileError::CredentialsFormat { .. } => Failure::Permanent {
                operator_error,
                tenant_message: "the stored credentials could not be read; update the credentials Secret".into(),
            },
            ReconcileError::NotYet { tenant_message, .. } => {
                Failure::Transient { operator_error, tenant_message: tenant_message.clone() }
            }
            ReconcileError::Refused { tenant_message, .. } => {
                Failure::Permanent { operator_error, tenant_message: tenant_message.clone() }
            }
        }
    }
}

/// Reconciles one engine instance's operations.
#[derive(Debug, Clone)]
pub struct Reconciler {
    pool: DbPool,
    engine: Arc<dyn Engine>,
    secrets: SecretBox,
    instance: EngineInstance,
    /// The epoch status is written at (kept current by the agent's heartbeat).
    epoch: InstanceEpoch,
    stuck_deletion_after: Duration,
    destinations: Arc<DestinationGuard>,
}

impl Reconciler {
    /// A reconciler with the default destination checks (the in-cluster URLs are
    /// the home cluster; no service namespaces or extra patterns) counting into
    /// metrics of its own; see `with_destinations`.
    pub fn new(pool: DbPool, engine: Arc<dyn Engine>, secrets: SecretBox, instance: EngineInstance) -> Self {
        let destinations =
            Arc::new(DestinationGuard::with_defaults(&instance.argocd_namespace, Arc::new(Metrics::default())));
        let epoch = InstanceEpoch::new(instance.id, instance.epoch);
        Reconciler {
            pool,
            engine,
            secrets,
            instance,
            epoch,
            stuck_deletion_after: DEFAULT_STUCK_DELETION_AFTER,
            destinations,
        }
    }

    /// The epoch to write status at, shared with the agent's heartbeat (default: the
    /// instance's when the reconciler was made).
    pub fn with_epoch(mut self, epoch: InstanceEpoch) -> Self {
        self.epoch = epoch;
        self
    }

    /// Which destinations are refused, and where refusals are counted.
    pub fn with_destinations(mut self, destinations: Arc<DestinationGuard>) -> Self {
        self.destinations = destinations;
        self
    }

    /// After how long a hanging deletion is reported on the row (default 10 min).
    pub fn with_stuck_deletion_after(mut self, after: Duration) -> Self {
        self.stuck_deletion_after = after;
        self
    }

    /// The instance served.
    /// The epoch status is written at.
    pub fn epoch(&self) -> &InstanceEpoch {
        &self.epoch
    }

    pub fn instance(&self) -> &EngineInstance {
        &self.instance
    }

    /// Reconciles the resource of `op` to its current rows.
    pub async fn reconcile(&self, op: &ClaimedOperation) -> Result<(), ReconcileError> {
        match op.resource_type {
            ResourceType::Application => self.application(op.tenant_id, ApplicationId(op.resource_id)).await,
            ResourceType::ManagedEnvironment => {
                self.environment(op.tenant_id, ManagedEnvironmentId(op.resource_id)).await
            }
            ResourceType::RepositoryCredential => {
                self.repository(op.tenant_id, RepositoryCredentialId(op.resource_id)).await
            }
            ResourceType::SyncOperation => self.sync(op.tenant_id, SyncOperationId(op.resource_id)).await,
            ResourceType::Tenant => self.tenant(op.tenant_id).await,
            ResourceType::Unknown => Err(ReconcileError::refused(
                "operation of a resource type this agent does not know",
                "this agent cannot handle the resource yet; it will be retried after an upgrade",
            )),
        }
    }

    fn engine(&self) -> &dyn Engine {
        self.engine.as_ref()
    }

    /// The destination policy as of now.
    async fn destination_policy(&self) -> Result<DestinationPolicy, ReconcileError> {
        Ok(self.destinations.policy(&self.pool).await?)
    }
}

/// Refuses a row that belongs to another tenant than the operation says.
fn same_tenant(op_tenant: TenantId, row_tenant: TenantId, what: &str) -> Result<(), ReconcileError> {
    if op_tenant == row_tenant {
        return Ok(());
    }
    Err(ReconcileError::refused(
        format!("{what} belongs to tenant {row_tenant}, the operation to tenant {op_tenant}"),
        "internal inconsistency; an operator has been notified",
    ))
}

impl Reconciler {
    /// Puts the tenant's message of a failed reconcile where the status feed carries
    /// it to the tenant resource (best effort: the operation row has it too). Sync
    /// operations and tenants have no such place: a sync's failure is on its row.
    async fn record_failure(&self, op: &ClaimedOperation, failure: &Failure) {
        let (message, stalled) = match failure {
            Failure::Permanent { tenant_message, .. } => (tenant_message, true),
            Failure::Transient { tenant_message, .. } | Failure::Conflict { tenant_message, .. } => {
                (tenant_message, false)
            }
        };
        let outcome = AgentOutcome::Failed { message: message.clone(), stalled };
        let id = op.resource_id;
        let recorded = async {
            let client = pooled(&self.pool).await?;
            match op.resource_type {
                ResourceType::Application => {
                    application_state_record_outcome(&client, &self.epoch, ApplicationId(id), &outcome).await
                }
                ResourceType::ManagedEnvironment => {
                    resource_state_record_outcome(&client, &self.epoch, StateOf::ManagedEnvironment, id, &outcome).await
                }
                ResourceType::RepositoryCredential => {
                    resource_state_record_outcome(&client, &self.epoch, StateOf::RepositoryCredential, id, &outcome)
                        .await
                }
                ResourceType::SyncOperation | ResourceType::Tenant | ResourceType::Unknown => Ok(()),
            }
        }
        .await;
        if let Err(error) = recorded {
            tracing::warn!(
                %error,
                resource.type = %op.resource_type,
                resource.id = id,
                "could not record a failed reconcile for the tenant"
            );
        }
    }
}

impl Handler for Reconciler {
    async fn handle(&self, op: &ClaimedOperation) -> Outcome {
        match self.reconcile(op).await {
            Ok(()) => Outcome::Done,
            Err(error) => {
                let failure = error.to_failure();
                self.record_failure(op, &failure).await;
                tracing::info!(
                    operation.id = %op.id,
                    resource.type = %op.resource_type,
                    resource.id = op.resource_id,
                    tenant.id = %op.tenant_id,
                    error = %chain(&error),
                    "reconcile did not finish"
                );
                Outcome::Failed(failure)
            }
        }
    }
}
