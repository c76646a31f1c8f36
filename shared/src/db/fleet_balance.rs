//! Automatic fleet balancing, a bounded step at a time, by whichever writer holds
//! the step's advisory lock (the writers' fleet watch takes one every few seconds):
//!
//! - An instance *degraded* (its agents answer, but Argo CD itself makes no
//!   progress) for longer than a grace is drained: cordoned, and its tenants moved
//!   by the ordinary protocol, since its agents can still release them. Only when
//!   another open instance has room: a cordon outlives the degradation (an operator
//!   lifts it), so a lone instance cordoned under a passing overload would take no
//!   new tenant ever after. A *lost* instance is failover's (`failover`), not this.
//! - With a threshold, tenants move from the fullest to the emptiest open, healthy
//!   instance while their loads (tenants / capacity) differ by more than it. With
//!   hysteresis: a rebalance starts when the spread is above the threshold and,
//!   while moves it started are in progress, goes on down to half of it, so a fleet
//!   near the threshold does not start and stop over and over.
//!
//! Never more than `max_concurrent_moves` moves are in progress in the fleet,
//! whatever started them (operators' moves count too).

use std::time::Duration;

use tokio_postgres::{Client, Transaction};

use crate::db::tenant_move::tenant_move_in_txn;
use crate::db::{DbError, column, in_txn_retrying};

/// The advisory lock key of balancing steps.
const BALANCE_LOCK: i64 = 0x6769_746f_7073_0002;

const LOCK: &str = "SELECT pg_try_advisory_xact_lock($1) AS locked";

// Every instance, its load (slots held for tenants a rollout moved away count as
// taken) and whether it was degraded for longer than the grace
// ($1 ms; NULL: no draining) past the degraded window.
const INSTANCES: &str = "
SELECT e.name, e.capacity::bigint AS capacity, (e.tenants + e.reserved)::bigint AS tenants, e.cordoned,
       e.fenced_at IS NOT NULL AS fenced,
       EXISTS (SELECT 1 FROM rollout r WHERE r.target_instance_id = e.id
                 AND r.state IN ('moving', 'baking', 'waiting', 'rolling_back')) AS rollout_target,
       engine_instance_health(e.heartbeat_at, e.progress_at) AS health,
       $1::bigint IS NOT NULL AND engine_instance_health(e.heartbeat_at, e.progress_at) = 'degraded'
         AND e.progress_at < now() - COALESCE(NULLIF(current_setting('gitops.instance_degraded_after', true), ''),
                                              '90 seconds')::interval
                                   - $1::bigint * interval '1 millisecond' AS degraded_past_grace
  FROM engine_instance e
 ORDER BY e.name";

const RUNNING: &str = "
SELECT count(*) AS running, count(*) FILTER (WHERE move_reason = 'rebalance') AS rebalancing
  FROM tenant WHERE move_state IS NOT NULL";

const CORDON: &str = "UPDATE engine_instance SET cordoned = true WHERE name = $1 AND NOT cordoned";

// A tenant of an instance that may move now (oldest first).
const MOVABLE: &str = "
SELECT t.namespace_name FROM tenant t JOIN engine_instance e ON e.id = t.engine_instance_id
 WHERE e.name = $1 AND t.move_state IS NULL AND t.row_state = 'active'
   AND NOT EXISTS (SELECT 1 FROM rollout_tenant rt WHERE rt.tenant_id = t.id AND rt.active)
 ORDER BY t.id LIMIT 1";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[LOCK, INSTANCES, RUNNING, CORDON, MOVABLE];

/// What automatic balancing does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BalanceSettings {
    /// Drain an instance degraded for longer than this; None: never.
    pub degraded_grace: Option<Duration>,
    /// Rebalance when loads differ by more than this (0 to 1); None: never.
    pub rebalance_threshold: Option<f64>,
    /// Most moves in progress in the fleet at once.
    pub max_concurrent_moves: usize,
}

/// One instance as balancing sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceLoad {
    pub name: String,
    pub tenants: i64,
    pub capacity: i64,
    /// Open to tenants: healthy, not cordoned, not fenced.
    pub open: bool,
}

impl InstanceLoad {
    fn load(&self) -> f64 {
        if self.capacity <= 0 { 1.0 } else { self.tenants as f64 / self.capacity as f64 }
    }

    fn has_room(&self) -> bool {
        self.tenants < self.capacity
    }
}

/// One move a step started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedMove {
    pub namespace: String,
    pub from: String,
    pub to: String,
    /// `degraded` or `rebalance`.
    pub reason: &'static str,
}

/// What one step did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BalanceStep {
    /// Instances cordoned because they stayed degraded past the grace.
    pub drained: Vec<String>,
    /// Instances degraded past the grace left open: no other open instance had room
    /// for their tenants (a cordon would only keep new tenants off once it recovers).
    pub stranded: Vec<String>,
    pub moves: Vec<StartedMove>,
    /// Moves the protocol refused (the target filled up meanwhile, say), with the reason.
    pub refused: Vec<String>,
    /// Another writer held the step's lock: nothing was done.
    pub skipped: bool,
}

/// The moves (from, to) that bring the open instances' loads within `threshold` of
/// each other, at most `budget`, fullest to emptiest; each move counted before the next.
pub fn plan_rebalance(instances: &[InstanceLoad], threshold: f64, budget: usize) -> Vec<(String, String)> {
    let mut open: Vec<InstanceLoad> = instances.iter().filter(|i| i.open).cloned().collect();
    let mut moves = Vec::new();
    while moves.len() < budget && open.len() > 1 {
        open.sort_by(|a, b| a.load().total_cmp(&b.load()).then(a.name.cmp(&b.name)));
        let last = open.len() - 1;
        if open[last].load() - open[0].load() <= threshold || !open[0].has_room() || open[last].tenants == 0 {
            break;
        }
        // A move that would only swap the two loads brings nothing.
        let (to, from) = (&open[0], &open[last]);
        let after =
            ((from.tenants - 1) as f64 / from.capacity as f64 - (to.tenants + 1) as f64 / to.capacity as f64).abs();
        if after >= open[last].load() - open[0].load() {
            break;
        }
        moves.push((open[last].name.clone(), open[0].name.clone()));
        open[last].tenants -= 1;
        open[0].tenants += 1;
    }
    moves
}

/// The open instance with room and the lowest load, other than `except`.
fn drain_target<'a>(instances: &'a [InstanceLoad], except: &str) -> Option<&'a InstanceLoad> {
    instances
        .iter()
        .filter(|i| i.open && i.has_room() && i.name != except)
        .min_by(|a, b| a.load().total_cmp(&b.load()).then(a.name.cmp(&b.name)))
}

/// One balancing step (see the module).
pub async fn balance_step(client: &mut Client, settings: BalanceSettings) -> Result<BalanceStep, DbError> {
    in_txn_retrying(client, move |txn| Box::pin(async move { balance_in_txn(txn, settings).await })).await
}

async fn balance_in_txn(txn: &Transaction<'_>, settings: BalanceSettings) -> Result<BalanceStep, DbError> {
    let action = "balance the fleet";
    let mut step = BalanceStep::default();
    let locked: bool =
        column(&txn.query_one(LOCK, &[&BALANCE_LOCK]).await.map_err(DbError::query(action))?, "locked", action)?;
    if !locked {
        step.skipped = true;
        return Ok(step);
    }
    let grace_ms: Option<i64> =
        settings.degraded_grace.map(|grace| i64::try_from(grace.as_millis()).unwrap_or(i64::MAX / 1_000_000));
    let rows = txn.query(INSTANCES, &[&grace_ms]).await.map_err(DbError::query(action))?;
    let mut instances = Vec::new();
    let mut degraded = Vec::new();
    for row in &rows {
        let name: String = column(row, "name", action)?;
        let (cordoned, fenced): (bool, bool) = (column(row, "cordoned", action)?, column(row, "fenced", action)?);
        let health: String = column(row, "health", action)?;
        if settings.degraded_grace.is_some()
            && column::<Option<bool>>(row, "degraded_past_grace", action)? == Some(true)
        {
            degraded.push((name.clone(), cordoned));
        }
        instances.push(InstanceLoad {
            name,
            tenants: column(row, "tenants", action)?,
            capacity: column(row, "capacity", action)?,
            // A rollout's target takes no tenants but the rollout's.
            open: health == "healthy" && !cordoned && !fenced && !column::<bool>(row, "rollout_target", action)?,
        });
    }
    let running = txn.query_one(RUNNING, &[]).await.map_err(DbError::query(action))?;
    let (in_progress, rebalancing): (i64, i64) =
        (column(&running, "running", action)?, column(&running, "rebalancing", action)?);
    let mut budget = settings.max_concurrent_moves.saturating_sub(usize::try_from(in_progress).unwrap_or(usize::MAX));

    for (name, cordoned) in degraded {
        if !cordoned && drain_target(&instances, &name).is_none() {
            step.stranded.push(name);
            continue;
        }
        if !cordoned && txn.execute(CORDON, &[&name]).await.map_err(DbError::query(action))? > 0 {
            step.drained.push(name.clone());
        }
        while budget > 0 {
            let Some(target) = drain_target(&instances, &name).map(|i| i.name.clone()) else { break };
            let Some(row) = txn.query_opt(MOVABLE, &[&name]).await.map_err(DbError::query(action))? else { break };
            let namespace: String = column(&row, "namespace_name", action)?;
            if !start(
                txn,
                &mut step,
                &mut instances,
                StartedMove { namespace, from: name.clone(), to: target, reason: "degraded" },
            )
            .await?
            {
                break;
            }
            budget -= 1;
        }
    }
    if let Some(threshold) = settings.rebalance_threshold {
        let threshold = if rebalancing > 0 { threshold / 2.0 } else { threshold };
        for (from, to) in plan_rebalance(&instances, threshold, budget) {
            let Some(row) = txn.query_opt(MOVABLE, &[&from]).await.map_err(DbError::query(action))? else { continue };
            let namespace: String = column(&row, "namespace_name", action)?;
            if !start(txn, &mut step, &mut instances, StartedMove { namespace, from, to, reason: "rebalance" }).await? {
                break;
            }
        }
    }
    Ok(step)
}

/// Starts `planned`; false when the protocol refused it (recorded in `step`).
async fn start(
    txn: &Transaction<'_>,
    step: &mut BalanceStep,
    instances: &mut [InstanceLoad],
    planned: StartedMove,
) -> Result<bool, DbError> {
    match tenant_move_in_txn(txn, &planned.namespace, &planned.to, planned.reason).await {
        Ok(()) => {
            for instance in instances.iter_mut() {
                if instance.name == planned.from {
                    instance.tenants -= 1;
                } else if instance.name == planned.to {
                    instance.tenants += 1;
                }
            }
            step.moves.push(planned);
            Ok(true)
        }
        Err(DbError::InvalidMove { message }) => {
            step.refused.push(message);
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(name: &str, tenants: i64, capacity: i64, open: bool) -> InstanceLoad {
        InstanceLoad { name: name.into(), tenants, capacity, open }
    }

    #[test]
    fn rebalancing_moves_from_the_fullest_to_the_emptiest_until_within_the_threshold() {
        let fleet = [instance("a", 8, 10, true), instance("b", 0, 10, true), instance("c", 2, 10, true)];
        let moves = plan_rebalance(&fleet, 0.2, 10);
        assert_eq!(moves.len(), 4, "{moves:?}");
        assert!(moves.iter().all(|(from, _)| from == "a"));
        assert_eq!(moves.iter().filter(|(_, to)| to == "b").count(), 3);
        // The budget bounds it; within the threshold nothing moves.
        assert_eq!(plan_rebalance(&fleet, 0.2, 1), [("a".to_owned(), "b".to_owned())]);
        assert!(plan_rebalance(&fleet, 0.8, 10).is_empty());
    }

    #[test]
    fn closed_instances_neither_give_nor_take_and_moves_never_just_swap_loads() {
        let fleet = [instance("a", 9, 10, false), instance("b", 0, 10, true), instance("c", 5, 10, true)];
        let moves = plan_rebalance(&fleet, 0.1, 10);
        assert!(moves.iter().all(|(from, to)| from == "c" && to == "b"), "{moves:?}");
        assert_eq!(moves.len(), 2);
        // 1 of 2 against 0 of 2: a move would only swap the loads.
        assert!(plan_rebalance(&[instance("x", 1, 2, true), instance("y", 0, 2, true)], 0.1, 5).is_empty());
        // Nobody with room: nothing moves.
        assert!(plan_rebalance(&[instance("x", 2, 2, true), instance("y", 1, 1, true)], 0.0, 5).is_empty());
    }

    #[test]
    fn a_drain_goes_to_the_open_instance_with_the_lowest_load_and_room() {
        let fleet = [
            instance("a", 5, 10, true),
            instance("b", 1, 1, true),
            instance("c", 3, 10, true),
            instance("d", 0, 10, false),
        ];
        assert_eq!(drain_target(&fleet, "a").map(|i| i.name.as_str()), Some("c"));
        assert_eq!(drain_target(&fleet, "c").map(|i| i.name.as_str()), Some("a"));
        assert!(drain_target(&[instance("a", 1, 1, true)], "z").is_none());
    }
}
