//! The desired state the agent reconciles to: one read per resource type that
//! returns everything needed to build that resource's engine objects, and the
//! agent's few writes back (deletion confirmed, a stuck deletion reported, the
//! progress and result of a sync). Reads join through `tenant_id`, so a row never
//! picks up another tenant's environment or application.

use std::time::{Duration, SystemTime};

use tokio_postgres::{Client, Row};
use uuid::Uuid;

use crate::crypto::Sealed;
use crate::db::{DbError, Statements};
use crate::model::{
    ApplicationId, ManagedEnvironmentId, RepositoryCredentialId, ResourceType, RowState, SyncOperationId,
    SyncOperationState, SyncType, TenantId,
};

/// An application row with its tenant and destination environment.
#[derive(Debug, Clone)]
pub struct DesiredApplication {
    pub id: ApplicationId,
    pub tenant_id: TenantId,
    pub resource_uid: Uuid,
    pub resource_name: String,
    /// The generation of the tenant resource this row holds.
    pub generation: i64,
    pub repo_url: String,
    pub path: String,
    pub target_revision: String,
    pub destination_namespace: String,
    pub sync_type: SyncType,
    pub create_namespace: bool,
    pub row_state: RowState,
    /// How long ago the row last changed (for a deleting row: since deletion began).
    pub unchanged_for: Duration,
    pub tenant_namespace: String,
    /// The row's `managed_environment_id` (set while `environment` is None means
    /// the environment is not the tenant's: never deploy then).
    pub managed_environment_id: Option<ManagedEnvironmentId>,
    /// The destination environment, when not the tenant's own namespace.
    pub environment: Option<EnvironmentRef>,
}

/// The environment an application deploys to.
#[derive(Debug, Clone)]
pub struct EnvironmentRef {
    pub id: ManagedEnvironmentId,
    pub api_url: String,
    pub row_state: RowState,
    /// The tenant's home environment (its own namespace on the home cluster).
    pub home: bool,
    /// The environment allows cluster-scoped resources (its Applications then use
    /// the environment's own project).
    pub cluster_resources: bool,
}

/// A managed environment with its sealed credentials.
#[derive(Debug, Clone)]
pub struct DesiredEnvironment {
    pub id: ManagedEnvironmentId,
    pub tenant_id: TenantId,
    pub resource_uid: Uuid,
    pub resource_name: String,
    /// The generation of the tenant resource this row holds.
    pub generation: i64,
    pub api_url: String,
    pub allow_insecure_skip_tls_verify: bool,
    pub namespaces: Vec<String>,
    pub cluster_resources: bool,
    pub row_state: RowState,
    /// The tenant's home environment (its own namespace on the home cluster).
    pub home: bool,
    /// Sealed `ClusterCredentials` (table `cluster_credential`).
    pub credentials: Option<Sealed>,
}

/// A repository credential; `credentials` is None until its Secret is valid.
#[derive(Debug, Clone)]
pub struct DesiredRepositoryCredential {
    pub id: RepositoryCredentialId,
    pub tenant_id: TenantId,
    pub resource_uid: Uuid,
    pub resource_name: String,
    /// The generation of the tenant resource this row holds.
    pub generation: i64,
    pub repo_url: String,
    pub row_state: RowState,
    /// Sealed `RepositoryCredentials` (table `repository_credential`).
    pub credentials: Option<Sealed>,
}

/// A sync operation and the application it syncs.
#[derive(Debug, Clone)]
pub struct DesiredSyncOperation {
    pub id: SyncOperationId,
    pub tenant_id: TenantId,
    pub resource_name: String,
    pub deployment_name: String,
    pub revision: String,
    pub correlation_id: Uuid,
    pub state: SyncOperationState,
    pub terminate_requested: bool,
    pub row_state: RowState,
    /// The application, when it exists (same tenant).
    pub application: Option<SyncTarget>,
}

/// What a sync needs of its application.
#[derive(Debug, Clone)]
pub struct SyncTarget {
    pub id: ApplicationId,
    pub resource_uid: Uuid,
    pub row_state: RowState,
    pub sync_type: SyncType,
}

/// Everything a tenant's project is built from: rows that are `active` or still
/// `deleting` (Argo CD must keep permitting what it is still pruning).
#[derive(Debug, Clone)]
pub struct TenantProject {
    pub tenant_id: TenantId,
    pub namespace_name: String,
    pub row_state: RowState,
    /// Repository URLs of the tenant's applications and repository credentials.
    pub repo_urls: Vec<String>,
    pub environments: Vec<ProjectEnvironment>,
}

/// One environment as the project sees it.
#[derive(Debug, Clone)]
pub struct ProjectEnvironment {
    pub id: ManagedEnvironmentId,
    pub api_url: String,
    /// The environment's allowed namespaces (empty: not restricted by the tenant).
    pub namespaces: Vec<String>,
    pub cluster_resources: bool,
    /// Namespaces the tenant's applications deploy to on this environment.
    pub application_namespaces: Vec<String>,
    /// The tenant's home environment (its own namespace on the home cluster).
    pub home: bool,
}

const APPLICATION: &str = "
SELECT a.id, a.tenant_id, a.resource_uid, a.resource_name, a.generation, a.repo_url, a.path, a.target_revision,
       a.destination_namespace, a.sync_type, a.create_namespace, a.row_state,
       EXTRACT(EPOCH FROM (now() - a.updated_at))::float8 AS unchanged_for_s, t.namespace_name,
       e.id AS environment_id, e.api_url AS environment_api_url, e.row_state AS environment_row_state,
       a.managed_environment_id, e.home AS environment_home,
       e.cluster_resources AS environment_cluster_resources
  FROM application a
  JOIN tenant t ON t.id = a.tenant_id
  LEFT JOIN managed_environment e ON e.id = a.managed_environment_id AND e.tenant_id = a.tenant_id
 WHERE a.id = $1";

const ENVIRONMENT: &str = "
SELECT e.id, e.tenant_id, e.resource_uid, e.resource_name, e.generation, e.api_url, e.allow_insecure_skip_tls_verify,
       e.namespaces, e.cluster_resources, e.row_state, c.key_id, c.ciphertext, e.home
  FROM managed_environment e
  LEFT JOIN cluster_credential c ON c.managed_environment_id = e.id AND c.tenant_id = e.tenant_id
 WHERE e.id = $1";

const REPOSITORY_CREDENTIAL: &str = "
SELECT id, tenant_id, resource_uid, resource_name, generation, repo_url, row_state, key_id, ciphertext
  FROM repository_credential WHERE id = $1";

const SYNC_OPERATION: &str = "
SELECT s.id, s.tenant_id, s.resource_name, s.deployment_name, s.revision, s.correlation_id, s.state,
       s.terminate_requested, s.row_state, a.id AS application_id, a.resource_uid AS application_resource_uid,
       a.row_state AS application_row_state, a.sync_type AS application_sync_type
  FROM sync_operation s
  LEFT JOIN application a ON a.id = s.application_id AND a.tenant_id = s.tenant_id
 WHERE s.id = $1";

const TENANT: &str = "SELECT id, namespace_name, row_state FROM tenant WHERE id = $1";

const TENANT_REPOS: &str = "
SELECT repo_url FROM application WHERE tenant_id = $1 AND row_state <> 'deleted'
 UNION
SELECT repo_url FROM repository_credential WHERE tenant_id = $1 AND row_state <> 'deleted'
 ORDER BY 1";

const TENANT_ENVIRONMENTS: &str = "
SELECT e.id, e.api_url, e.namespaces, e.cluster_resources,
       COALESCE(array_agg(DISTINCT a.destination_namespace ORDER BY a.destination_namespace)
                FILTER (WHERE a.id IS NOT NULL), '{}') AS application_namespaces,
       e.home
  FROM managed_environment e
  LEFT JOIN application a
         ON a.managed_environment_id = e.id AND a.tenant_id = e.tenant_id AND a.row_state <> 'deleted'
 WHERE e.tenant_id = $1 AND e.row_state <> 'deleted'
 GROUP BY e.id
 ORDER BY e.id";

const ENVIRONMENT_APPLICATIONS: &str = "
SELECT id FROM application
 WHERE managed_environment_id = $1 AND tenant_id = $2 AND row_state <> 'deleted'
 ORDER BY id";

const TENANT_REPOSITORY_CREDENTIALS: &str = "
SELECT id FROM repository_credential WHERE tenant_id = $1 AND row_state <> 'deleted' ORDER BY id";

type RowResult<T> = Result<T, tokio_postgres::Error>;

/// Sealed credentials from the `key_id` and `ciphertext` columns (None without them).
fn sealed(row: &Row) -> RowResult<Option<Sealed>> {
    Ok(match (row.try_get::<_, Option<String>>("key_id")?, row.try_get::<_, Option<Vec<u8>>>("ciphertext")?) {
        (Some(key_id), Some(ciphertext)) => Some(Sealed { key_id, ciphertext }),
        _ => None,
    })
}

impl TryFrom<&Row> for DesiredApplication {
    type Error = tokio_postgres::Error;

    fn try_from(row: &Row) -> RowResult<Self> {
        let environment = match row.try_get::<_, Option<ManagedEnvironmentId>>("environment_id")? {
            Some(id) => Some(EnvironmentRef {
                id,
                api_url: row.try_get("environment_api_url")?,
                row_state: row.try_get("environment_row_state")?,
                home: row.try_get("environment_home")?,
                cluster_resources: row.try_get("environment_cluster_resources")?,
            }),
            None => None,
        };
        Ok(DesiredApplication {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            resource_uid: row.try_get("resource_uid")?,
            resource_name: row.try_get("resource_name")?,
            generation: row.try_get("generation")?,
            repo_url: row.try_get("repo_url")?,
            path: row.try_get("path")?,
            target_revision: row.try_get("target_revision")?,
            destination_namespace: row.try_get("destination_namespace")?,
            sync_type: row.try_get("sync_type")?,
            create_namespace: row.try_get("create_namespace")?,
            row_state: row.try_get("row_state")?,
            unchanged_for: Duration::from_secs_f64(row.try_get::<_, f64>("unchanged_for_s")?.max(0.0)),
            tenant_namespace: row.try_get("namespace_name")?,
            managed_environment_id: row.try_get("managed_environment_id")?,
            environment,
        })
    }
}

impl TryFrom<&Row> for DesiredEnvironment {
    type Error = tokio_postgres::Error;

    fn try_from(row: &Row) -> RowResult<Self> {
        Ok(DesiredEnvironment {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            resource_uid: row.try_get("resource_uid")?,
            resource_name: row.try_get("resource_name")?,
            generation: row.try_get("generation")?,
            api_url: row.try_get("api_url")?,
            allow_insecure_skip_tls_verify: row.try_get("allow_insecure_skip_tls_verify")?,
            namespaces: row.try_get("namespaces")?,
            cluster_resources: row.try_get("cluster_resources")?,
            row_state: row.try_get("row_state")?,
            home: row.try_get("home")?,
            credentials: sealed(row)?,
        })
    }
}

impl TryFrom<&Row> for DesiredRepositoryCredential {
    type Error = tokio_postgres::Error;

    fn try_from(row: &Row) -> RowResult<Self> {
        Ok(DesiredRepositoryCredential {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            resource_uid: row.try_get("resource_uid")?,
            resource_name: row.try_get("resource_name")?,
            generation: row.try_get("generation")?,
            repo_url: row.try_get("repo_url")?,
            row_state: row.try_get("row_state")?,
            credentials: sealed(row)?,
        })
    }
}

impl TryFrom<&Row> for DesiredSyncOperation {
    type Error = tokio_postgres::Error;

    fn try_from(row: &Row) -> RowResult<Self> {
        let application = match row.try_get::<_, Option<ApplicationId>>("application_id")? {
            Some(id) => Some(SyncTarget {
                id,
                resource_uid: row.try_get("application_resource_uid")?,
                row_state: row.try_get("application_row_state")?,
                sync_type: row.try_get("application_sync_type")?,
            }),
            None => None,
        };
        Ok(DesiredSyncOperation {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            resource_name: row.try_get("resource_name")?,
            deployment_name: row.try_get("deployment_name")?,
            revision: row.try_get("revision")?,
            correlation_id: row.try_get("correlation_id")?,
            state: row.try_get("state")?,
            terminate_requested: row.try_get("terminate_requested")?,
            row_state: row.try_get("row_state")?,
            application,
        })
    }
}

impl TryFrom<&Row> for ProjectEnvironment {
    type Error = tokio_postgres::Error;

    fn try_from(row: &Row) -> RowResult<Self> {
        Ok(ProjectEnvironment {
            id: row.try_get("id")?,
            api_url: row.try_get("api_url")?,
            namespaces: row.try_get("namespaces")?,
            cluster_resources: row.try_get("cluster_resources")?,
            application_namespaces: row.try_get("application_namespaces")?,
            home: row.try_get("home")?,
        })
    }
}

/// Reads the one row of `statement` for `id` as a `T`.
async fn load_one<T>(
    client: &impl Statements,
    statement: &str,
    id: &(dyn tokio_postgres::types::ToSql + Sync),
    action: &'static str,
) -> Result<Option<T>, DbError>
where
    T: for<'r> TryFrom<&'r Row, Error = tokio_postgres::Error>,
{
    let row = client.row_opt(statement, &[id]).await.map_err(DbError::query(action))?;
    row.as_ref().map(T::try_from).transpose().map_err(DbError::query(action))
}

/// The application `id` (None: no such row).
pub async fn application_load(
    client: &impl Statements,
    id: ApplicationId,
) -> Result<Option<DesiredApplication>, DbError> {
    load_one(client, APPLICATION, &id, "read an application").await
}

/// The managed environment `id` with its sealed credentials.
pub async fn managed_environment_load(
    client: &impl Statements,
    id: ManagedEnvironmentId,
) -> Result<Option<DesiredEnvironment>, DbError> {
    load_one(client, ENVIRONMENT, &id, "read a managed environment").await
}

/// The repository credential `id`.
pub async fn repository_credential_load(
    client: &impl Statements,
    id: RepositoryCredentialId,
) -> Result<Option<DesiredRepositoryCredential>, DbError> {
    load_one(client, REPOSITORY_CREDENTIAL, &id, "read a repository credential").await
}

/// The sync operation `id` with its application.
pub async fn sync_operation_load(
    client: &impl Statements,
    id: SyncOperationId,
) -> Result<Option<DesiredSyncOperation>, DbError> {
    load_one(client, SYNC_OPERATION, &id, "read a sync operation").await
}

/// The rows whose engine objects name the project of environment `environment`:
/// its applications (their `project`) and every repository credential of `tenant`
/// (a copy per project). Rows being deleted count; deleted ones do not.
pub async fn environment_project_users(
    client: &impl Statements,
    tenant: TenantId,
    environment: ManagedEnvironmentId,
) -> Result<(Vec<ApplicationId>, Vec<RepositoryCredentialId>), DbError> {
    let action = "read the rows using an environment's project";
    let applications = client
        .rows(ENVIRONMENT_APPLICATIONS, &[&environment, &tenant])
        .await
        .map_err(DbError::query(action))?
        .iter()
        .map(|row| row.try_get("id"))
        .collect::<RowResult<_>>()
        .map_err(DbError::query(action))?;
    let credentials = client
        .rows(TENANT_REPOSITORY_CREDENTIALS, &[&tenant])
        .await
        .map_err(DbError::query(action))?
        .iter()
        .map(|row| row.try_get("id"))
        .collect::<RowResult<_>>()
        .map_err(DbError::query(action))?;
    Ok((applications, credentials))
}

/// What the tenant's projects must permit (None: no such tenant).
pub async fn tenant_project_load(client: &impl Statements, tenant: TenantId) -> Result<Option<TenantProject>, DbError> {
    let Some(row) = client.row_opt(TENANT, &[&tenant]).await.map_err(DbError::query("read a tenant"))? else {
        return Ok(None);
    };
    let repos = client.rows(TENANT_REPOS, &[&tenant]).await.map_err(DbError::query("read a tenant's repositories"))?;
    let environments =
        client.rows(TENANT_ENVIRONMENTS, &[&tenant]).await.map_err(DbError::query("read a tenant's environments"))?;
    let read = |action: &'static str| DbError::query(action);
    Ok(Some(TenantProject {
        tenant_id: row.try_get("id").map_err(read("read a tenant"))?,
        namespace_name: row.try_get("namespace_name").map_err(read("read a tenant"))?,
        row_state: row.try_get("row_state").map_err(read("read a tenant"))?,
        repo_urls: repos
            .iter()
            .map(|r| r.try_get("repo_url"))
            .collect::<RowResult<_>>()
            .map_err(read("read a tenant's repositories"))?,
        environments: environments
            .iter()
            .map(ProjectEnvironment::try_from)
            .collect::<RowResult<_>>()
            .map_err(read("read a tenant's environments"))?,
    }))
}

// One statement per table: the table name is never spliced into SQL.
const MARK_DELETED: &[(ResourceType, &str)] = &[
    (
        ResourceType::ManagedEnvironment,
        "UPDATE managed_environment SET row_state = 'deleted', updated_at = now()
          WHERE id = $1 AND row_state = 'deleting'",
    ),
    (
        ResourceType::RepositoryCredential,
        "UPDATE repository_credential SET row_state = 'deleted', updated_at = now()
          WHERE id = $1 AND row_state = 'deleting'",
    ),
    (
        ResourceType::SyncOperation,
        "UPDATE sync_operation SET row_state = 'deleted', updated_at = now()
          WHERE id = $1 AND row_state = 'deleting'",
    ),
    (
        ResourceType::Tenant,
        "UPDATE tenant SET row_state = 'deleted', updated_at = now() WHERE id = $1 AND row_state = 'deleting'",
    ),
];

/// Confirms a deletion: a `deleting` row of `resource_type` becomes `deleted` (the
/// writer may then release its finalizer). Returns whether the row changed.
pub async fn resource_mark_deleted(client: &Client, resource_type: ResourceType, id: i64) -> Result<bool, DbError> {
    if resource_type == ResourceType::Application {
        return application_mark_deleted(client, ApplicationId(id)).await;
    }
    let statement = MARK_DELETED
        .iter()
        .find(|(t, _)| *t == resource_type)
        .map(|(_, s)| *s)
        .ok_or_else(|| DbError::NoDeletionConfirmation { resource_type: resource_type.to_string() })?;
    let changed = client.execute(statement, &[&id]).await.map_err(DbError::query("confirm a deletion"))?;
    Ok(changed > 0)
}

// The state row is touched in the same statement: its new change id puts the
// confirmation into the status feed, which wakes a writer waiting for the prune.
const APPLICATION_MARK_DELETED: &str = "
WITH deleted AS (
    UPDATE application SET row_state = 'deleted', deletion_message = NULL, updated_at = now()
     WHERE id = $1 AND row_state = 'deleting'
    RETURNING id, tenant_id)
INSERT INTO application_state (application_id, tenant_id)
SELECT id, tenant_id FROM deleted
    ON CONFLICT (application_id) DO UPDATE SET updated_at = now()";

/// Confirms the deletion of application `id` (and announces it in the status feed).
pub async fn application_mark_deleted(client: &Client, id: ApplicationId) -> Result<bool, DbError> {
    let changed =
        client.execute(APPLICATION_MARK_DELETED, &[&id]).await.map_err(DbError::query("confirm a deletion"))?;
    Ok(changed > 0)
}

const TENANT_ROWS_PENDING: &str = "
SELECT (SELECT count(*) FROM application WHERE tenant_id = $1 AND row_state <> 'deleted')
     + (SELECT count(*) FROM managed_environment WHERE tenant_id = $1 AND row_state <> 'deleted')
     + (SELECT count(*) FROM repository_credential WHERE tenant_id = $1 AND row_state <> 'deleted') AS pending";

/// How many of a tenant's Argo CD-backed rows are not confirmed deleted yet (its
/// project must outlive them).
pub async fn tenant_rows_pending(client: &Client, tenant: TenantId) -> Result<i64, DbError> {
    let row =
        client.query_one(TENANT_ROWS_PENDING, &[&tenant]).await.map_err(DbError::query("count a tenant's rows"))?;
    row.try_get("pending").map_err(DbError::query("count a tenant's rows"))
}

const DELETION_MESSAGE: &str = "
UPDATE application SET deletion_message = $2
 WHERE id = $1 AND row_state = 'deleting' AND deletion_message IS DISTINCT FROM $2";

/// Reports why a deletion is stuck (shown to the tenant). `updated_at` is left
/// alone: it measures how long the deletion has been going on.
pub async fn application_set_deletion_message(
    client: &Client,
    id: ApplicationId,
    message: &str,
) -> Result<(), DbError> {
    client.execute(DELETION_MESSAGE, &[&id, &message]).await.map_err(DbError::query("report a stuck deletion"))?;
    Ok(())
}

const SYNC_STARTED: &str = "
UPDATE sync_operation SET state = $2, started_at = COALESCE(started_at, now()), updated_at = now()
 WHERE id = $1 AND state IN ('pending', 'running')";

/// A sync was requested (`Running`) or its termination was (`Terminating`).
pub async fn sync_operation_set_state(
    client: &Client,
    id: SyncOperationId,
    state: SyncOperationState,
) -> Result<(), DbError> {
    client.execute(SYNC_STARTED, &[&id, &state]).await.map_err(DbError::query("record a sync's progress"))?;
    Ok(())
}

/// How a sync ended, as read from the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// `Succeeded`, `Failed` or `Terminated`.
    pub state: SyncOperationState,
    pub synced_revision: Option<String>,
    pub message: Option<String>,
    pub finished_at: Option<SystemTime>,
}

const SYNC_FINISHED: &str = "
UPDATE sync_operation
   SET state = $3, synced_revision = $4, message = $5, finished_at = COALESCE($6, now()),
       started_at = COALESCE(started_at, now()), updated_at = now()
 WHERE id = $1 AND correlation_id = $2 AND state IN ('pending', 'running', 'terminating')";

/// Records the end of the sync with `correlation_id` (the agent's reconciler and
/// its status watcher may both see it; the first write wins, the second changes
/// nothing). Returns whether the row changed.
pub async fn sync_operation_record_outcome(
    client: &Client,
    id: SyncOperationId,
    correlation_id: Uuid,
    outcome: &SyncOutcome,
) -> Result<bool, DbError> {
    let changed = client
        .execute(
            SYNC_FINISHED,
            &[&id, &correlation_id, &outcome.state, &outcome.synced_revision, &outcome.message, &outcome.finished_at],
        )
        .await
        .map_err(DbError::query("record a sync's result"))?;
    Ok(changed > 0)
}

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    APPLICATION,
    ENVIRONMENT,
    REPOSITORY_CREDENTIAL,
    SYNC_OPERATION,
    TENANT,
    TENANT_REPOS,
    TENANT_ENVIRONMENTS,
    ENVIRONMENT_APPLICATIONS,
    TENANT_REPOSITORY_CREDENTIALS,
    MARK_DELETED[0].1,
    MARK_DELETED[1].1,
    MARK_DELETED[2].1,
    MARK_DELETED[3].1,
    APPLICATION_MARK_DELETED,
    TENANT_ROWS_PENDING,
    DELETION_MESSAGE,
    SYNC_STARTED,
    SYNC_FINISHED,
];
