//! Engine instances (Argo CD instances): registered by operators, heartbeated by
//! their agents.

use std::time::SystemTime;

use tokio_postgres::Client;

use crate::db::DbError;
use crate::model::EngineInstanceId;

/// One registered engine instance.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineInstance {
    pub id: EngineInstanceId,
    pub name: String,
    pub argocd_namespace: String,
    pub capacity: i32,
    pub heartbeat_at: Option<SystemTime>,
    /// Tenants placed on it.
    pub tenants: i64,
    /// Slots held for tenants a rollout moved away (they may come back); taken, as
    /// far as placement is concerned.
    pub reserved: i64,
    /// Closed to new tenants by an operator.
    pub cordoned: bool,
    /// When an agent last saw Argo CD itself make progress.
    pub progress_at: Option<SystemTime>,
    /// `healthy`, `degraded` (the API answers, Argo CD is stuck) or `lost` (no agent
    /// reaches the API), by `engine_instance_health()`.
    pub health: String,
    /// Bumped when the instance is fenced; agents write status only at the current one.
    pub epoch: i64,
    /// Fenced (lost past the grace) and not yet cleaned up by a returning agent.
    pub fenced: bool,
    /// The Argo CD version its agents last read from it (None: not reported).
    pub argocd_version: Option<String>,
    /// The cluster its Argo CD runs on: agents started with `--host-cluster` of
    /// that name serve it (None: only agents naming it).
    pub host_cluster: Option<String>,
    /// `gitopsctl` or `scale-up` when the service made it (None: registered with
    /// `instance add`).
    pub provisioned_by: Option<String>,
}

/// Who made an instance the service provisioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProvisionedBy {
    /// An operator's `gitopsctl instance provision`.
    Gitopsctl,
    /// The writers' automatic scale-up.
    ScaleUp,
}

impl ProvisionedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ProvisionedBy::Gitopsctl => "gitopsctl",
            ProvisionedBy::ScaleUp => "scale-up",
        }
    }
}

/// How an instance is registered beyond its name, namespace and capacity.
#[derive(Debug, Clone, Copy, Default)]
pub struct Registration<'a> {
    pub host_cluster: Option<&'a str>,
    pub provisioned_by: Option<ProvisionedBy>,
}

const ADD: &str = "
INSERT INTO engine_instance (name, argocd_namespace, capacity, host_cluster, provisioned_by)
VALUES ($1, $2, $3, $4, $5)
RETURNING id";

const LIST: &str = "
SELECT i.id, i.name, i.argocd_namespace, i.capacity, i.heartbeat_at, i.tenants::bigint AS tenants, i.reserved::bigint AS reserved, i.cordoned,
       i.progress_at, engine_instance_health(i.heartbeat_at, i.progress_at) AS health, i.epoch,
       i.fenced_at IS NOT NULL AS fenced, i.argocd_version, i.host_cluster, i.provisioned_by
  FROM engine_instance i
 ORDER BY i.name";

const BY_NAME: &str = "
SELECT i.id, i.name, i.argocd_namespace, i.capacity, i.heartbeat_at, i.tenants::bigint AS tenants, i.reserved::bigint AS reserved, i.cordoned,
       i.progress_at, engine_instance_health(i.heartbeat_at, i.progress_at) AS health, i.epoch,
       i.fenced_at IS NOT NULL AS fenced, i.argocd_version, i.host_cluster, i.provisioned_by
  FROM engine_instance i
 WHERE i.name = $1";

const HOST_CLUSTER: &str = "UPDATE engine_instance SET host_cluster = $2 WHERE name = $1 RETURNING id";

const CORDON: &str = "UPDATE engine_instance SET cordoned = $2 WHERE name = $1 RETURNING id";

const REMOVE: &str = "
DELETE FROM engine_instance i
 WHERE i.name = $1
   AND NOT EXISTS (SELECT 1 FROM tenant t WHERE t.engine_instance_id = i.id)
   AND NOT EXISTS (SELECT 1 FROM operation o WHERE o.engine_instance_id = i.id)
   AND NOT EXISTS (SELECT 1 FROM operation_history h WHERE h.engine_instance_id = i.id)
RETURNING id";

// Decommissioning: the instance's operation history goes with it (nothing else
// refers to it); refused while a tenant or an operation in flight is left.
const PURGE_HISTORY: &str = "
WITH allowed AS (
    SELECT NOT EXISTS (SELECT 1 FROM tenant t WHERE t.engine_instance_id = $1 OR t.moving_from = $1)
       AND NOT EXISTS (SELECT 1 FROM operation w WHERE w.engine_instance_id = $1 AND w.state IN ('waiting', 'claimed'))
           AS yes
), dead AS (
    DELETE FROM operation o USING allowed
     WHERE allowed.yes AND o.engine_instance_id = $1 AND o.state = 'failed'
    RETURNING 1
), finished AS (
    DELETE FROM operation_history h USING allowed
     WHERE allowed.yes AND h.engine_instance_id = $1
    RETURNING 1
)
SELECT (SELECT count(*) FROM dead) + (SELECT count(*) FROM finished) AS purged";

const REMOVE_BY_ID: &str = "
DELETE FROM engine_instance i
 WHERE i.id = $1
   AND NOT EXISTS (SELECT 1 FROM tenant t WHERE t.engine_instance_id = i.id OR t.moving_from = i.id)
   AND NOT EXISTS (SELECT 1 FROM operation o WHERE o.engine_instance_id = i.id)
   AND NOT EXISTS (SELECT 1 FROM operation_history h WHERE h.engine_instance_id = i.id)
RETURNING name";

const NAMESPACES: &str = "SELECT DISTINCT argocd_namespace FROM engine_instance";

const HEARTBEAT: &str = "UPDATE engine_instance SET heartbeat_at = now() WHERE id = $1";

const PROGRESS: &str = "UPDATE engine_instance SET progress_at = now() WHERE id = $1";

const VERSION: &str = "
UPDATE engine_instance SET argocd_version = $2, version_reported_at = now() WHERE id = $1";

const ADOPTION_SETTINGS: &str = "
UPDATE engine_instance SET tracking_method = $2, instance_label_key = $3, installation_id = $4
 WHERE id = $1
   AND (tracking_method, instance_label_key, installation_id) IS DISTINCT FROM ($2, $3, $4)";

const ADOPTION_PAIR: &str = "
SELECT s.name AS source, t.name AS target,
       s.tracking_method AS source_tracking, t.tracking_method AS target_tracking,
       s.instance_label_key AS source_label, t.instance_label_key AS target_label,
       s.installation_id AS source_installation, t.installation_id AS target_installation
  FROM engine_instance s, engine_instance t
 WHERE s.id = $1 AND t.id = $2";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    ADD,
    LIST,
    BY_NAME,
    CORDON,
    HOST_CLUSTER,
    REMOVE,
    PURGE_HISTORY,
    REMOVE_BY_ID,
    NAMESPACES,
    HEARTBEAT,
    PROGRESS,
    VERSION,
    ADOPTION_SETTINGS,
    ADOPTION_PAIR,
];

/// Whether `s` is a DNS label (a-z, 0-9, `-`, at most 63, no `-` at either end).
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Registers an instance. Names and namespaces are DNS labels.
pub async fn engine_instance_add(
    client: &Client,
    name: &str,
    argocd_namespace: &str,
    capacity: i32,
) -> Result<EngineInstanceId, DbError> {
    engine_instance_register(client, name, argocd_namespace, capacity, Registration::default()).await
}

/// Registers an instance with its host cluster and maker. Names, namespaces and
/// host clusters are DNS labels.
pub async fn engine_instance_register(
    client: &Client,
    name: &str,
    argocd_namespace: &str,
    capacity: i32,
    registration: Registration<'_>,
) -> Result<EngineInstanceId, DbError> {
    if let Some(host) = registration.host_cluster {
        check_host_cluster(host)?;
    }
    if !is_dns_label(name) {
        return Err(DbError::InvalidInstance {
            message: format!("instance name {name:?} is not a DNS label (a-z, 0-9, '-', at most 63)"),
        });
    }
    if !is_dns_label(argocd_namespace) {
        return Err(DbError::InvalidInstance { message: format!("namespace {argocd_namespace:?} is not a DNS label") });
    }
    if capacity <= 0 {
        return Err(DbError::InvalidInstance { message: "capacity must be positive".to_owned() });
    }
    let provisioned_by = registration.provisioned_by.map(ProvisionedBy::as_str);
    match client
        .query_one(ADD, &[&name, &argocd_namespace, &capacity, &registration.host_cluster, &provisioned_by])
        .await
    {
        Ok(row) => crate::db::column(&row, "id", "register an engine instance"),
        Err(source) => {
            let error = DbError::Query { action: "register an engine instance", source };
            if error.is_unique_violation() {
                Err(DbError::InstanceExists { name: name.to_owned() })
            } else {
                Err(error)
            }
        }
    }
}

/// Refuses a host cluster name that is not a DNS label.
pub fn check_host_cluster(host: &str) -> Result<(), DbError> {
    if is_dns_label(host) {
        Ok(())
    } else {
        Err(DbError::InvalidInstance {
            message: format!("host cluster {host:?} is not a DNS label (a-z, 0-9, '-', at most 63)"),
        })
    }
}

/// Sets (or clears) the host cluster of instance `name`: agents started with
/// `--host-cluster` of that name pick it up, those of the old one drop it.
pub async fn engine_instance_set_host_cluster(client: &Client, name: &str, host: Option<&str>) -> Result<(), DbError> {
    if let Some(host) = host {
        check_host_cluster(host)?;
    }
    let row = client
        .query_opt(HOST_CLUSTER, &[&name, &host])
        .await
        .map_err(DbError::query("set an engine instance's host cluster"))?;
    row.map(|_| ()).ok_or_else(|| DbError::NotFound { what: format!("engine instance {name:?}") })
}

/// The epoch an agent writes tenants' status at: its instance's, read at start and
/// again whenever the instance is found not fenced. Fencing bumps the epoch, so every
/// status statement that carries an older one (from an agent that has not yet seen
/// the fence, or cleaned up after it) writes nothing; the check is in the statement.
#[derive(Debug, Clone)]
pub struct InstanceEpoch {
    pub instance: EngineInstanceId,
    epoch: std::sync::Arc<std::sync::atomic::AtomicI64>,
}

impl InstanceEpoch {
    pub fn new(instance: EngineInstanceId, epoch: i64) -> Self {
        InstanceEpoch { instance, epoch: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(epoch)) }
    }

    /// The epoch as last read.
    pub fn current(&self) -> i64 {
        self.epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes the instance's epoch read now (the instance is not fenced).
    pub fn set(&self, epoch: i64) {
        self.epoch.store(epoch, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The SQL condition of a status write: the tenant `t` is placed on instance
/// `$instance` and that instance is at epoch `$epoch` and not fenced.
#[macro_export]
macro_rules! placed_at_epoch {
    ($instance:literal, $epoch:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM engine_instance e WHERE e.id = t.engine_instance_id AND e.id = ",
            $instance,
            " AND e.epoch = ",
            $epoch,
            " AND e.fenced_at IS NULL)"
        )
    };
}

impl TryFrom<&tokio_postgres::Row> for EngineInstance {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(EngineInstance {
            id: row.try_get("id")?,
            name: row.try_get("name")?,
            argocd_namespace: row.try_get("argocd_namespace")?,
            capacity: row.try_get("capacity")?,
            heartbeat_at: row.try_get("heartbeat_at")?,
            tenants: row.try_get("tenants")?,
            reserved: row.try_get("reserved")?,
            cordoned: row.try_get("cordoned")?,
            progress_at: row.try_get("progress_at")?,
            health: row.try_get("health")?,
            epoch: row.try_get("epoch")?,
            fenced: row.try_get("fenced")?,
            argocd_version: row.try_get("argocd_version")?,
            host_cluster: row.try_get("host_cluster")?,
            provisioned_by: row.try_get("provisioned_by")?,
        })
    }
}

fn from_row(row: &tokio_postgres::Row) -> Result<EngineInstance, DbError> {
    EngineInstance::try_from(row).map_err(DbError::query("read an engine instance"))
}

/// Every instance, by name.
pub async fn engine_instance_list(client: &Client) -> Result<Vec<EngineInstance>, DbError> {
    let rows = client.query(LIST, &[]).await.map_err(DbError::query("list engine instances"))?;
    rows.iter().map(from_row).collect()
}

/// The namespace of every registered instance: never a tenant namespace, and never
/// a destination on the home cluster.
pub async fn engine_instance_namespaces(client: &Client) -> Result<std::collections::BTreeSet<String>, DbError> {
    let rows = client.query(NAMESPACES, &[]).await.map_err(DbError::query("list engine instance namespaces"))?;
    rows.iter().map(|row| crate::db::column(row, "argocd_namespace", "list engine instance namespaces")).collect()
}

/// One instance by name.
pub async fn engine_instance_by_name(client: &Client, name: &str) -> Result<EngineInstance, DbError> {
    let row = client.query_opt(BY_NAME, &[&name]).await.map_err(DbError::query("look up an engine instance"))?;
    row.as_ref().map(from_row).ok_or_else(|| DbError::NotFound { what: format!("engine instance {name:?}") })?
}

/// Closes (`cordoned`) or opens an instance to new tenants; its tenants stay.
pub async fn engine_instance_cordon(client: &Client, name: &str, cordoned: bool) -> Result<(), DbError> {
    let row =
        client.query_opt(CORDON, &[&name, &cordoned]).await.map_err(DbError::query("cordon an engine instance"))?;
    row.map(|_| ()).ok_or_else(|| DbError::NotFound { what: format!("engine instance {name:?}") })
}

/// Removes an instance that has no tenants and no operations left.
pub async fn engine_instance_remove(client: &Client, name: &str) -> Result<(), DbError> {
    let removed = client.query_opt(REMOVE, &[&name]).await.map_err(DbError::query("remove an engine instance"))?;
    if removed.is_some() {
        return Ok(());
    }
    let instance = engine_instance_by_name(client, name).await?;
    Err(DbError::InstanceInUse { name: name.to_owned(), tenants: instance.tenants })
}

/// Removes instance `id` for good with its operation history (completed,
/// superseded and failed operations); returns how many operations went. Refused
/// (`InstanceInUse`, nothing changed) while a tenant is on it or moving from it, or
/// an operation of it waits or is claimed.
pub async fn engine_instance_decommission(client: &mut Client, id: EngineInstanceId) -> Result<u64, DbError> {
    crate::db::in_txn_retrying(client, move |txn| {
        Box::pin(async move {
            let action = "decommission an engine instance";
            let row = txn.query_one(PURGE_HISTORY, &[&id]).await.map_err(DbError::query(action))?;
            let purged: i64 = crate::db::column(&row, "purged", action)?;
            let purged = u64::try_from(purged).unwrap_or(0);
            match txn.query_opt(REMOVE_BY_ID, &[&id]).await.map_err(DbError::query(action))? {
                Some(_) => Ok(purged),
                None => Err(DbError::InstanceInUse { name: format!("#{}", id.0), tenants: 0 }),
            }
        })
    })
    .await
}

/// Records that an agent saw the instance's Argo CD make progress.
pub async fn engine_instance_progress(client: &Client, id: EngineInstanceId) -> Result<(), DbError> {
    client.execute(PROGRESS, &[&id.0]).await.map_err(DbError::query("record an engine instance's progress"))?;
    Ok(())
}

/// Records that an agent of this instance is alive.
pub async fn engine_instance_heartbeat(client: &Client, id: EngineInstanceId) -> Result<(), DbError> {
    client.execute(HEARTBEAT, &[&id.0]).await.map_err(DbError::query("heartbeat an engine instance"))?;
    Ok(())
}

/// Records the Argo CD version an agent read from instance `id` (None: unreadable).
pub async fn engine_instance_version(
    client: &Client,
    id: EngineInstanceId,
    version: Option<&str>,
) -> Result<(), DbError> {
    client.execute(VERSION, &[&id, &version]).await.map_err(DbError::query("record an instance's version"))?;
    Ok(())
}

/// Records how `id`'s engine tracks what it deploys (only when it changed).
pub async fn engine_instance_adoption_settings(
    client: &Client,
    id: EngineInstanceId,
    tracking_method: &str,
    instance_label_key: &str,
    installation_id: &str,
) -> Result<bool, DbError> {
    let changed = client
        .execute(ADOPTION_SETTINGS, &[&id, &tracking_method, &instance_label_key, &installation_id])
        .await
        .map_err(DbError::query("record an instance's adoption settings"))?;
    Ok(changed > 0)
}

/// Why instance `to` could not adopt what instance `from` deployed (their reported
/// tracking settings differ), or None; settings not reported count as matching.
pub async fn adoption_refusal_in_txn(
    txn: &tokio_postgres::Transaction<'_>,
    from: EngineInstanceId,
    to: EngineInstanceId,
) -> Result<Option<String>, DbError> {
    let action = "compare instances' adoption settings";
    let Some(row) = txn.query_opt(ADOPTION_PAIR, &[&from, &to]).await.map_err(DbError::query(action))? else {
        return Ok(None);
    };
    let get = |column: &str| -> Result<Option<String>, DbError> { crate::db::column(&row, column, action) };
    let (source, target): (String, String) =
        (crate::db::column(&row, "source", action)?, crate::db::column(&row, "target", action)?);
    for (what, ours, theirs) in [
        ("track resources by", get("source_tracking")?, get("target_tracking")?),
        ("label instances with", get("source_label")?, get("target_label")?),
        ("have installationID", get("source_installation")?, get("target_installation")?),
    ] {
        if let (Some(ours), Some(theirs)) = (ours, theirs)
            && ours != theirs
        {
            return Ok(Some(format!(
                "engine instances {source:?} and {target:?} {what} {ours:?} and {theirs:?}: Argo CD on {target:?} \
                 would not adopt what {source:?} deployed"
            )));
        }
    }
    Ok(None)
}
