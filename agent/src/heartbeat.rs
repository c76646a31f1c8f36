//! An instance's heartbeat loop and its duty lease. Every agent process serving an
//! instance probes its Argo CD; the one holding the instance's duty lease
//! (`gitops_shared::db::instance_duty`) also does the singleton duties: it writes
//! the heartbeat and Argo CD's progress, version and tracking settings, makes
//! backed-off operations due when Argo CD answers again, and cleans up after a
//! fence; the sweep runs only in that process ([`Duty`]). The others, while their
//! probe passes and the database answers, keep their own writes to Argo CD going
//! (the self-fence clock) and their status epoch current.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gitops_shared::db::engine_instance::{EngineInstance, InstanceEpoch, engine_instance_heartbeat};
use gitops_shared::db::instance_duty::{instance_duty_hold, instance_duty_release};
use gitops_shared::db::{self, DbPool, pooled};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::engine::self_fence::HeartbeatClock;
use crate::engine::{AdoptionSettings, Engine, ProgressStamp};
use crate::metrics::Metrics;

/// Whether this process holds its instance's duty lease, as far as it knows: until
/// the end of the lease it last took or renewed, measured from before it asked (so
/// it stops acting before the database would let another process take over).
#[derive(Debug, Clone, Default)]
pub struct Duty {
    until: Arc<Mutex<Option<Instant>>>,
    changed: Arc<Notify>,
}

impl Duty {
    /// Whether the duties are this process's now.
    pub fn held(&self) -> bool {
        self.until.lock().map(|until| until.is_some_and(|u| Instant::now() < u)).unwrap_or(false)
    }

    fn set(&self, until: Option<Instant>) {
        if let Ok(mut current) = self.until.lock() {
            *current = until;
        }
        self.changed.notify_waiters();
    }

    /// Waits until the duties are this process's (true) or `cancel` fires (false).
    pub async fn wait_held(&self, cancel: &CancellationToken) -> bool {
        loop {
            let changed = self.changed.notified();
            if self.held() {
                return true;
            }
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = changed => {}
                // A lease that lapsed without a change is noticed within a second.
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }
}

/// Takes or renews the duty lease for `holder`; records the outcome in `duty`.
pub async fn hold_duty(
    pool: &DbPool,
    instance: &EngineInstance,
    holder: &str,
    lease: Duration,
    duty: &Duty,
    metrics: &Metrics,
) -> Result<bool, db::DbError> {
    let asked = Instant::now();
    let held = async {
        let client = pooled(pool).await?;
        instance_duty_hold(&client, instance.id, holder, lease).await
    }
    .await;
    let was = duty.held();
    match held {
        Ok(true) => duty.set(Some(asked + lease)),
        Ok(false) | Err(_) => duty.set(None),
    }
    let now = duty.held();
    metrics.duty_held.store(now, Ordering::Relaxed);
    if now != was {
        if now {
            tracing::info!(instance.name = %instance.name, "took the instance's duty lease: sweeping and heartbeating here");
        } else {
            tracing::info!(instance.name = %instance.name, "the instance's duty lease is another process's now");
        }
    }
    held
}

/// Gives the lease up at shutdown, so another process takes the duties at once.
pub async fn release_duty(pool: &DbPool, instance: &EngineInstance, holder: &str, duty: &Duty) {
    if !duty.held() {
        return;
    }
    duty.set(None);
    let released = async {
        let client = pooled(pool).await?;
        instance_duty_release(&client, instance.id, holder).await
    }
    .await;
    if let Err(error) = released {
        tracing::warn!(%error, "could not release the duty lease; it expires by itself");
    }
}

/// Writes the heartbeat and samples the instance's queue.
pub(crate) async fn heartbeat(
    pool: &DbPool,
    instance: &EngineInstance,
    metrics: &Metrics,
    clock: &HeartbeatClock,
) -> Result<(), db::DbError> {
    let client = pooled(pool).await?;
    engine_instance_heartbeat(&client, instance.id).await?;
    clock.beat();
    metrics.heartbeats.fetch_add(1, Ordering::Relaxed);
    let (depth, dead) = gitops_shared::queue::operation_waiting_count(&client, instance.id).await?;
    metrics.queue_depth.store(depth, Ordering::Relaxed);
    metrics.dead_letters.store(dead, Ordering::Relaxed);
    // A sample that fails is logged, never a failed heartbeat.
    match gitops_shared::queue::xmin_horizon_holder(&client).await {
        Ok(holder) => {
            let (xids, seconds) = holder
                .map_or((0, 0), |h| (h.age_xids, h.age.map_or(0, |age| i64::try_from(age.as_secs()).unwrap_or(0))));
            metrics.xmin_horizon_age_xids.store(xids, Ordering::Relaxed);
            metrics.xmin_horizon_age_seconds.store(seconds, Ordering::Relaxed);
        }
        Err(error) => tracing::warn!(%error, "could not sample the oldest snapshot holder"),
    }
    Ok(())
}

/// Probes in a row that must pass, after one failed, before the agent reports its
/// instance reachable (a heartbeat) or Argo CD making progress again: coming back
/// takes several probes, never one. Losing it takes `gitops.instance_lost_after`
/// without a heartbeat, and degrading `gitops.instance_degraded_after` without
/// progress, several probes too at the default 15 s interval. (Argo CD stamps
/// `reconciledAt` to the second: probes less than a second apart cannot see progress
/// in a row.)
const RECOVERY_PROBES: u32 = 3;

/// Whether to report a probe that passed: always while none failed, and after a
/// failure only once `need` passed in a row.
#[derive(Debug, Clone, Copy)]
struct Debounce {
    need: u32,
    streak: u32,
    /// Whether the previous probe was reported as passed.
    reported: bool,
    /// Whether the one before it was.
    reported_before: bool,
}

impl Debounce {
    /// Settled: nothing failed yet.
    fn new(need: u32) -> Self {
        Debounce { need, streak: need, reported: true, reported_before: true }
    }

    /// Takes a probe's outcome; returns whether to report it as passed.
    fn observe(&mut self, passed: bool) -> bool {
        self.streak = if passed { self.streak.saturating_add(1) } else { 0 };
        self.reported_before = self.reported;
        self.reported = self.streak >= self.need;
        self.reported
    }

    /// Whether the probe before the last one was reported as passed (false right
    /// after a recovery).
    fn reported_before(&self) -> bool {
        self.reported_before
    }
}

/// What the heartbeat loop works with.
pub(crate) struct Heartbeats {
    pub(crate) pool: DbPool,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) instance: EngineInstance,
    /// Kept current: read again whenever the instance is found unfenced.
    pub(crate) epoch: InstanceEpoch,
    /// Told of every heartbeat written, and of every duty lease statement that
    /// answered in a process without the duties (writes to Argo CD stop while it
    /// is old).
    pub(crate) clock: HeartbeatClock,
    pub(crate) every: Duration,
    pub(crate) metrics: Arc<Metrics>,
    /// This process's name in the duty lease.
    pub(crate) holder: String,
    pub(crate) lease: Duration,
    pub(crate) duty: Duty,
}

/// Beats while the Argo CD namespace's API answers: an agent that cannot reach it
/// writes no heartbeat and is not ready. When it answers again, the instance's
/// backed-off operations are made due at once instead of at their next retry.
pub(crate) async fn heartbeat_loop(beats: Heartbeats, cancel: CancellationToken) {
    let Heartbeats { pool, engine, instance, epoch, clock, every, metrics, holder, lease, duty } = beats;
    // The progress probe's last stamp, and whether an unstamped probe was counted once.
    let mut last_stamp: Option<String> = None;
    let mut unstamped_counted = false;
    let (mut reachable, mut progressing) = (Debounce::new(RECOVERY_PROBES), Debounce::new(RECOVERY_PROBES));
    // The adoption settings last recorded.
    let mut reported: Option<AdoptionSettings> = None;
    // The version last recorded (outer None: not yet).
    let mut reported_version: Option<Option<String>> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let was_reachable = metrics.argocd_reachable.load(Ordering::Relaxed);
        let probe = engine.probe().await;
        metrics.argocd_probes.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = probe {
            if was_reachable {
                tracing::error!(error = %gitops_shared::telemetry::error_chain(&error), argocd.ns = %instance.argocd_namespace,
                    "the Argo CD namespace's API does not answer this agent: not ready, no heartbeat");
            }
            reachable.observe(false);
            metrics.argocd_reachable.store(false, Ordering::Relaxed);
            // A process that cannot reach Argo CD leaves the duties to one that can.
            if duty.held() {
                release_duty(&pool, &instance, &holder, &duty).await;
                metrics.duty_held.store(false, Ordering::Relaxed);
            }
            continue;
        }
        metrics.argocd_reachable.store(true, Ordering::Relaxed);
        // The instance is reported live again only after a few answers in a row.
        if !reachable.observe(true) {
            continue;
        }
        match hold_duty(&pool, &instance, &holder, lease, &duty, &metrics).await {
            Ok(true) => {}
            Ok(false) => {
                // Another process has the duties; the database answered, Argo CD too.
                clock.beat();
                refresh_epoch(&pool, &epoch).await;
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, "could not hold the duty lease");
                continue;
            }
        }
        if !reachable.reported_before() {
            match recovered(&pool, &instance).await {
                Ok(due) => tracing::info!(
                    operations = due,
                    "the Argo CD namespace's API answers again; waiting operations made due"
                ),
                Err(error) => tracing::warn!(%error, "could not make waiting operations due"),
            }
        }
        if let Err(error) = heartbeat(&pool, &instance, &metrics, &clock).await {
            tracing::warn!(%error, "heartbeat failed");
        }
        report_adoption_settings(&pool, engine.as_ref(), &instance, &mut reported).await;
        report_version(&pool, engine.as_ref(), &instance, &mut reported_version).await;
        if let Err(error) = crate::fence::clean_up_if_fenced(&pool, engine.as_ref(), &epoch, &metrics).await {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "fenced: clean-up failed; retrying");
        }
        // Argo CD itself: did its application controller refresh the probe since the
        // last look? An unstamped probe counts once (the grace starts when it is made).
        let progressed = match engine.probe_progress().await {
            Ok(ProgressStamp::Unsupported) => true,
            Ok(ProgressStamp::Unstamped) => !std::mem::replace(&mut unstamped_counted, true),
            Ok(ProgressStamp::Stamp(stamp)) => last_stamp.replace(stamp.clone()).as_ref() != Some(&stamp),
            Err(error) => {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "the progress probe failed");
                false
            }
        };
        metrics.argocd_progressing.store(progressed, Ordering::Relaxed);
        // Progress after a stall counts once seen in a few probes in a row.
        if progressing.observe(progressed)
            && let Err(error) = progress(&pool, &instance).await
        {
            tracing::warn!(%error, "could not record Argo CD's progress");
        }
    }
}

/// Records how the instance's Argo CD tracks what it deploys, when it changed (moves
/// between instances that differ are refused).
async fn report_adoption_settings(
    pool: &DbPool,
    engine: &dyn Engine,
    instance: &EngineInstance,
    reported: &mut Option<AdoptionSettings>,
) {
    let settings = match engine.adoption_settings().await {
        Ok(Some(settings)) => settings,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not read Argo CD's tracking settings");
            return;
        }
    };
    if reported.as_ref() == Some(&settings) {
        return;
    }
    let recorded = async {
        let client = pooled(pool).await?;
        gitops_shared::db::engine_instance::engine_instance_adoption_settings(
            &client,
            instance.id,
            &settings.tracking_method,
            &settings.instance_label_key,
            &settings.installation_id,
        )
        .await
    }
    .await;
    match recorded {
        Ok(_) => {
            tracing::info!(tracking = %settings.tracking_method, instance_label = %settings.instance_label_key,
                "Argo CD's tracking settings recorded");
            *reported = Some(settings);
        }
        Err(error) => tracing::warn!(%error, "could not record Argo CD's tracking settings"),
    }
}

/// Records the Argo CD version the instance runs, when it changed (or at start).
async fn report_version(
    pool: &DbPool,
    engine: &dyn Engine,
    instance: &EngineInstance,
    reported: &mut Option<Option<String>>,
) {
    let version = match engine.version().await {
        Ok(version) => version,
        Err(error) => {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not read Argo CD's version");
            return;
        }
    };
    if reported.as_ref() == Some(&version) {
        return;
    }
    let recorded = async {
        let client = pooled(pool).await?;
        gitops_shared::db::engine_instance::engine_instance_version(&client, instance.id, version.as_deref()).await
    }
    .await;
    match recorded {
        Ok(()) => {
            tracing::info!(argocd.version = version.as_deref().unwrap_or("unknown"), "Argo CD's version recorded");
            *reported = Some(version);
        }
        Err(error) => tracing::warn!(%error, "could not record Argo CD's version"),
    }
}

async fn progress(pool: &DbPool, instance: &EngineInstance) -> Result<(), db::DbError> {
    let client = pooled(pool).await?;
    gitops_shared::db::engine_instance::engine_instance_progress(&client, instance.id).await
}

async fn recovered(pool: &DbPool, instance: &EngineInstance) -> Result<u64, db::DbError> {
    let client = pooled(pool).await?;
    gitops_shared::queue::operation_make_due(&client, instance.id).await
}

/// Reads the instance's epoch again when it is not fenced (the duty holder cleans
/// up after a fence; the others only follow the epoch).
async fn refresh_epoch(pool: &DbPool, epoch: &InstanceEpoch) {
    let read = async {
        let client = pooled(pool).await?;
        gitops_shared::db::failover::instance_fenced(&client, epoch.instance).await
    }
    .await;
    match read {
        Ok((false, current)) => epoch.set(current),
        Ok((true, _)) => {}
        Err(error) => tracing::warn!(%error, "could not read the instance's epoch"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_reported_again_only_after_three_probes_in_a_row() {
        let mut probe = Debounce::new(RECOVERY_PROBES);
        assert!(probe.observe(true) && probe.reported_before(), "settled at start");
        assert!(!probe.observe(false));
        assert!(!probe.observe(true) && !probe.observe(true), "two in a row are not enough");
        assert!(!probe.observe(false), "a failure starts over");
        assert!(!probe.observe(true) && !probe.observe(true));
        assert!(probe.observe(true) && !probe.reported_before(), "the third reports, as a recovery");
        assert!(probe.observe(true) && probe.reported_before());
    }
}
