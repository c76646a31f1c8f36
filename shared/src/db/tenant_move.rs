//! Moving a tenant between engine instances: one protocol for an operator's move,
//! a drain and (later) rebalancing and failover. Never two instances holding the
//! tenant's Argo CD objects at once, never a gap left unrecorded:
//!
//! 1. [`tenant_move`]: one transaction places the tenant on the target, remembers
//!    the source (`moving_from`, `move_state = 'releasing'`), retargets its waiting
//!    operations to the target — where the database parks them (trigger
//!    `operation_park_*`) and the claim statement will not hand them out — and
//!    enqueues a tenant operation on the source.
//! 2. The source's agent *releases*: once none of its own claims on the tenant is
//!    left, it removes the tenant's Applications without pruning what they deployed,
//!    then its Secrets and AppProject, and calls [`tenant_release_confirm_in_txn`],
//!    which sets `adopting`, brings the parked operations forward and enqueues a
//!    tenant operation on the target.
//! 3. The target's agent *adopts*: it applies the tenant's project and calls
//!    [`tenant_adopt_done_in_txn`], which enqueues every row of the tenant there (the
//!    same Application names, so Argo CD adopts what is deployed) and ends the move.
//!
//! Each step is a row change, so a move survives restarts of every process.
//! `application_state` rows of the tenant are touched as the move starts and ends,
//! so the status feed tells the tenant (`Ready=False`, reason `Moving`).

use std::time::SystemTime;

use tokio_postgres::{Client, Transaction};

use crate::db::engine_instance::adoption_refusal_in_txn;
use crate::db::{DbError, column, in_txn_retrying};
use crate::model::{EngineInstanceId, ResourceType, TenantId};
use crate::queue::operation_enqueue_in_txn;

/// Where a tenant is and whether it is moving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPlacement {
    pub id: TenantId,
    pub namespace: String,
    pub instance: Option<String>,
    pub instance_id: Option<EngineInstanceId>,
    /// The source of a move in progress.
    pub moving_from: Option<String>,
    pub moving_from_id: Option<EngineInstanceId>,
    /// `releasing` or `adopting` during a move.
    pub move_state: Option<String>,
    pub move_reason: Option<String>,
    pub move_started_at: Option<SystemTime>,
    pub deployments: i64,
}

const PLACEMENTS: &str = "
SELECT t.id, t.namespace_name, i.name AS instance, t.engine_instance_id, f.name AS moving_from, t.moving_from AS moving_from_id,
       t.move_state, t.move_reason, t.move_started_at,
       (SELECT count(*) FROM application a WHERE a.tenant_id = t.id AND a.row_state = 'active') AS deployments
  FROM tenant t
  LEFT JOIN engine_instance i ON i.id = t.engine_instance_id
  LEFT JOIN engine_instance f ON f.id = t.moving_from
 WHERE t.row_state = 'active' AND ($1::text IS NULL OR t.namespace_name = $1)
   AND ($2::text IS NULL OR i.name = $2 OR f.name = $2)
 ORDER BY t.namespace_name";

const BY_ID: &str = "
SELECT t.id, t.namespace_name, i.name AS instance, t.engine_instance_id, f.name AS moving_from, t.moving_from AS moving_from_id,
       t.move_state, t.move_reason, t.move_started_at, 0::bigint AS deployments
  FROM tenant t
  LEFT JOIN engine_instance i ON i.id = t.engine_instance_id
  LEFT JOIN engine_instance f ON f.id = t.moving_from
 WHERE t.id = $1";

const LOCK: &str = "
SELECT t.id, t.engine_instance_id, t.move_state, t.row_state::text AS row_state
  FROM tenant t WHERE t.namespace_name = $1 AND t.row_state <> 'deleted' FOR UPDATE";

const TARGET: &str = "
SELECT e.id, e.cordoned, e.tenants, e.reserved, e.capacity,
       EXISTS (SELECT 1 FROM rollout_tenant rt WHERE rt.tenant_id = $2 AND rt.source_instance_id = e.id
                 AND rt.active AND rt.slot_held) AS slot_held,
       EXISTS (SELECT 1 FROM rollout r WHERE r.target_instance_id = e.id
                 AND r.state IN ('moving', 'baking', 'waiting', 'rolling_back')) AS rollout_target
  FROM engine_instance e WHERE e.name = $1";

// The active rollout acting on the tenant, if any (only its own moves may move it).
const IN_ROLLOUT: &str = "SELECT rollout_id FROM rollout_tenant WHERE tenant_id = $1 AND active";

const START: &str = "
UPDATE tenant SET moving_from = engine_instance_id, engine_instance_id = $2, move_state = 'releasing',
                  move_started_at = now(), move_reason = $3, updated_at = now()
 WHERE id = $1";

// The trigger parks them while the tenant is releasing (failover uses it too).
pub(crate) const RETARGET: &str = "
UPDATE operation SET engine_instance_id = $2
 WHERE tenant_id = $1 AND state = 'waiting' AND resource_type <> 'tenant'";

// The tenant's syncs still pending or running end with the move: their Application
// leaves the instance that runs them (removed without pruning, which ends its
// operation) and the tenant syncs again with a new SyncRun.
pub(crate) const FAIL_SYNCS: &str = "
UPDATE sync_operation
   SET state = 'failed', failure_reason = 'InstanceMoved', finished_at = now(), updated_at = now(),
       message = 'the namespace moved to another Argo CD instance while this sync was pending or running; '
                 || 'create a new GitOpsDeploymentSyncRun to sync again'
 WHERE tenant_id = $1 AND state IN ('pending', 'running', 'terminating') AND row_state = 'active'";

// At a move's end: what the source applied is not applied on the target (the
// update stamps the rows, so the status feed carries it).
const NOT_APPLIED_APPLICATIONS: &str =
    "UPDATE application_state SET applied_generation = NULL, updated_at = now() WHERE tenant_id = $1";
const NOT_APPLIED_RESOURCES: &str =
    "UPDATE resource_state SET applied_generation = NULL, updated_at = now() WHERE tenant_id = $1";

// Every change stamps the row anew, so the status feed carries it to the tenant.
const TOUCH_STATE: &str = "UPDATE application_state SET updated_at = now() WHERE tenant_id = $1";

const CONFIRM: &str = "
UPDATE tenant SET move_state = 'adopting', updated_at = now()
 WHERE id = $1 AND moving_from = $2 AND move_state = 'releasing'
RETURNING engine_instance_id";

const UNPARK: &str = "
UPDATE operation SET run_after = now()
 WHERE tenant_id = $1 AND state = 'waiting' AND run_after = 'infinity'";

const ROWS: &str = "
SELECT 'application' AS kind, id FROM application WHERE tenant_id = $1 AND row_state <> 'deleted'
UNION ALL
SELECT 'managed_environment', id FROM managed_environment WHERE tenant_id = $1 AND row_state <> 'deleted'
UNION ALL
SELECT 'repository_credential', id FROM repository_credential WHERE tenant_id = $1 AND row_state <> 'deleted'
ORDER BY 1, 2";

const DONE: &str = "
UPDATE tenant SET moving_from = NULL, move_state = NULL, move_started_at = NULL, move_reason = NULL,
                  updated_at = now()
 WHERE id = $1 AND engine_instance_id = $2 AND move_state = 'adopting'
RETURNING id";

// The source's own claims on the tenant: the release waits for them.
const CLAIMED_HERE: &str = "
SELECT count(*) AS claimed FROM operation
 WHERE tenant_id = $1 AND engine_instance_id = $2 AND state = 'claimed' AND resource_type <> 'tenant'";

// Operations that went back to waiting on the source after the move (a retry):
// they go to the target, parked.
const RETARGET_FROM: &str = "
UPDATE operation SET engine_instance_id = $3
 WHERE tenant_id = $1 AND engine_instance_id = $2 AND state = 'waiting' AND resource_type <> 'tenant'";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    PLACEMENTS,
    BY_ID,
    LOCK,
    TARGET,
    IN_ROLLOUT,
    START,
    RETARGET,
    TOUCH_STATE,
    CONFIRM,
    UNPARK,
    ROWS,
    DONE,
    CLAIMED_HERE,
    RETARGET_FROM,
    FAIL_SYNCS,
    NOT_APPLIED_APPLICATIONS,
    NOT_APPLIED_RESOURCES,
];

impl TryFrom<&tokio_postgres::Row> for TenantPlacement {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        Ok(TenantPlacement {
            id: row.try_get("id")?,
            namespace: row.try_get("namespace_name")?,
            instance: row.try_get("instance")?,
            instance_id: row.try_get("engine_instance_id")?,
            moving_from: row.try_get("moving_from")?,
            moving_from_id: row.try_get("moving_from_id")?,
            move_state: row.try_get("move_state")?,
            move_reason: row.try_get("move_reason")?,
            move_started_at: row.try_get("move_started_at")?,
            deployments: row.try_get("deployments")?,
        })
    }
}

/// Live tenants, optionally only `namespace`, or those on (or moving from) `instance`.
pub async fn tenant_placements(
    client: &Client,
    namespace: Option<&str>,
    instance: Option<&str>,
) -> Result<Vec<TenantPlacement>, DbError> {
    let rows =
        client.query(PLACEMENTS, &[&namespace, &instance]).await.map_err(DbError::query("list tenant placements"))?;
    rows.iter().map(|row| TenantPlacement::try_from(row).map_err(DbError::query("list tenant placements"))).collect()
}

/// Tenant `id`'s placement and move (deployments not counted).
pub async fn tenant_placement_by_id(client: &Client, id: TenantId) -> Result<Option<TenantPlacement>, DbError> {
    let row = client.query_opt(BY_ID, &[&id]).await.map_err(DbError::query("read a tenant's placement"))?;
    row.as_ref().map(TenantPlacement::try_from).transpose().map_err(DbError::query("read a tenant's placement"))
}

/// Starts moving the tenant of `namespace` to instance `to` (step 1 of the module's
/// protocol). Refused, with the reason, when the tenant is unknown, unplaced or
/// already moving, or the target is unknown, the same, cordoned or full.
pub async fn tenant_move(client: &mut Client, namespace: &str, to: &str, reason: &str) -> Result<(), DbError> {
    let (namespace, to, reason) = (namespace.to_owned(), to.to_owned(), reason.to_owned());
    in_txn_retrying(client, move |txn| {
        let (namespace, to, reason) = (namespace.clone(), to.clone(), reason.clone());
        Box::pin(async move { tenant_move_in_txn(txn, &namespace, &to, &reason).await })
    })
    .await
}

/// [`tenant_move`] inside the caller's transaction.
pub async fn tenant_move_in_txn(txn: &Transaction<'_>, namespace: &str, to: &str, reason: &str) -> Result<(), DbError> {
    let invalid = |message: String| Err(DbError::InvalidMove { message });
    let action = "start a tenant move";
    let Some(tenant) = txn.query_opt(LOCK, &[&namespace]).await.map_err(DbError::query(action))? else {
        return invalid(format!("no tenant in namespace {namespace:?}"));
    };
    let id: TenantId = column(&tenant, "id", action)?;
    let from: Option<EngineInstanceId> = column(&tenant, "engine_instance_id", action)?;
    let state: Option<String> = column(&tenant, "move_state", action)?;
    let row_state: String = column(&tenant, "row_state", action)?;
    if row_state != "active" {
        return invalid(format!("the tenant of {namespace:?} is being deleted"));
    }
    if let Some(row) = txn.query_opt(IN_ROLLOUT, &[&id]).await.map_err(DbError::query(action))?
        && reason != crate::db::rollout::ROLLBACK_REASON
    {
        let rollout: i64 = column(&row, "rollout_id", action)?;
        return invalid(format!("the tenant of {namespace:?} is in rollout {rollout}; abort it first"));
    }
    if let Some(state) = state {
        return invalid(format!("the tenant of {namespace:?} is already moving ({state})"));
    }
    let Some(from) = from else {
        return invalid(format!("the tenant of {namespace:?} is not placed on any instance yet"));
    };
    let Some(target) = txn.query_opt(TARGET, &[&to, &id]).await.map_err(DbError::query(action))? else {
        return invalid(format!("no engine instance {to:?}"));
    };
    // A rollback returns a tenant to the instance it came from, whether that was
    // cordoned or became another rollout's target since (a rollback refused for those
    // would never end). Its slot there was held for it (migration V18), so a source
    // that filled up meanwhile still takes it back.
    let returning = reason == crate::db::rollout::ROLLBACK_REASON;
    if column::<bool>(&target, "rollout_target", action)? && reason != crate::db::rollout::MOVE_REASON && !returning {
        return invalid(format!("engine instance {to:?} is the target of a rollout and takes no other tenants"));
    }
    let target_id: EngineInstanceId = column(&target, "id", action)?;
    if target_id == from {
        return invalid(format!("the tenant of {namespace:?} is on {to:?} already"));
    }
    if column::<bool>(&target, "cordoned", action)? && !returning {
        return invalid(format!("engine instance {to:?} is cordoned"));
    }
    let (tenants, reserved, capacity): (i32, i32, i32) = (
        column(&target, "tenants", action)?,
        column(&target, "reserved", action)?,
        column(&target, "capacity", action)?,
    );
    if !column::<bool>(&target, "slot_held", action)? && tenants + reserved >= capacity {
        let held = if reserved > 0 {
            format!(", {reserved} more held for tenants a rollout moved away")
        } else {
            String::new()
        };
        return invalid(format!("engine instance {to:?} is full ({tenants} of {capacity} tenants{held})"));
    }
    if let Some(why) = adoption_refusal_in_txn(txn, from, target_id).await? {
        return invalid(why);
    }
    txn.execute(START, &[&id, &target_id, &reason]).await.map_err(DbError::query(action))?;
    txn.execute(RETARGET, &[&id, &target_id]).await.map_err(DbError::query(action))?;
    txn.execute(FAIL_SYNCS, &[&id]).await.map_err(DbError::query(action))?;
    operation_enqueue_in_txn(txn, from, id, ResourceType::Tenant, id.0).await?;
    txn.execute(TOUCH_STATE, &[&id]).await.map_err(DbError::query(action))?;
    Ok(())
}

/// How many of the tenant's ordinary operations `instance` (a move's source) still holds.
pub async fn tenant_claims_on(client: &Client, tenant: TenantId, instance: EngineInstanceId) -> Result<i64, DbError> {
    let row = client
        .query_one(CLAIMED_HERE, &[&tenant, &instance])
        .await
        .map_err(DbError::query("count a tenant's claims"))?;
    column(&row, "claimed", "count a tenant's claims")
}

/// Sends the tenant's operations still waiting on `source` to `target` (parked).
pub async fn tenant_retarget_from(
    client: &Client,
    tenant: TenantId,
    source: EngineInstanceId,
    target: EngineInstanceId,
) -> Result<u64, DbError> {
    client
        .execute(RETARGET_FROM, &[&tenant, &source, &target])
        .await
        .map_err(DbError::query("retarget a moving tenant's operations"))
}

/// Step 2's end: `source` has let go of the tenant. Sets `adopting`, brings the
/// parked operations forward and hands the target a tenant operation. False when
/// the tenant is not being released from `source` (nothing changed).
pub async fn tenant_release_confirm_in_txn(
    txn: &Transaction<'_>,
    tenant: TenantId,
    source: EngineInstanceId,
) -> Result<bool, DbError> {
    let action = "confirm a tenant's release";
    let Some(row) = txn.query_opt(CONFIRM, &[&tenant, &source]).await.map_err(DbError::query(action))? else {
        return Ok(false);
    };
    let target: EngineInstanceId = column(&row, "engine_instance_id", action)?;
    txn.execute(UNPARK, &[&tenant]).await.map_err(DbError::query(action))?;
    operation_enqueue_in_txn(txn, target, tenant, ResourceType::Tenant, tenant.0).await?;
    Ok(true)
}

/// Step 3's end: `target` applied the tenant's project. Enqueues every row of the
/// tenant there and ends the move. False when the tenant is not being adopted by
/// `target` (nothing changed).
pub async fn tenant_adopt_done_in_txn(
    txn: &Transaction<'_>,
    tenant: TenantId,
    target: EngineInstanceId,
) -> Result<bool, DbError> {
    let action = "end a tenant's move";
    if txn.query_opt(DONE, &[&tenant, &target]).await.map_err(DbError::query(action))?.is_none() {
        return Ok(false);
    }
    for row in txn.query(ROWS, &[&tenant]).await.map_err(DbError::query(action))? {
        let kind: &str = column(&row, "kind", action)?;
        let id: i64 = column(&row, "id", action)?;
        let resource_type = match kind {
            "application" => ResourceType::Application,
            "managed_environment" => ResourceType::ManagedEnvironment,
            _ => ResourceType::RepositoryCredential,
        };
        operation_enqueue_in_txn(txn, target, tenant, resource_type, id).await?;
    }
    // Nothing is applied on the target yet: the tenant reads Reconciling until its
    // agent applied each row there (the status seen on the source is kept meanwhile).
    txn.execute(NOT_APPLIED_APPLICATIONS, &[&tenant]).await.map_err(DbError::query(action))?;
    txn.execute(NOT_APPLIED_RESOURCES, &[&tenant]).await.map_err(DbError::query(action))?;
    Ok(true)
}
