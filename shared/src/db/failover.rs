//! Failover: the tenants of an instance lost for longer than a grace period are
//! placed on healthy instances, which adopt them directly, and their home
//! identities are marked for replacement (the lost Argo CD may hold their tokens). A lost instance cannot
//! release what it holds, so it is *fenced* first (its epoch bumped, `fenced_at`
//! set, cordoned): when its agents reach the database again they remove, without
//! pruning, every object of tenants no longer placed there before they rejoin.
//!
//! Each step runs in one transaction under an advisory lock, so one writer at a time
//! acts, whichever holds it; steps are idempotent and bounded (`batch` tenants), so
//! tenants move at a bounded rate.

use std::time::Duration;

use tokio_postgres::Client;

use crate::db::engine_instance::adoption_refusal_in_txn;
use crate::db::placement::placement_choose_in_txn;
use crate::db::tenant_move::{FAIL_SYNCS, RETARGET};
use crate::db::{DbError, column, in_txn_retrying};
use crate::model::{EngineInstanceId, ResourceType, TenantId};
use crate::queue::operation_enqueue_in_txn;

/// The advisory lock key of failover steps.
const FAILOVER_LOCK: i64 = 0x6769_746f_7073_0001;

const LOCK: &str = "SELECT pg_try_advisory_xact_lock($1) AS locked";

// Lost (no heartbeat within the lost window) for longer than the grace ($1 ms), with
// tenants (or a move out of it) to re-place.
const LOST: &str = "
SELECT e.id, e.name, e.fenced_at IS NOT NULL AS fenced
  FROM engine_instance e
 WHERE engine_instance_health(e.heartbeat_at, e.progress_at) = 'lost'
   AND COALESCE(e.heartbeat_at, e.created_at)
       < now() - COALESCE(NULLIF(current_setting('gitops.instance_lost_after', true), ''), '60 seconds')::interval
               - $1::bigint * interval '1 millisecond'
   AND EXISTS (SELECT 1 FROM tenant t
                WHERE t.row_state <> 'deleted'
                  AND (t.engine_instance_id = e.id OR (t.moving_from = e.id AND t.move_state = 'releasing')))
 ORDER BY e.id";

const FENCE: &str = "
UPDATE engine_instance SET epoch = epoch + 1, fenced_at = now(), cordoned = true
 WHERE id = $1 AND fenced_at IS NULL
RETURNING epoch";

// Moves out of the lost instance that wait for its release: the target adopts now.
const SKIP_RELEASE: &str = "
UPDATE tenant SET move_state = 'adopting', updated_at = now()
 WHERE moving_from = $1 AND move_state = 'releasing'
RETURNING id, engine_instance_id";

const UNPARK: &str = "
UPDATE operation SET run_after = now()
 WHERE tenant_id = ANY($1) AND state = 'waiting' AND run_after = 'infinity'";

const TENANTS: &str = "
SELECT id FROM tenant
 WHERE engine_instance_id = $1 AND move_state IS NULL AND row_state <> 'deleted'
 ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED";

const REPLACE: &str = "
UPDATE tenant SET moving_from = engine_instance_id, engine_instance_id = $2, move_state = 'adopting',
                  move_started_at = now(), move_reason = 'failover', updated_at = now()
 WHERE id = $1";

const TOUCH_STATE: &str = "UPDATE application_state SET updated_at = now() WHERE tenant_id = ANY($1)";

// The lost instance's Argo CD may still hold the tenant's home token: a writer
// replaces the home identity (see migration V14).
const REVOKE_HOME: &str = "
UPDATE managed_environment SET home_revoke_requested_at = now()
 WHERE tenant_id = $1 AND home AND row_state = 'active'";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[LOCK, LOST, FENCE, SKIP_RELEASE, UNPARK, TENANTS, REPLACE, TOUCH_STATE, REVOKE_HOME];

/// What one failover step did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FailoverStep {
    /// Instances fenced in this step (names).
    pub fenced: Vec<String>,
    /// Tenants placed elsewhere (or whose pending release was skipped).
    pub moved: Vec<TenantId>,
    /// Tenants left on a lost instance because no healthy instance had room, or the
    /// one chosen could not adopt them.
    pub unplaced: usize,
    /// Why a chosen instance could not adopt (its tracking settings differ).
    pub refused: Vec<String>,
    /// Another writer held the step's lock: nothing was done.
    pub skipped: bool,
}

/// One step: fences every instance lost for longer than `grace` and re-places up to
/// `batch` of their tenants on healthy instances (`healthy_within` as placement's).
pub async fn failover_step(
    client: &mut Client,
    grace: Duration,
    batch: i64,
    healthy_within: Duration,
) -> Result<FailoverStep, DbError> {
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    in_txn_retrying(client, move |txn| {
        Box::pin(async move {
            let action = "fail over a lost instance";
            let mut step = FailoverStep::default();
            let locked: bool = column(
                &txn.query_one(LOCK, &[&FAILOVER_LOCK]).await.map_err(DbError::query(action))?,
                "locked",
                action,
            )?;
            if !locked {
                step.skipped = true;
                return Ok(step);
            }
            let lost = txn.query(LOST, &[&grace_ms]).await.map_err(DbError::query(action))?;
            let mut budget = batch;
            for row in &lost {
                let id: EngineInstanceId = column(row, "id", action)?;
                let name: String = column(row, "name", action)?;
                if txn.query_opt(FENCE, &[&id]).await.map_err(DbError::query(action))?.is_some() {
                    step.fenced.push(name);
                }
                // Moves that wait for the lost instance's release: adopt now.
                let mut touched: Vec<TenantId> = Vec::new();
                for adopting in txn.query(SKIP_RELEASE, &[&id]).await.map_err(DbError::query(action))? {
                    let tenant: TenantId = column(&adopting, "id", action)?;
                    let target: EngineInstanceId = column(&adopting, "engine_instance_id", action)?;
                    operation_enqueue_in_txn(txn, target, tenant, ResourceType::Tenant, tenant.0).await?;
                    txn.execute(REVOKE_HOME, &[&tenant]).await.map_err(DbError::query(action))?;
                    touched.push(tenant);
                }
                txn.execute(UNPARK, &[&touched]).await.map_err(DbError::query(action))?;
                for tenant_row in txn.query(TENANTS, &[&id, &budget]).await.map_err(DbError::query(action))? {
                    let tenant: TenantId = column(&tenant_row, "id", action)?;
                    let Ok(target) = placement_choose_in_txn(txn, healthy_within).await? else {
                        step.unplaced += 1;
                        continue;
                    };
                    if let Some(why) = adoption_refusal_in_txn(txn, id, target).await? {
                        step.unplaced += 1;
                        step.refused.push(why);
                        continue;
                    }
                    txn.execute(REPLACE, &[&tenant, &target]).await.map_err(DbError::query(action))?;
                    txn.execute(RETARGET, &[&tenant, &target]).await.map_err(DbError::query(action))?;
                    txn.execute(FAIL_SYNCS, &[&tenant]).await.map_err(DbError::query(action))?;
                    txn.execute(REVOKE_HOME, &[&tenant]).await.map_err(DbError::query(action))?;
                    operation_enqueue_in_txn(txn, target, tenant, ResourceType::Tenant, tenant.0).await?;
                    touched.push(tenant);
                    budget -= 1;
                }
                txn.execute(TOUCH_STATE, &[&touched]).await.map_err(DbError::query(action))?;
                step.moved.extend(touched);
                if budget <= 0 {
                    break;
                }
            }
            Ok(step)
        })
    })
    .await
}

const FENCED: &str = "SELECT fenced_at IS NOT NULL AS fenced, epoch FROM engine_instance WHERE id = $1";

const PLACED_HERE: &str = "SELECT id FROM tenant WHERE id = ANY($1) AND engine_instance_id = $2";

const UNFENCE: &str = "UPDATE engine_instance SET fenced_at = NULL WHERE id = $1 AND fenced_at IS NOT NULL";

/// Whether `instance` is fenced (its agents must clean up before anything else),
/// and its epoch.
pub async fn instance_fenced(client: &Client, instance: EngineInstanceId) -> Result<(bool, i64), DbError> {
    let action = "read an instance's fence";
    let row = client.query_opt(FENCED, &[&instance]).await.map_err(DbError::query(action))?;
    row.map_or(Ok((false, 0)), |row| Ok((column(&row, "fenced", action)?, column(&row, "epoch", action)?)))
}

/// Those of `tenants` placed on `instance` now.
pub async fn tenants_placed_on(
    client: &Client,
    tenants: &[i64],
    instance: EngineInstanceId,
) -> Result<Vec<i64>, DbError> {
    let rows = client.query(PLACED_HERE, &[&tenants, &instance]).await.map_err(DbError::query("read placements"))?;
    rows.iter().map(|row| column(row, "id", "read placements")).collect()
}

/// Lifts `instance`'s fence once its agent removed what is no longer its own; it
/// stays cordoned until an operator uncordons it.
pub async fn instance_unfence(client: &Client, instance: EngineInstanceId) -> Result<(), DbError> {
    client.execute(UNFENCE, &[&instance]).await.map_err(DbError::query("lift an instance's fence"))?;
    Ok(())
}

/// Every statement of the agent's side (a test prepares them against the schema).
pub const AGENT_STATEMENTS: &[&str] = &[FENCED, PLACED_HERE, UNFENCE];
