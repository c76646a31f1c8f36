//! Canary rollouts of a new Argo CD version (migration V16): a cohort of tenants
//! moves onto the target instance with the ordinary move protocol
//! ([`tenant_move_in_txn`], reason `rollout`), bakes, and each cohort deployment's
//! health and sync are compared with what they were before the move (a baseline
//! taken in the transaction that starts the move). Promotion moves the rest of the
//! source instances' tenants in waves, each judged the same way; a wave with more
//! regressions than tolerated, or an operator's abort, moves every tenant the
//! rollout moved back to where it came from (reason `rollback`).
//!
//! A regression is a deployment going Healthy → Degraded/Unknown/Missing, a
//! `ComparisonError` or a failed sync that was not there before, or a refusal by the
//! new instance; deployments whose generation changed during the bake are excluded.
//!
//! State lives in `rollout`, `rollout_tenant` and `rollout_baseline`; a writer's
//! fleet watch calls [`rollout_step`], which advances every active rollout by one
//! step under an advisory lock, so a rollout survives restarts of every process.
//! The step holds its rollouts' rows until it commits, so an operator's abort or
//! promotion waits for it and then applies to the state it left, never to one it
//! is about to overwrite.
//! One rollout acts on a tenant at a time: a partial unique index on
//! `rollout_tenant (tenant_id) WHERE active`, and the move protocol refuses other
//! moves of such a tenant (failover, which does not ask, wins: the rollout then
//! ends). A rollout's target takes no other new tenants (placement, balancing and
//! operators' moves skip it, and the placement trigger refuses one that raced with
//! the rollout's start: starting locks the target's row first).
//! Each tenant the rollout moved keeps its slot on its source until the rollout
//! stops acting on it (`rollout_tenant.slot_held`, `engine_instance.reserved`), so
//! a rollback always finds room, however many tenants arrived there meanwhile.

use std::time::Duration;

use tokio_postgres::{Client, Transaction};

use crate::db::tenant_move::tenant_move_in_txn;
use crate::db::{DbError, column, in_txn_retrying};
use crate::model::{EngineInstanceId, TenantId};

/// The advisory lock key of rollout steps.
const ROLLOUT_LOCK: i64 = 0x6769_746f_7073_0003;

/// A rollout's states that still act on tenants.
pub const ACTIVE_STATES: &[&str] = &["moving", "baking", "waiting", "rolling_back"];

/// The move reasons of a rollout's own moves (the only moves its tenants and its
/// target accept while it is active).
pub const MOVE_REASON: &str = "rollout";
pub const ROLLBACK_REASON: &str = "rollback";

const LOCK: &str = "SELECT pg_try_advisory_xact_lock($1) AS locked";

// Locks the target's row: a placement or move onto it waits for the rollout's start
// and is then refused by the placement trigger (migration V18).
const TARGET: &str = "
SELECT id, name, argocd_version, fenced_at IS NOT NULL AS fenced, capacity::bigint AS capacity,
       tenants::bigint AS tenants
  FROM engine_instance WHERE name = $1
   FOR NO KEY UPDATE";

const INSERT: &str = "
INSERT INTO rollout (target_instance_id, target_version, wave_size, bake_ms, max_regressions)
VALUES ($1, $2, $3, $4, $5)
RETURNING id";

// Tenants that may join a cohort: placed elsewhere, still, in no active rollout
// ($2: only from this instance).
const ELIGIBLE: &str = "
SELECT t.id, t.namespace_name FROM tenant t
 WHERE t.row_state = 'active' AND t.engine_instance_id IS NOT NULL AND t.engine_instance_id <> $1
   AND ($2::bigint IS NULL OR t.engine_instance_id = $2) AND t.move_state IS NULL
   AND NOT EXISTS (SELECT 1 FROM rollout_tenant rt WHERE rt.tenant_id = t.id AND rt.active)
 ORDER BY t.id
 LIMIT $3
   FOR UPDATE OF t SKIP LOCKED";

const ELIGIBLE_COUNT: &str = "
SELECT count(*) AS eligible FROM tenant t
 WHERE t.row_state = 'active' AND t.engine_instance_id IS NOT NULL AND t.engine_instance_id <> $1
   AND ($2::bigint IS NULL OR t.engine_instance_id = $2) AND t.move_state IS NULL
   AND NOT EXISTS (SELECT 1 FROM rollout_tenant rt WHERE rt.tenant_id = t.id AND rt.active)";

const INSTANCE_ID: &str = "SELECT id FROM engine_instance WHERE name = $1";

const TENANT_OF: &str = "SELECT id, engine_instance_id FROM tenant WHERE namespace_name = $1 AND row_state = 'active'";

const JOIN: &str = "
INSERT INTO rollout_tenant (rollout_id, tenant_id, wave, source_instance_id) VALUES ($1, $2, $3, $4)";

// The tenant's deployments as they are before the move.
const BASELINE: &str = "
INSERT INTO rollout_baseline (rollout_id, application_id, tenant_id, wave, generation, health_status, sync_status,
                              comparison_error, sync_failed)
SELECT $1, a.id, a.tenant_id, $3, a.generation, s.health_status, s.sync_status,
       COALESCE(s.conditions @> '[{\"type\": \"ComparisonError\"}]', false),
       COALESCE(s.operation_state->>'phase' IN ('Failed', 'Error'), false) OR COALESCE(s.agent_stalled, false)
  FROM application a LEFT JOIN application_state s ON s.application_id = a.id
 WHERE a.tenant_id = $2 AND a.row_state = 'active'";

const ACTIVE: &str = "
SELECT r.id, r.state, r.wave, r.promoting, r.wave_size, r.bake_ms, r.max_regressions,
       r.bake_until IS NOT NULL AND r.bake_until <= now() AS baked, r.outcome,
       r.target_instance_id, e.name AS target, e.fenced_at IS NOT NULL AS target_fenced,
       e.capacity::bigint AS capacity, (e.tenants + e.reserved)::bigint AS tenants
  FROM rollout r JOIN engine_instance e ON e.id = r.target_instance_id
 WHERE r.state IN ('moving', 'baking', 'waiting', 'rolling_back')
 ORDER BY r.id
   FOR UPDATE OF r";

// The rollout's tenants still acted on, with where each is now.
const MEMBERS: &str = "
SELECT rt.tenant_id, rt.wave, rt.state, rt.source_instance_id, src.name AS source,
       t.namespace_name, t.engine_instance_id, t.move_state, COALESCE(t.row_state::text, 'deleted') AS row_state
  FROM rollout_tenant rt
  JOIN engine_instance src ON src.id = rt.source_instance_id
  LEFT JOIN tenant t ON t.id = rt.tenant_id
 WHERE rt.rollout_id = $1 AND rt.active
 ORDER BY rt.tenant_id";

const MEMBER_STATE: &str = "UPDATE rollout_tenant SET state = $3 WHERE rollout_id = $1 AND tenant_id = $2";

// Deployments of the wave not yet applied on the target (stalled ones are judged).
// Only those the bake will judge: one edited since its baseline is excluded from
// the verdict, so the wave does not wait for it (a tenant that keeps editing would
// otherwise hold the wave in `moving` for ever).
const UNAPPLIED: &str = "
SELECT count(*) AS unapplied
  FROM rollout_tenant rt
  JOIN tenant t ON t.id = rt.tenant_id AND t.engine_instance_id = $2
  JOIN rollout_baseline b ON b.rollout_id = rt.rollout_id AND b.tenant_id = rt.tenant_id AND b.wave = rt.wave
  JOIN application a ON a.id = b.application_id AND a.row_state = 'active' AND a.generation = b.generation
  LEFT JOIN application_state s ON s.application_id = a.id
 WHERE rt.rollout_id = $1 AND rt.wave = $3 AND rt.active
   AND s.applied_generation IS DISTINCT FROM a.generation AND NOT COALESCE(s.agent_stalled, false)";

const BAKE: &str = "
UPDATE rollout SET state = 'baking', bake_until = now() + bake_ms * interval '1 millisecond', updated_at = now()
 WHERE id = $1";

// Each baseline of the wave against the deployment now.
const JUDGE: &str = "
SELECT b.application_id, b.generation AS before_generation, b.health_status AS before_health,
       b.comparison_error AS before_comparison_error, b.sync_failed AS before_sync_failed,
       a.generation, a.row_state::text AS row_state, a.resource_name, t.namespace_name,
       s.health_status, COALESCE(s.conditions @> '[{\"type\": \"ComparisonError\"}]', false) AS comparison_error,
       COALESCE(s.operation_state->>'phase' IN ('Failed', 'Error'), false) AS sync_failed,
       COALESCE(s.agent_stalled, false) AS stalled
  FROM rollout_baseline b
  LEFT JOIN application a ON a.id = b.application_id
  LEFT JOIN application_state s ON s.application_id = b.application_id
  LEFT JOIN tenant t ON t.id = b.tenant_id
 WHERE b.rollout_id = $1 AND b.wave = $2 AND b.verdict IS NULL
 ORDER BY b.application_id";

const VERDICT: &str = "
UPDATE rollout_baseline SET verdict = $3, detail = $4 WHERE rollout_id = $1 AND application_id = $2";

const SET_STATE: &str = "UPDATE rollout SET state = $2, updated_at = now() WHERE id = $1";

const NEXT_WAVE: &str = "
UPDATE rollout SET state = 'moving', wave = $2, bake_until = NULL, updated_at = now() WHERE id = $1";

const ROLL_BACK: &str = "
UPDATE rollout SET state = 'rolling_back', outcome = $2, reason = $3, updated_at = now()
 WHERE id = $1 AND state IN ('moving', 'baking', 'waiting')
RETURNING id";

const FINISH: &str = "
UPDATE rollout SET state = $2, reason = COALESCE($3, reason), finished_at = now(), updated_at = now()
 WHERE id = $1";

const RELEASE_TENANTS: &str = "UPDATE rollout_tenant SET active = false WHERE rollout_id = $1 AND active";

// The source instances of the rollout (where promotion takes its waves from).
const SOURCES: &str = "SELECT DISTINCT source_instance_id FROM rollout_tenant WHERE rollout_id = $1";

const PROMOTE: &str = "
UPDATE rollout SET promoting = true, wave_size = COALESCE($2, wave_size), updated_at = now()
 WHERE id = $1 AND state IN ('moving', 'baking', 'waiting')
RETURNING id";

const STATE_OF: &str = "SELECT state FROM rollout WHERE id = $1";

const LIST: &str = "
SELECT r.id, e.name AS target, r.target_version, r.state, r.wave, r.promoting, r.wave_size, r.bake_ms,
       r.max_regressions, r.outcome, r.reason, r.created_at, r.finished_at
  FROM rollout r JOIN engine_instance e ON e.id = r.target_instance_id
 WHERE $1::bigint IS NULL OR r.id = $1
 ORDER BY r.id";

const WAVES: &str = "
SELECT w.wave,
       (SELECT count(*) FROM rollout_tenant rt WHERE rt.rollout_id = $1 AND rt.wave = w.wave) AS tenants,
       count(b.application_id) AS deployments,
       count(*) FILTER (WHERE b.verdict = 'ok') AS ok,
       count(*) FILTER (WHERE b.verdict = 'regressed') AS regressed,
       count(*) FILTER (WHERE b.verdict = 'excluded') AS excluded
  FROM (SELECT DISTINCT wave FROM rollout_tenant WHERE rollout_id = $1) w
  LEFT JOIN rollout_baseline b ON b.rollout_id = $1 AND b.wave = w.wave
 GROUP BY w.wave
 ORDER BY w.wave";

const TENANTS_OF: &str = "
SELECT t.namespace_name, rt.wave, rt.state, src.name AS source, rt.active
  FROM rollout_tenant rt
  JOIN engine_instance src ON src.id = rt.source_instance_id
  JOIN tenant t ON t.id = rt.tenant_id
 WHERE rt.rollout_id = $1
 ORDER BY rt.wave, t.namespace_name";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    LOCK,
    TARGET,
    INSERT,
    ELIGIBLE,
    ELIGIBLE_COUNT,
    INSTANCE_ID,
    TENANT_OF,
    JOIN,
    BASELINE,
    ACTIVE,
    MEMBERS,
    MEMBER_STATE,
    UNAPPLIED,
    BAKE,
    JUDGE,
    VERDICT,
    SET_STATE,
    NEXT_WAVE,
    ROLL_BACK,
    FINISH,
    RELEASE_TENANTS,
    SOURCES,
    PROMOTE,
    STATE_OF,
    LIST,
    WAVES,
    TENANTS_OF,
];

/// Which tenants a rollout starts with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cohort {
    /// This many tenants (the oldest first).
    Tenants(u32),
    /// This percentage of the eligible tenants (rounded up, at least one).
    Percent(u32),
    /// Exactly the tenants of these namespaces.
    Namespaces(Vec<String>),
}

/// What `rollout start` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutRequest {
    pub target: String,
    pub cohort: Cohort,
    /// Only tenants of this instance (None: of every other instance).
    pub from: Option<String>,
    pub bake: Duration,
    /// Regressions tolerated per wave; None: 10% of the wave's deployments, at least 1.
    pub max_regressions: Option<u32>,
    /// Tenants per promotion wave; None: the canary's size.
    pub wave_size: Option<u32>,
}

/// A rollout that started: its id and the namespaces of its canary cohort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutStarted {
    pub id: i64,
    pub cohort: Vec<String>,
}

fn invalid<T>(message: String) -> Result<T, DbError> {
    Err(DbError::InvalidMove { message })
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn count_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Starts a rollout: moves its canary cohort onto the target (see the module).
/// Refused, with the reason, when the target is unknown or fenced, another rollout
/// to it is active, or no tenant can join the cohort (or a named one cannot).
pub async fn rollout_start(client: &mut Client, request: RolloutRequest) -> Result<RolloutStarted, DbError> {
    in_txn_retrying(client, move |txn| {
        let request = request.clone();
        Box::pin(async move { start_in_txn(txn, &request).await })
    })
    .await
}

async fn start_in_txn(txn: &Transaction<'_>, request: &RolloutRequest) -> Result<RolloutStarted, DbError> {
    let action = "start a rollout";
    let Some(target) = txn.query_opt(TARGET, &[&request.target]).await.map_err(DbError::query(action))? else {
        return invalid(format!("no engine instance {:?}", request.target));
    };
    let target_id: EngineInstanceId = column(&target, "id", action)?;
    if column::<bool>(&target, "fenced", action)? {
        return invalid(format!("engine instance {:?} is fenced (it failed over)", request.target));
    }
    let from: Option<EngineInstanceId> = match &request.from {
        None => None,
        Some(name) => match txn.query_opt(INSTANCE_ID, &[name]).await.map_err(DbError::query(action))? {
            Some(row) => Some(column(&row, "id", action)?),
            None => return invalid(format!("no engine instance {name:?}")),
        },
    };
    let version: Option<String> = column(&target, "argocd_version", action)?;
    let wave_size = request.wave_size.map(count_i32);
    let max_regressions = request.max_regressions.map(count_i32);
    let inserted = txn
        .query_one(INSERT, &[&target_id, &version, &wave_size.unwrap_or(1), &millis(request.bake), &max_regressions])
        .await;
    let id: i64 = match inserted {
        Ok(row) => column(&row, "id", action)?,
        Err(source) => {
            let error = DbError::Query { action, source };
            if error.is_unique_violation() {
                return invalid(format!("a rollout to {:?} is in progress already", request.target));
            }
            return Err(error);
        }
    };
    let mut cohort = Vec::new();
    let mut refused = None;
    match &request.cohort {
        Cohort::Namespaces(namespaces) => {
            for namespace in namespaces {
                let Some(row) = txn.query_opt(TENANT_OF, &[namespace]).await.map_err(DbError::query(action))? else {
                    return invalid(format!("no tenant in namespace {namespace:?}"));
                };
                let tenant: TenantId = column(&row, "id", action)?;
                let Some(source) = column::<Option<EngineInstanceId>>(&row, "engine_instance_id", action)? else {
                    return invalid(format!("the tenant of {namespace:?} is not placed on any instance yet"));
                };
                join(txn, id, 0, tenant, namespace, source, &request.target).await?;
                cohort.push(namespace.clone());
            }
        }
        Cohort::Tenants(_) | Cohort::Percent(_) => {
            let wanted: i64 = match request.cohort {
                Cohort::Tenants(n) => i64::from(n),
                Cohort::Percent(p) => {
                    let row =
                        txn.query_one(ELIGIBLE_COUNT, &[&target_id, &from]).await.map_err(DbError::query(action))?;
                    let eligible: i64 = column(&row, "eligible", action)?;
                    ((eligible * i64::from(p.min(100))) + 99) / 100
                }
                Cohort::Namespaces(_) => 0,
            };
            let rows =
                txn.query(ELIGIBLE, &[&target_id, &from, &wanted.max(1)]).await.map_err(DbError::query(action))?;
            for row in &rows {
                let tenant: TenantId = column(row, "id", action)?;
                let namespace: String = column(row, "namespace_name", action)?;
                let source: EngineInstanceId = match txn.query_one(TENANT_OF, &[&namespace]).await {
                    Ok(row) => column(&row, "engine_instance_id", action)?,
                    Err(source) => return Err(DbError::Query { action, source }),
                };
                match join(txn, id, 0, tenant, &namespace, source, &request.target).await {
                    Ok(()) => cohort.push(namespace),
                    // The target filled up, say: the cohort is what could move.
                    Err(DbError::InvalidMove { message }) => refused = Some(message),
                    Err(error) => return Err(error),
                }
            }
        }
    }
    if cohort.is_empty() {
        let why = refused.unwrap_or_else(|| "none is placed elsewhere and still".to_owned());
        return invalid(format!("no tenant can join a rollout to {:?}: {why}", request.target));
    }
    if wave_size.is_none() {
        let size = i32::try_from(cohort.len()).unwrap_or(i32::MAX);
        txn.execute("UPDATE rollout SET wave_size = $2 WHERE id = $1", &[&id, &size])
            .await
            .map_err(DbError::query(action))?;
    }
    Ok(RolloutStarted { id, cohort })
}

/// Takes a tenant into wave `wave` of rollout `id`: its move (which locks the
/// tenant and refuses one that moves or is in another rollout), its row and its
/// baseline (the move changes nothing the baseline reads).
async fn join(
    txn: &Transaction<'_>,
    id: i64,
    wave: i32,
    tenant: TenantId,
    namespace: &str,
    source: EngineInstanceId,
    target: &str,
) -> Result<(), DbError> {
    let action = "add a tenant to a rollout";
    tenant_move_in_txn(txn, namespace, target, MOVE_REASON).await?;
    txn.execute(JOIN, &[&id, &tenant, &wave, &source]).await.map_err(DbError::query(action))?;
    txn.execute(BASELINE, &[&id, &tenant, &wave]).await.map_err(DbError::query(action))?;
    Ok(())
}

/// What one step did to one rollout (for logs and metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutEvent {
    /// Wave `wave`'s tenants are on the target: its bake started.
    Baking { id: i64, wave: i32 },
    /// Wave `wave` passed its bake (`ok` deployments judged fine).
    Passed { id: i64, wave: i32, ok: i64 },
    /// Promotion moved `tenants` more tenants (wave `wave`).
    WaveStarted { id: i64, wave: i32, tenants: usize },
    /// Rolling back, and why.
    RollingBack { id: i64, reason: String },
    /// A tenant's move back was refused (tried again next step).
    ReturnRefused { id: i64, namespace: String, reason: String },
    /// The rollout ended in `state` (`completed`, `rolled_back` or `aborted`).
    Finished { id: i64, state: String, reason: Option<String> },
}

/// One step over every active rollout (see the module).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RolloutStep {
    pub events: Vec<RolloutEvent>,
    /// Active rollouts after the step, by state.
    pub active: Vec<(i64, String)>,
    /// Another writer held the step's lock: nothing was done.
    pub skipped: bool,
}

/// Advances every active rollout by one step.
pub async fn rollout_step(client: &mut Client) -> Result<RolloutStep, DbError> {
    in_txn_retrying(client, |txn| Box::pin(async move { step_in_txn(txn).await })).await
}

struct Active {
    id: i64,
    state: String,
    wave: i32,
    promoting: bool,
    wave_size: i32,
    max_regressions: Option<i32>,
    baked: bool,
    outcome: Option<String>,
    target_id: EngineInstanceId,
    target: String,
    target_fenced: bool,
    free: i64,
}

async fn step_in_txn(txn: &Transaction<'_>) -> Result<RolloutStep, DbError> {
    let action = "advance rollouts";
    let mut step = RolloutStep::default();
    let locked: bool =
        column(&txn.query_one(LOCK, &[&ROLLOUT_LOCK]).await.map_err(DbError::query(action))?, "locked", action)?;
    if !locked {
        step.skipped = true;
        return Ok(step);
    }
    let rows = txn.query(ACTIVE, &[]).await.map_err(DbError::query(action))?;
    for row in &rows {
        let (capacity, tenants): (i64, i64) = (column(row, "capacity", action)?, column(row, "tenants", action)?);
        let rollout = Active {
            id: column(row, "id", action)?,
            state: column(row, "state", action)?,
            wave: column(row, "wave", action)?,
            promoting: column(row, "promoting", action)?,
            wave_size: column(row, "wave_size", action)?,
            max_regressions: column(row, "max_regressions", action)?,
            baked: column::<Option<bool>>(row, "baked", action)?.unwrap_or(false),
            outcome: column(row, "outcome", action)?,
            target_id: column(row, "target_instance_id", action)?,
            target: column(row, "target", action)?,
            target_fenced: column(row, "target_fenced", action)?,
            free: (capacity - tenants).max(0),
        };
        let state = advance(txn, &rollout, &mut step.events).await?;
        if ACTIVE_STATES.contains(&state.as_str()) {
            step.active.push((rollout.id, state));
        }
    }
    Ok(step)
}

/// One tenant of a rollout, as it is now.
struct Member {
    tenant: TenantId,
    wave: i32,
    state: String,
    source_id: EngineInstanceId,
    source: String,
    namespace: Option<String>,
    instance: Option<EngineInstanceId>,
    moving: bool,
    live: bool,
}

async fn members(txn: &Transaction<'_>, id: i64) -> Result<Vec<Member>, DbError> {
    let action = "read a rollout's tenants";
    let rows = txn.query(MEMBERS, &[&id]).await.map_err(DbError::query(action))?;
    rows.iter()
        .map(|row| {
            Ok(Member {
                tenant: column(row, "tenant_id", action)?,
                wave: column(row, "wave", action)?,
                state: column(row, "state", action)?,
                source_id: column(row, "source_instance_id", action)?,
                source: column(row, "source", action)?,
                namespace: column(row, "namespace_name", action)?,
                instance: column(row, "engine_instance_id", action)?,
                moving: column::<Option<String>>(row, "move_state", action)?.is_some(),
                live: column::<String>(row, "row_state", action)? == "active",
            })
        })
        .collect()
}

async fn set_member(txn: &Transaction<'_>, id: i64, tenant: TenantId, state: &str) -> Result<(), DbError> {
    txn.execute(MEMBER_STATE, &[&id, &tenant, &state]).await.map_err(DbError::query("advance a rollout's tenant"))?;
    Ok(())
}

/// Ends rollout `id` in `state`.
async fn finish(
    txn: &Transaction<'_>,
    id: i64,
    state: &str,
    reason: Option<String>,
    events: &mut Vec<RolloutEvent>,
) -> Result<String, DbError> {
    let action = "end a rollout";
    txn.execute(FINISH, &[&id, &state, &reason]).await.map_err(DbError::query(action))?;
    txn.execute(RELEASE_TENANTS, &[&id]).await.map_err(DbError::query(action))?;
    events.push(RolloutEvent::Finished { id, state: state.to_owned(), reason });
    Ok(state.to_owned())
}

/// Starts rolling rollout `id` back (`outcome`: how it will end).
async fn roll_back(
    txn: &Transaction<'_>,
    id: i64,
    outcome: &str,
    reason: String,
    events: &mut Vec<RolloutEvent>,
) -> Result<String, DbError> {
    txn.query_opt(ROLL_BACK, &[&id, &outcome, &reason]).await.map_err(DbError::query("roll a rollout back"))?;
    events.push(RolloutEvent::RollingBack { id, reason });
    Ok("rolling_back".to_owned())
}

/// One step of one rollout; returns its state after it.
async fn advance(txn: &Transaction<'_>, rollout: &Active, events: &mut Vec<RolloutEvent>) -> Result<String, DbError> {
    let action = "advance a rollout";
    let id = rollout.id;
    let members = members(txn, id).await?;
    // Failover beats a rollout: the target's tenants are placed elsewhere already.
    if rollout.target_fenced {
        for member in &members {
            set_member(txn, id, member.tenant, "returned").await?;
        }
        let reason =
            format!("engine instance {:?} was lost and failed over; its tenants were placed elsewhere", rollout.target);
        return finish(txn, id, "rolled_back", Some(reason), events).await;
    }
    match rollout.state.as_str() {
        "moving" => {
            let mut arrived = true;
            for member in members.iter().filter(|m| m.wave == rollout.wave && m.state == "moving") {
                if member.live && member.moving {
                    arrived = false;
                } else {
                    // On the target, gone, or placed elsewhere by a failover.
                    set_member(txn, id, member.tenant, "moved").await?;
                }
            }
            if !arrived {
                return Ok(rollout.state.clone());
            }
            let row = txn
                .query_one(UNAPPLIED, &[&id, &rollout.target_id, &rollout.wave])
                .await
                .map_err(DbError::query(action))?;
            if column::<i64>(&row, "unapplied", action)? > 0 {
                return Ok(rollout.state.clone());
            }
            txn.execute(BAKE, &[&id]).await.map_err(DbError::query(action))?;
            events.push(RolloutEvent::Baking { id, wave: rollout.wave });
            Ok("baking".to_owned())
        }
        "baking" if rollout.baked => {
            let verdict = judge(txn, id, rollout.wave, rollout.max_regressions).await?;
            if verdict.regressed.len() > verdict.limit {
                let mut reason = format!(
                    "wave {}: {} of {} deployments regressed on {:?} (at most {} tolerated): {}",
                    rollout.wave,
                    verdict.regressed.len(),
                    verdict.judged,
                    rollout.target,
                    verdict.limit,
                    verdict.regressed.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
                );
                if verdict.regressed.len() > 5 {
                    reason.push_str("; …");
                }
                return roll_back(txn, id, "rolled_back", reason, events).await;
            }
            events.push(RolloutEvent::Passed { id, wave: rollout.wave, ok: verdict.ok });
            if rollout.wave == 0 && !rollout.promoting {
                txn.execute(SET_STATE, &[&id, &"waiting"]).await.map_err(DbError::query(action))?;
                return Ok("waiting".to_owned());
            }
            next_wave(txn, rollout, events).await
        }
        "waiting" if rollout.promoting => next_wave(txn, rollout, events).await,
        "rolling_back" => {
            let mut done = true;
            for member in &members {
                let home = member.instance == Some(member.source_id);
                let on_target = member.instance == Some(rollout.target_id);
                match member.state.as_str() {
                    _ if !member.live => set_member(txn, id, member.tenant, "returned").await?,
                    "returned" => {}
                    _ if member.moving => done = false,
                    "returning" if home || !on_target => set_member(txn, id, member.tenant, "returned").await?,
                    _ if !on_target => set_member(txn, id, member.tenant, "returned").await?,
                    _ => {
                        done = false;
                        let namespace = member.namespace.clone().unwrap_or_default();
                        match tenant_move_in_txn(txn, &namespace, &member.source, ROLLBACK_REASON).await {
                            Ok(()) => set_member(txn, id, member.tenant, "returning").await?,
                            Err(DbError::InvalidMove { message }) => {
                                events.push(RolloutEvent::ReturnRefused { id, namespace, reason: message });
                            }
                            Err(error) => return Err(error),
                        }
                    }
                }
            }
            if !done {
                return Ok(rollout.state.clone());
            }
            let outcome = rollout.outcome.clone().unwrap_or_else(|| "rolled_back".to_owned());
            finish(txn, id, &outcome, None, events).await
        }
        _ => Ok(rollout.state.clone()),
    }
}

/// The bake's verdict on one wave.
struct Verdict {
    ok: i64,
    judged: usize,
    regressed: Vec<String>,
    limit: usize,
}

/// Why a deployment regressed, from its state before and now; None: it did not.
pub fn regression(before: &Observed, now: &Observed) -> Option<String> {
    const WORSE: [&str; 3] = ["Degraded", "Unknown", "Missing"];
    if before.health.as_deref() == Some("Healthy")
        && let Some(health) = now.health.as_deref().filter(|h| WORSE.contains(h))
    {
        return Some(format!("health Healthy → {health}"));
    }
    if now.comparison_error && !before.comparison_error {
        return Some("a new ComparisonError".to_owned());
    }
    if now.sync_failed && !before.sync_failed {
        return Some("a failed sync".to_owned());
    }
    None
}

/// What the bake compares of one deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    pub health: Option<String>,
    pub comparison_error: bool,
    /// A failed or errored sync, or a refusal by the instance.
    pub sync_failed: bool,
}

/// Regressions tolerated in a wave of `deployments` when the operator set none:
/// 10% of them, at least one.
pub fn default_max_regressions(deployments: usize) -> usize {
    (deployments / 10).max(1)
}

async fn judge(txn: &Transaction<'_>, id: i64, wave: i32, max_regressions: Option<i32>) -> Result<Verdict, DbError> {
    let action = "judge a rollout's wave";
    let rows = txn.query(JUDGE, &[&id, &wave]).await.map_err(DbError::query(action))?;
    let mut verdict = Verdict { ok: 0, judged: 0, regressed: Vec::new(), limit: 0 };
    for row in &rows {
        let application: i64 = column(row, "application_id", action)?;
        let generation: Option<i64> = column(row, "generation", action)?;
        let live = column::<Option<String>>(row, "row_state", action)?.as_deref() == Some("active");
        let (outcome, detail) = if !live || generation != Some(column(row, "before_generation", action)?) {
            ("excluded", None)
        } else {
            let before = Observed {
                health: column(row, "before_health", action)?,
                comparison_error: column(row, "before_comparison_error", action)?,
                sync_failed: column(row, "before_sync_failed", action)?,
            };
            let now = Observed {
                health: column(row, "health_status", action)?,
                comparison_error: column(row, "comparison_error", action)?,
                sync_failed: column::<bool>(row, "sync_failed", action)? || column::<bool>(row, "stalled", action)?,
            };
            verdict.judged += 1;
            match regression(&before, &now) {
                Some(why) => {
                    let namespace: Option<String> = column(row, "namespace_name", action)?;
                    let name: Option<String> = column(row, "resource_name", action)?;
                    let detail = format!("{}/{}: {why}", namespace.unwrap_or_default(), name.unwrap_or_default());
                    verdict.regressed.push(detail.clone());
                    ("regressed", Some(detail))
                }
                None => {
                    verdict.ok += 1;
                    ("ok", None)
                }
            }
        };
        txn.execute(VERDICT, &[&id, &application, &outcome, &detail]).await.map_err(DbError::query(action))?;
    }
    verdict.limit = match max_regressions {
        Some(n) => usize::try_from(n).unwrap_or(0),
        None => default_max_regressions(verdict.judged),
    };
    Ok(verdict)
}

/// Promotion's next wave: the next tenants of the source instances, as many as the
/// wave size and the target's room allow; the rollout completes when none is left.
async fn next_wave(txn: &Transaction<'_>, rollout: &Active, events: &mut Vec<RolloutEvent>) -> Result<String, DbError> {
    let action = "start a rollout's wave";
    let id = rollout.id;
    let wave = rollout.wave + 1;
    let sources = txn.query(SOURCES, &[&id]).await.map_err(DbError::query(action))?;
    let limit = i64::from(rollout.wave_size).min(rollout.free);
    let mut moved = Vec::new();
    let mut left = false;
    for source in &sources {
        let source: EngineInstanceId = column(source, "source_instance_id", action)?;
        let room = limit - i64::try_from(moved.len()).unwrap_or(i64::MAX);
        // One more than there is room for: whether any is left.
        let rows = txn
            .query(ELIGIBLE, &[&rollout.target_id, &Some(source), &(room.max(0) + 1)])
            .await
            .map_err(DbError::query(action))?;
        // SKIP LOCKED passes over a tenant whose row someone holds (a writer
        // reconciling its namespace): it is still to move, this wave or the next.
        if rows.is_empty() && !left {
            let row = txn
                .query_one(ELIGIBLE_COUNT, &[&rollout.target_id, &Some(source)])
                .await
                .map_err(DbError::query(action))?;
            left = column::<i64>(&row, "eligible", action)? > 0;
        }
        for row in &rows {
            if i64::try_from(moved.len()).unwrap_or(i64::MAX) >= limit {
                left = true;
                break;
            }
            let tenant: TenantId = column(row, "id", action)?;
            let namespace: String = column(row, "namespace_name", action)?;
            match join(txn, id, wave, tenant, &namespace, source, &rollout.target).await {
                Ok(()) => moved.push(namespace),
                Err(DbError::InvalidMove { .. }) => left = true,
                Err(error) => return Err(error),
            }
        }
    }
    if moved.is_empty() {
        if left && rollout.free > 0 {
            // Every candidate was refused this time (moving, say): the wave passed, so
            // the rollout waits (promoting) and tries again next step without judging
            // the wave again.
            txn.execute(SET_STATE, &[&id, &"waiting"]).await.map_err(DbError::query(action))?;
            return Ok("waiting".to_owned());
        }
        let reason =
            left.then(|| format!("engine instance {:?} is full; tenants remain on the sources", rollout.target));
        return finish(txn, id, "completed", reason, events).await;
    }
    txn.execute(NEXT_WAVE, &[&id, &wave]).await.map_err(DbError::query(action))?;
    events.push(RolloutEvent::WaveStarted { id, wave, tenants: moved.len() });
    Ok("moving".to_owned())
}

/// Asks rollout `id` to promote: after its canary passes, the source instances'
/// remaining tenants move in waves of `wave_size` (None: as set at start).
pub async fn rollout_promote(client: &Client, id: i64, wave_size: Option<u32>) -> Result<(), DbError> {
    let action = "promote a rollout";
    let size = wave_size.map(count_i32);
    if client.query_opt(PROMOTE, &[&id, &size]).await.map_err(DbError::query(action))?.is_some() {
        return Ok(());
    }
    not_active(client, id, action).await
}

/// Aborts rollout `id`: every tenant it moved goes back (the rollout ends `aborted`).
pub async fn rollout_abort(client: &Client, id: i64, reason: &str) -> Result<(), DbError> {
    let action = "abort a rollout";
    let reason = format!("aborted by an operator: {reason}");
    if client.query_opt(ROLL_BACK, &[&id, &"aborted", &reason]).await.map_err(DbError::query(action))?.is_some() {
        return Ok(());
    }
    not_active(client, id, action).await
}

async fn not_active(client: &Client, id: i64, action: &'static str) -> Result<(), DbError> {
    match client.query_opt(STATE_OF, &[&id]).await.map_err(DbError::query(action))? {
        None => Err(DbError::NotFound { what: format!("rollout {id}") }),
        Some(row) => {
            let state: String = column(&row, "state", action)?;
            invalid(format!("rollout {id} is {state}"))
        }
    }
}

/// One rollout as `rollout status` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    pub id: i64,
    pub target: String,
    pub target_version: Option<String>,
    pub state: String,
    pub wave: i32,
    pub promoting: bool,
    pub wave_size: i32,
    pub bake: Duration,
    pub max_regressions: Option<i32>,
    pub outcome: Option<String>,
    pub reason: Option<String>,
    pub created_at: std::time::SystemTime,
    pub finished_at: Option<std::time::SystemTime>,
}

/// One wave's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveResult {
    pub wave: i32,
    pub tenants: i64,
    pub deployments: i64,
    pub ok: i64,
    pub regressed: i64,
    pub excluded: i64,
}

/// One tenant of a rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutMember {
    pub namespace: String,
    pub wave: i32,
    pub state: String,
    pub source: String,
    pub active: bool,
}

impl TryFrom<&tokio_postgres::Row> for Rollout {
    type Error = tokio_postgres::Error;

    fn try_from(row: &tokio_postgres::Row) -> Result<Self, Self::Error> {
        let bake_ms: i64 = row.try_get("bake_ms")?;
        Ok(Rollout {
            id: row.try_get("id")?,
            target: row.try_get("target")?,
            target_version: row.try_get("target_version")?,
            state: row.try_get("state")?,
            wave: row.try_get("wave")?,
            promoting: row.try_get("promoting")?,
            wave_size: row.try_get("wave_size")?,
            bake: Duration::from_millis(u64::try_from(bake_ms).unwrap_or(0)),
            max_regressions: row.try_get("max_regressions")?,
            outcome: row.try_get("outcome")?,
            reason: row.try_get("reason")?,
            created_at: row.try_get("created_at")?,
            finished_at: row.try_get("finished_at")?,
        })
    }
}

/// Every rollout (or only `id`), oldest first.
pub async fn rollout_list(client: &Client, id: Option<i64>) -> Result<Vec<Rollout>, DbError> {
    let action = "list rollouts";
    let rows = client.query(LIST, &[&id]).await.map_err(DbError::query(action))?;
    rows.iter().map(|row| Rollout::try_from(row).map_err(DbError::query(action))).collect()
}

/// Rollout `id`'s waves and their results.
pub async fn rollout_waves(client: &Client, id: i64) -> Result<Vec<WaveResult>, DbError> {
    let action = "read a rollout's waves";
    let rows = client.query(WAVES, &[&id]).await.map_err(DbError::query(action))?;
    rows.iter()
        .map(|row| {
            Ok(WaveResult {
                wave: column(row, "wave", action)?,
                tenants: column(row, "tenants", action)?,
                deployments: column(row, "deployments", action)?,
                ok: column(row, "ok", action)?,
                regressed: column(row, "regressed", action)?,
                excluded: column(row, "excluded", action)?,
            })
        })
        .collect()
}

/// Rollout `id`'s tenants, by wave.
pub async fn rollout_members(client: &Client, id: i64) -> Result<Vec<RolloutMember>, DbError> {
    let action = "read a rollout's tenants";
    let rows = client.query(TENANTS_OF, &[&id]).await.map_err(DbError::query(action))?;
    rows.iter()
        .map(|row| {
            Ok(RolloutMember {
                namespace: column(row, "namespace_name", action)?,
                wave: column(row, "wave", action)?,
                state: column(row, "state", action)?,
                source: column(row, "source", action)?,
                active: column(row, "active", action)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(health: &str) -> Observed {
        Observed { health: Some(health.to_owned()), ..Observed::default() }
    }

    #[test]
    fn healthy_to_degraded_unknown_or_missing_regresses_other_changes_do_not() {
        for worse in ["Degraded", "Unknown", "Missing"] {
            assert_eq!(regression(&seen("Healthy"), &seen(worse)), Some(format!("health Healthy → {worse}")));
        }
        assert_eq!(regression(&seen("Healthy"), &seen("Progressing")), None);
        assert_eq!(regression(&seen("Degraded"), &seen("Degraded")), None, "it was so before");
        assert_eq!(regression(&seen("Progressing"), &seen("Degraded")), None, "only Healthy regresses");
    }

    #[test]
    fn new_comparison_errors_and_failed_syncs_regress_old_ones_do_not() {
        let error = Observed { comparison_error: true, ..seen("Healthy") };
        assert_eq!(regression(&seen("Healthy"), &error), Some("a new ComparisonError".to_owned()));
        assert_eq!(regression(&error, &error), None);
        let failed = Observed { sync_failed: true, ..seen("Healthy") };
        assert_eq!(regression(&seen("Healthy"), &failed), Some("a failed sync".to_owned()));
        assert_eq!(regression(&failed, &failed), None);
    }

    #[test]
    fn a_wave_tolerates_ten_percent_of_its_deployments_and_at_least_one() {
        assert_eq!(default_max_regressions(0), 1);
        assert_eq!(default_max_regressions(3), 1);
        assert_eq!(default_max_regressions(25), 2);
        assert_eq!(default_max_regressions(100), 10);
    }
}
