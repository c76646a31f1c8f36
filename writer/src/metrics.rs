//! The writer's metrics, kept in atomics and rendered by hand in the Prometheus text
//! format, as the agent does: a few counters, gauges and one histogram do not justify
//! a metrics framework. Tests read the same counters to wait on events instead of on
//! time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};

use gitops_shared::exposition::{counter, gauge};
use gitops_shared::histogram::Histogram;
use tokio::sync::watch;

use crate::work_queue::Kind;

/// A tenant resource, as the invalid-object gauge tells them apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

/// Upper bounds (seconds) of the intent-transaction buckets.
const TRANSACTION_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// How a reconcile ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Settled: the resource is stored (or its deletion finished).
    Ok,
    /// Settled: refused, with a condition the tenant can read.
    Invalid,
    /// An error; retried with backoff.
    Failed,
    /// Waits (quota, no engine instance, pruning, a missing deployment) and looks again.
    Retry,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [Outcome::Ok, Outcome::Invalid, Outcome::Failed, Outcome::Retry];

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Failed => "failed",
            Outcome::Retry => "retry",
        }
    }
}

/// What the controllers know now, read when rendering (cheaper than keeping a
/// gauge in step with every watch event).
pub trait Inventory: Send + Sync {
    /// (namespaces, GitOpsDeployments) known in the shards this writer owns.
    fn owned_counts(&self) -> (u64, u64);
    /// Namespaces in the owned shards that hold tenant resources but are not served
    /// (reserved, or no longer selected): their rows and Argo CD objects stay as they were.
    fn unserved_namespaces(&self) -> u64 {
        0
    }
}

/// The registered inventory; gone (counts 0) once the controllers stop.
#[derive(Default)]
struct InventorySource(Option<Weak<dyn Inventory>>);

impl std::fmt::Debug for InventorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "InventorySource(registered)" } else { "InventorySource(none)" })
    }
}

/// Counters and gauges of one writer.
#[derive(Debug)]
pub struct WriterMetrics {
    /// Finished reconciles, by kind (`Kind::ALL` order) and outcome (`Outcome::ALL` order).
    reconciles: [[AtomicU64; Outcome::ALL.len()]; Kind::ALL.len()],
    /// Refusals by (kind, reason); both are constants, so the map stays small.
    /// An object is counted once per generation and reason.
    validation_failures: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Objects refused now: (generation, reason) by object.
    invalid: Mutex<std::collections::HashMap<ObjectRef, (Option<i64>, &'static str)>>,
    /// Intent transactions, retries of conflicts included.
    pub transaction: Histogram,
    /// Objects waiting in the work queue.
    pub queue_depth: AtomicU64,
    /// Shards this writer holds a lease on.
    pub shards_owned: AtomicU64,
    /// Whether the watchers have listed their resources once (the shard keeper
    /// takes no shard before).
    ready: watch::Sender<bool>,
    inventory: Mutex<InventorySource>,
    /// Admission reviews answered, by (kind, outcome).
    admission: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Anti-entropy passes that compared rows with resources.
    pub resync_passes: AtomicU64,
    /// What anti-entropy repaired, by (kind, action).
    resync_repairs: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Anti-entropy passes (or tombstones) refused, by reason.
    resync_refused: Mutex<BTreeMap<&'static str, u64>>,
    /// Intent transactions that found no instance for their tenant, by reason.
    unplaced: Mutex<BTreeMap<&'static str, u64>>,
    /// Each engine instance's health at the last look (name → health).
    instance_health: Mutex<BTreeMap<String, String>>,
    /// Tenants this writer placed elsewhere because their instance was lost.
    pub failover_moves: AtomicU64,
    /// Tenant moves this writer started to balance the fleet, by reason
    /// (`degraded`, `rebalance`).
    pub fleet_moves: [AtomicU64; 2],
    /// Active rollouts by state, as the last rollout step left them.
    pub rollouts: Mutex<BTreeMap<String, u64>>,
    /// Rollout waves (the canary is wave 0) that passed their bake.
    pub rollout_waves_passed: AtomicU64,
    /// Rollouts this writer started rolling back (regressions or an abort).
    pub rollout_rollbacks: AtomicU64,
    /// Automatic scale-ups this writer ended: completed, failed.
    pub scale_ups: [AtomicU64; 2],
    /// Whether this writer is provisioning an instance for the scale-up now.
    pub scale_up_in_progress: std::sync::atomic::AtomicBool,
    /// Free slots of the open instances at the scale-up's last look (-1: not looked).
    pub fleet_free_capacity: std::sync::atomic::AtomicI64,
    /// Rounds of home-token renewal that failed (each is retried a round later).
    pub home_token_renewal_failures: AtomicU64,
    /// Listings the home-identity watch made again after losing its place.
    pub home_identity_relists: AtomicU64,
    /// When the status loop last read every owned shard's feed to its end (it does
    /// at least every 30 s while it works), or when the writer started.
    status_caught_up: Mutex<std::time::Instant>,
    /// Status rows passed over because their resource refused the patch (retried on
    /// their own).
    pub status_deferred: AtomicU64,
    /// Status rows of owned shards waiting to be retried, at the last scan that had any.
    pub status_retries: AtomicU64,
    /// Whether the fleet watch's last look at the database succeeded (every 2 s).
    pub database_up: std::sync::atomic::AtomicBool,
}

impl Default for WriterMetrics {
    fn default() -> Self {
        WriterMetrics {
            reconciles: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            validation_failures: Mutex::default(),
            invalid: Mutex::default(),
            transaction: Histogram::new(TRANSACTION_BUCKETS),
            queue_depth: AtomicU64::new(0),
            shards_owned: AtomicU64::new(0),
            ready: watch::Sender::new(false),
            inventory: Mutex::default(),
            admission: Mutex::default(),
            resync_passes: AtomicU64::new(0),
            resync_repairs: Mutex::default(),
            resync_refused: Mutex::default(),
            unplaced: Mutex::default(),
            instance_health: Mutex::default(),
            failover_moves: AtomicU64::new(0),
            fleet_moves: std::array::from_fn(|_| AtomicU64::new(0)),
            rollouts: Mutex::default(),
            rollout_waves_passed: AtomicU64::new(0),
            rollout_rollbacks: AtomicU64::new(0),
            scale_ups: std::array::from_fn(|_| AtomicU64::new(0)),
            scale_up_in_progress: std::sync::atomic::AtomicBool::new(false),
            fleet_free_capacity: std::sync::atomic::AtomicI64::new(-1),
            home_token_renewal_failures: AtomicU64::new(0),
            home_identity_relists: AtomicU64::new(0),
            status_caught_up: Mutex::new(std::time::Instant::now()),
            status_deferred: AtomicU64::new(0),
            status_retries: AtomicU64::new(0),
            database_up: std::sync::atomic::AtomicBool::new(true),
        }
    }
}

/// The reasons of balancing moves, in the order of `fleet_moves`.
const FLEET_MOVE_REASONS: [&str; 2] = ["degraded", "rebalance"];

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn kind_index(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0)
}

fn outcome_index(outcome: Outcome) -> usize {
    Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0)
}

impl WriterMetrics {
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Records that every watcher has listed once; readiness is not withdrawn.
    pub fn set_ready(&self) {
        self.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
    }

    /// Readiness as it changes (the shard keeper waits on it).
    pub fn ready_watch(&self) -> watch::Receiver<bool> {
        self.ready.subscribe()
    }

    /// Counts a finished reconcile.
    pub fn reconciled(&self, kind: Kind, outcome: Outcome) {
        self.reconciles[kind_index(kind)][outcome_index(outcome)].fetch_add(1, Ordering::Relaxed);
    }

    /// Records that `object` at `generation` is refused for `reason` (its condition's
    /// reason); counted once per object, generation and reason however often it is
    /// looked at again.
    pub fn validation_failed(&self, object: ObjectRef, generation: Option<i64>, reason: &'static str) {
        let kind = object.kind.name();
        let before = lock(&self.invalid).insert(object, (generation, reason));
        if before != Some((generation, reason)) {
            *lock(&self.validation_failures).entry((kind, reason)).or_insert(0) += 1;
        }
    }

    /// `object` is accepted, gone or another writer's: no longer counted as invalid.
    pub fn validation_cleared(&self, object: &ObjectRef) {
        lock(&self.invalid).remove(object);
    }

    /// Refusals counted for (kind, reason).
    pub fn validation_failures(&self, kind: Kind, reason: &'static str) -> u64 {
        lock(&self.validation_failures).get(&(kind.name(), reason)).copied().unwrap_or(0)
    }

    /// Objects refused now, by (kind, reason).
    fn invalid_objects(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        let mut counts = BTreeMap::new();
        for (object, (_, reason)) in lock(&self.invalid).iter() {
            *counts.entry((object.kind.name(), *reason)).or_insert(0) += 1;
        }
        counts
    }

    /// Reconciles of `kind` that ended with `outcome`.
    pub fn reconciles(&self, kind: Kind, outcome: Outcome) -> u64 {
        self.reconciles[kind_index(kind)][outcome_index(outcome)].load(Ordering::Relaxed)
    }

    /// Reconciles of every kind that ended with `outcome`.
    pub fn reconciles_total(&self, outcome: Outcome) -> u64 {
        Kind::ALL.iter().map(|kind| self.reconciles(*kind, outcome)).sum()
    }

    /// Shows what `inventory` knows as the tenant and deployment gauges while it lives.
    pub fn set_inventory(&self, inventory: Weak<dyn Inventory>) {
        self.inventory.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0 = Some(inventory);
    }

    /// Counts an admission review of `kind` that ended `outcome` (allowed, denied, error).
    pub fn admission_reviewed(&self, kind: &'static str, outcome: &'static str) {
        *self
            .admission
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry((kind, outcome))
            .or_default() += 1;
    }

    /// Admission reviews of `kind` that ended `outcome`.
    pub fn admission_reviews(&self, kind: &'static str, outcome: &'static str) -> u64 {
        self.admission
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(kind, outcome))
            .copied()
            .unwrap_or(0)
    }

    /// Counts `count` repairs of anti-entropy: `action` (tombstoned, requeued) on `kind`.
    pub fn resync_repaired(&self, kind: Kind, action: &'static str, count: u64) {
        if count > 0 {
            *lock(&self.resync_repairs).entry((kind.name(), action)).or_default() += count;
        }
    }

    /// Anti-entropy repairs of `kind` by `action`.
    pub fn resync_repairs(&self, kind: Kind, action: &'static str) -> u64 {
        lock(&self.resync_repairs).get(&(kind.name(), action)).copied().unwrap_or(0)
    }

    /// Counts an anti-entropy refusal for `reason`.
    pub fn resync_refused(&self, reason: &'static str) {
        *lock(&self.resync_refused).entry(reason).or_default() += 1;
    }

    /// Anti-entropy refusals for `reason`.
    pub fn resync_refusals(&self, reason: &'static str) -> u64 {
        lock(&self.resync_refused).get(reason).copied().unwrap_or(0)
    }

    /// Counts tenants moved off lost instances.
    pub fn failover_moves(&self, count: u64) {
        self.failover_moves.fetch_add(count, Ordering::Relaxed);
    }

    /// The status loop read every owned shard's feed to its end just now.
    pub fn status_caught_up(&self) {
        *lock(&self.status_caught_up) = std::time::Instant::now();
    }

    /// Counts status rows passed over to be retried on their own.
    pub fn status_deferred(&self, rows: u64) {
        self.status_deferred.fetch_add(rows, Ordering::Relaxed);
    }

    /// How many status rows of the owned shards wait to be retried.
    pub fn status_retries(&self, rows: u64) {
        self.status_retries.store(rows, Ordering::Relaxed);
    }

    /// Counts a tenant move started to balance the fleet, for `reason`.
    pub fn fleet_move(&self, reason: &str) {
        if let Some(index) = FLEET_MOVE_REASONS.iter().position(|known| *known == reason) {
            self.fleet_moves[index].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records the active rollouts' states (after a rollout step).
    pub fn set_rollouts(&self, states: impl IntoIterator<Item = String>) {
        let mut counts = BTreeMap::new();
        for state in states {
            *counts.entry(state).or_default() += 1;
        }
        *lock(&self.rollouts) = counts;
    }

    /// Records each engine instance's health (name → `healthy`, `degraded`, `lost`).
    pub fn set_instance_health(&self, health: BTreeMap<String, String>) {
        *lock(&self.instance_health) = health;
    }

    /// Counts a tenant that could not be placed, for `reason` (`full`, `unavailable`).
    pub fn unplaced(&self, reason: &'static str) {
        *lock(&self.unplaced).entry(reason).or_default() += 1;
    }

    /// Tenants that could not be placed, for `reason`.
    pub fn unplaced_count(&self, reason: &'static str) -> u64 {
        lock(&self.unplaced).get(reason).copied().unwrap_or(0)
    }

    fn unserved_namespaces(&self) -> u64 {
        let source = self.inventory.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.clone();
        source.and_then(|weak| weak.upgrade()).map_or(0, |inventory| inventory.unserved_namespaces())
    }

    fn owned_counts(&self) -> (u64, u64) {
        let source = self.inventory.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0.clone();
        source.and_then(|weak| weak.upgrade()).map_or((0, 0), |inventory| inventory.owned_counts())
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ =
            writeln!(out, "# HELP gitops_writer_reconciles_total Reconciles of tenant resources, by kind and outcome.");
        let _ = writeln!(out, "# TYPE gitops_writer_reconciles_total counter");
        for kind in Kind::ALL {
            for outcome in Outcome::ALL {
                let _ = writeln!(
                    out,
                    "gitops_writer_reconciles_total{{kind=\"{}\",outcome=\"{}\"}} {}",
                    kind.name(),
                    outcome.label(),
                    self.reconciles(kind, outcome)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_validation_failures_total Tenant resources refused, by kind and condition reason."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_validation_failures_total counter");
        let failures = self.validation_failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for ((kind, reason), count) in failures {
            let _ =
                writeln!(out, "gitops_writer_validation_failures_total{{kind=\"{kind}\",reason=\"{reason}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_invalid_objects Tenant resources refused now (their condition says why), by kind and reason."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_invalid_objects gauge");
        for ((kind, reason), count) in self.invalid_objects() {
            let _ = writeln!(out, "gitops_writer_invalid_objects{{kind=\"{kind}\",reason=\"{reason}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_transaction_seconds Duration of the writer's intent transactions, conflict retries included."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_transaction_seconds histogram");
        self.transaction.render(&mut out, "gitops_writer_transaction_seconds", "");
        let _ = writeln!(
            out,
            "# HELP gitops_writer_placements_refused_total Intent transactions that found no engine instance for their tenant, by reason (full: every live instance full or cordoned)."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_placements_refused_total counter");
        for reason in ["full", "unavailable"] {
            let _ = writeln!(
                out,
                "gitops_writer_placements_refused_total{{reason=\"{reason}\"}} {}",
                self.unplaced_count(reason)
            );
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_engine_instance_health 1 for each engine instance's health now (healthy, degraded: Argo CD makes no progress, lost: no agent reaches it)."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_engine_instance_health gauge");
        for (name, health) in lock(&self.instance_health).iter() {
            for state in ["healthy", "degraded", "lost"] {
                let _ = writeln!(
                    out,
                    "gitops_writer_engine_instance_health{{engine_instance=\"{name}\",health=\"{state}\"}} {}",
                    u8::from(health == state)
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_failover_moves_total Tenants this writer placed on healthy instances because theirs was lost."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_failover_moves_total counter");
        let _ = writeln!(out, "gitops_writer_failover_moves_total {}", self.failover_moves.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP gitops_writer_fleet_moves_total Tenant moves this writer started to balance the fleet: off instances degraded past the grace, or to rebalance."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_fleet_moves_total counter");
        for (reason, count) in FLEET_MOVE_REASONS.iter().zip(&self.fleet_moves) {
            let _ = writeln!(
                out,
                "gitops_writer_fleet_moves_total{{reason=\"{reason}\"}} {}",
                count.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_rollouts Active rollouts by state (moving, baking, waiting, rolling_back)."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_rollouts gauge");
        for state in ["moving", "baking", "waiting", "rolling_back"] {
            let count = lock(&self.rollouts).get(state).copied().unwrap_or(0);
            let _ = writeln!(out, "gitops_writer_rollouts{{state=\"{state}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_rollout_waves_passed_total Rollout waves (the canary included) that passed their bake."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_rollout_waves_passed_total counter");
        let _ = writeln!(
            out,
            "gitops_writer_rollout_waves_passed_total {}",
            self.rollout_waves_passed.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP gitops_writer_rollout_rollbacks_total Rollouts rolled back, for regressions or an abort."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_rollout_rollbacks_total counter");
        let _ =
            writeln!(out, "gitops_writer_rollout_rollbacks_total {}", self.rollout_rollbacks.load(Ordering::Relaxed));
        let name = "gitops_writer_scale_ups_total";
        let _ = writeln!(out, "# HELP {name} Automatic scale-ups this writer ended, by outcome.");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (outcome, count) in ["completed", "failed"].iter().zip(&self.scale_ups) {
            let _ = writeln!(out, "{name}{{outcome=\"{outcome}\"}} {}", count.load(Ordering::Relaxed));
        }
        let name = "gitops_writer_scale_up_in_progress";
        let _ = writeln!(out, "# HELP {name} 1 while this writer provisions an instance for the automatic scale-up.");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name} {}", i64::from(self.scale_up_in_progress.load(Ordering::Relaxed)));
        let name = "gitops_writer_fleet_free_capacity";
        let _ = writeln!(
            out,
            "# HELP {name} Free tenant slots of the open instances at the scale-up's last look (-1: scale-up off)."
        );
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name} {}", self.fleet_free_capacity.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP gitops_writer_home_token_renewal_failures_total Rounds of home-token renewal that failed (retried a round later)."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_home_token_renewal_failures_total counter");
        let failures = self.home_token_renewal_failures.load(Ordering::Relaxed);
        let _ = writeln!(out, "gitops_writer_home_token_renewal_failures_total {failures}");
        let _ = writeln!(
            out,
            "# HELP gitops_writer_watch_relists_total Listings a watch made again after losing its place in the API server's history (410 Gone), by watch."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_watch_relists_total counter");
        let relists = self.home_identity_relists.load(Ordering::Relaxed);
        let _ = writeln!(out, "gitops_writer_watch_relists_total{{watch=\"home_identity\"}} {relists}");
        let (tenants, deployments) = self.owned_counts();
        let _ =
            writeln!(out, "# HELP gitops_writer_tenants Namespaces with resources the writer knows, in its shards.");
        let _ = writeln!(out, "# TYPE gitops_writer_tenants gauge");
        let _ = writeln!(out, "gitops_writer_tenants {tenants}");
        let _ = writeln!(out, "# HELP gitops_writer_deployments GitOpsDeployments the writer knows, in its shards.");
        let _ = writeln!(out, "# TYPE gitops_writer_deployments gauge");
        let _ = writeln!(out, "gitops_writer_deployments {deployments}");
        let _ = writeln!(
            out,
            "# HELP gitops_writer_unserved_namespaces Namespaces with tenant resources the service does not serve (reserved or not selected), in the writer's shards."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_unserved_namespaces gauge");
        let _ = writeln!(out, "gitops_writer_unserved_namespaces {}", self.unserved_namespaces());
        let _ = writeln!(
            out,
            "# HELP gitops_writer_admission_reviews_total Admission reviews the writer's webhook answered, by kind and outcome."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_admission_reviews_total counter");
        let admission = self.admission.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for ((kind, outcome), count) in admission {
            let _ =
                writeln!(out, "gitops_writer_admission_reviews_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_resync_passes_total Anti-entropy passes that compared the rows of owned shards with the tenant resources."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_resync_passes_total counter");
        let _ = writeln!(out, "gitops_writer_resync_passes_total {}", self.resync_passes.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP gitops_writer_resync_repairs_total What anti-entropy repaired: rows of gone resources tombstoned, resources without a current row requeued."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_resync_repairs_total counter");
        for ((kind, action), count) in lock(&self.resync_repairs).clone() {
            let _ = writeln!(out, "gitops_writer_resync_repairs_total{{kind=\"{kind}\",action=\"{action}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP gitops_writer_resync_refused_total Anti-entropy passes or tombstones refused, by reason."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_resync_refused_total counter");
        for (reason, count) in lock(&self.resync_refused).clone() {
            let _ = writeln!(out, "gitops_writer_resync_refused_total{{reason=\"{reason}\"}} {count}");
        }
        let _ = writeln!(out, "# HELP gitops_writer_queue_depth Objects waiting in the work queue.");
        let _ = writeln!(out, "# TYPE gitops_writer_queue_depth gauge");
        let _ = writeln!(out, "gitops_writer_queue_depth {}", self.queue_depth.load(Ordering::Relaxed));
        let behind = lock(&self.status_caught_up).elapsed().as_secs_f64();
        let _ = writeln!(
            out,
            "# HELP gitops_writer_status_behind_seconds Seconds since the status loop last read every owned shard's status feed to its end (it does at least every 30 s while it works): how stale tenants' status may be."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_status_behind_seconds gauge");
        let _ = writeln!(out, "gitops_writer_status_behind_seconds {behind:.3}");
        counter(
            &mut out,
            "gitops_writer_status_deferred_total",
            "Status rows the writer passed over because their resource refused the patch (forbidden, invalid, or changing under it); each is retried on its own while the rest of its shard goes on.",
            self.status_deferred.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "gitops_writer_status_retries",
            "Status rows of this writer's shards waiting to be patched again (table status_retry).",
            self.status_retries.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP gitops_writer_database_up 1 while the writer's look at the database every 2 s succeeds, else 0."
        );
        let _ = writeln!(out, "# TYPE gitops_writer_database_up gauge");
        let _ = writeln!(out, "gitops_writer_database_up {}", u8::from(self.database_up.load(Ordering::Relaxed)));
        let _ = writeln!(out, "# HELP gitops_writer_shards_owned Shards this writer holds a lease on.");
        let _ = writeln!(out, "# TYPE gitops_writer_shards_owned gauge");
        let _ = writeln!(out, "gitops_writer_shards_owned {}", self.shards_owned.load(Ordering::Relaxed));
        let _ = writeln!(out, "# HELP gitops_writer_ready Whether the writer's watchers have synced.");
        let _ = writeln!(out, "# TYPE gitops_writer_ready gauge");
        let _ = writeln!(out, "gitops_writer_ready {}", u8::from(self.is_ready()));
        gitops_shared::process::ProcessStats::current().render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::Duration;

    use super::*;

    struct Fixed(u64, u64);

    impl Inventory for Fixed {
        fn owned_counts(&self) -> (u64, u64) {
            (self.0, self.1)
        }
    }

    /// The samples of `out`: (series with labels, value), comments left out.
    fn samples(out: &str) -> Vec<(&str, &str)> {
        out.lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| line.rsplit_once(' ').expect("a series and a value"))
            .collect()
    }

    fn value<'a>(out: &'a str, series: &str) -> &'a str {
        samples(out)
            .into_iter()
            .find(|(s, _)| *s == series)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {series} in\n{out}"))
    }

    #[test]
    fn render_shows_every_series_with_help_and_type() {
        let metrics = WriterMetrics::default();
        metrics.reconciled(Kind::Deployment, Outcome::Ok);
        metrics.reconciled(Kind::Deployment, Outcome::Ok);
        metrics.reconciled(Kind::SyncRun, Outcome::Retry);
        metrics.reconciled(Kind::Environment, Outcome::Failed);
        metrics.reconciled(Kind::Deployment, Outcome::Invalid);
        let object = |kind, name: &str| ObjectRef { kind, namespace: "team-a".into(), name: name.into() };
        metrics.validation_failed(object(Kind::Deployment, "a"), Some(1), "InvalidPath");
        metrics.validation_failed(object(Kind::Deployment, "a"), Some(1), "InvalidPath");
        metrics.validation_failed(object(Kind::Deployment, "a"), Some(2), "InvalidPath");
        metrics.validation_failed(object(Kind::Deployment, "b"), Some(1), "InvalidPath");
        metrics.validation_failed(object(Kind::Deployment, "b"), Some(1), "InvalidPath");
        metrics.validation_failed(object(Kind::RepositoryCredential, "c"), Some(1), "SecretNotFound");
        metrics.validation_cleared(&object(Kind::Deployment, "b"));
        metrics.transaction.observe(Duration::from_millis(3));
        metrics.transaction.observe(Duration::from_millis(40));
        metrics.transaction.observe(Duration::from_secs(60));
        let inventory: Arc<dyn Inventory> = Arc::new(Fixed(3, 7));
        metrics.set_inventory(Arc::downgrade(&inventory));
        let out = metrics.render();

        let r = |kind: &str, outcome: &str| {
            format!("gitops_writer_reconciles_total{{kind=\"{kind}\",outcome=\"{outcome}\"}}")
        };
        assert_eq!(value(&out, &r("GitOpsDeployment", "ok")), "2");
        assert_eq!(value(&out, &r("GitOpsDeployment", "invalid")), "1");
        assert_eq!(value(&out, &r("GitOpsDeploymentSyncRun", "retry")), "1");
        assert_eq!(value(&out, &r("GitOpsDeploymentManagedEnvironment", "failed")), "1");
        assert_eq!(value(&out, &r("GitOpsDeploymentRepositoryCredential", "ok")), "0", "every series, zeros too");
        let series = samples(&out).iter().filter(|(s, _)| s.starts_with("gitops_writer_reconciles_total{")).count();
        assert_eq!(series, Kind::ALL.len() * Outcome::ALL.len());
        assert_eq!(metrics.reconciles_total(Outcome::Ok), 2);

        let v = |kind: &str, reason: &str| {
            format!("gitops_writer_validation_failures_total{{kind=\"{kind}\",reason=\"{reason}\"}}")
        };
        assert_eq!(value(&out, &v("GitOpsDeployment", "InvalidPath")), "3", "once per object and generation");
        assert_eq!(value(&out, &v("GitOpsDeploymentRepositoryCredential", "SecretNotFound")), "1");
        let i =
            |kind: &str, reason: &str| format!("gitops_writer_invalid_objects{{kind=\"{kind}\",reason=\"{reason}\"}}");
        assert_eq!(value(&out, &i("GitOpsDeployment", "InvalidPath")), "1", "b was accepted since");
        assert_eq!(value(&out, &i("GitOpsDeploymentRepositoryCredential", "SecretNotFound")), "1");

        let h = "gitops_writer_transaction_seconds";
        assert_eq!(value(&out, &format!("{h}_bucket{{le=\"0.001\"}}")), "0");
        assert_eq!(value(&out, &format!("{h}_bucket{{le=\"0.005\"}}")), "1", "buckets are cumulative");
        assert_eq!(value(&out, &format!("{h}_bucket{{le=\"0.05\"}}")), "2");
        assert_eq!(value(&out, &format!("{h}_bucket{{le=\"10\"}}")), "2");
        assert_eq!(value(&out, &format!("{h}_bucket{{le=\"+Inf\"}}")), "3", "over the last bound only in +Inf");
        assert_eq!(value(&out, &format!("{h}_count")), "3");
        assert_eq!(value(&out, &format!("{h}_sum")), "60.043");

        assert_eq!(value(&out, "gitops_writer_tenants"), "3");
        assert_eq!(value(&out, "gitops_writer_deployments"), "7");
        assert_eq!(value(&out, "gitops_writer_ready"), "0");

        // Every family is introduced once by HELP and TYPE, before its samples.
        for family in [
            "gitops_writer_reconciles_total counter",
            "gitops_writer_validation_failures_total counter",
            "gitops_writer_transaction_seconds histogram",
            "gitops_writer_tenants gauge",
            "gitops_writer_deployments gauge",
            "gitops_writer_queue_depth gauge",
            "gitops_writer_shards_owned gauge",
            "gitops_writer_ready gauge",
        ] {
            let name = family.split(' ').next().expect("a name");
            assert_eq!(out.matches(&format!("# TYPE {family}\n")).count(), 1, "{family}");
            assert_eq!(out.matches(&format!("# HELP {name} ")).count(), 1, "{name}");
            let lines: Vec<&str> = out.lines().collect();
            let type_at = lines.iter().position(|l| l.starts_with(&format!("# TYPE {name} "))).expect("TYPE");
            let sample_at = lines.iter().position(|l| !l.starts_with('#') && l.starts_with(name)).expect("a sample");
            assert!(type_at < sample_at, "{name}: TYPE before samples");
        }
    }

    #[test]
    fn gauges_read_zero_once_the_inventory_is_gone() {
        let metrics = WriterMetrics::default();
        let out = metrics.render();
        assert_eq!(value(&out, "gitops_writer_tenants"), "0", "nothing registered");
        let inventory: Arc<dyn Inventory> = Arc::new(Fixed(1, 2));
        metrics.set_inventory(Arc::downgrade(&inventory));
        assert_eq!(value(&metrics.render(), "gitops_writer_deployments"), "2");
        drop(inventory);
        let out = metrics.render();
        assert_eq!((value(&out, "gitops_writer_tenants"), value(&out, "gitops_writer_deployments")), ("0", "0"));
    }

    #[test]
    fn rollouts_are_counted_by_state_and_read_zero_when_none_is_active() {
        let metrics = WriterMetrics::default();
        metrics.set_rollouts(["baking".to_owned(), "moving".to_owned(), "baking".to_owned()]);
        metrics.rollout_rollbacks.fetch_add(1, Ordering::Relaxed);
        let out = metrics.render();
        assert_eq!(value(&out, "gitops_writer_rollouts{state=\"baking\"}"), "2");
        assert_eq!(value(&out, "gitops_writer_rollouts{state=\"moving\"}"), "1");
        assert_eq!(value(&out, "gitops_writer_rollouts{state=\"waiting\"}"), "0");
        assert_eq!(value(&out, "gitops_writer_rollout_rollbacks_total"), "1");
        metrics.set_rollouts(Vec::new());
        assert_eq!(value(&metrics.render(), "gitops_writer_rollouts{state=\"baking\"}"), "0");
    }
}
