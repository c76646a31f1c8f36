//! One instance's agent metrics (the process's endpoint labels them with the
//! instance, see `crate::registry`), kept in atomics and rendered by hand in the Prometheus text
//! format (a handful of counters and two histograms do not justify a metrics
//! framework). Tests read the same counters directly to wait on events such as a
//! finished sweep instead of on time.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use gitops_shared::exposition::{counter, gauge, header};
use gitops_shared::histogram::Histogram;
use gitops_shared::model::ResourceType;
use gitops_shared::queue::ConsumerStats;

use crate::destination::RefusedKind;

/// Upper bounds (seconds) of the reconcile-duration buckets.
const DURATION_BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Upper bounds (seconds) of the claim-lag buckets.
const LAG_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0];

/// Per resource type: what the handler saw.
#[derive(Debug)]
pub struct TypeMetrics {
    pub resource_type: ResourceType,
    pub claimed: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub duration: Histogram,
}

/// Everything `/metrics` shows.
#[derive(Debug)]
pub struct Metrics {
    pub by_type: Vec<TypeMetrics>,
    pub claim_lag: Histogram,
    /// Waiting operations of the instance at the last sample.
    pub queue_depth: AtomicI64,
    /// Failed operations (dead letters) of the instance at the last sample.
    pub dead_letters: AtomicI64,
    /// Age in transaction ids of the database's oldest xmin holder at the last sample.
    pub xmin_horizon_age_xids: AtomicI64,
    /// Age in seconds of the oldest xmin holder's transaction at the last sample
    /// (0 when not shown: see `queue::horizon`).
    pub xmin_horizon_age_seconds: AtomicI64,
    pub heartbeats: AtomicU64,
    /// Probes of the Argo CD namespace's API (one before each heartbeat).
    pub argocd_probes: AtomicU64,
    /// Whether the Argo CD namespace's API answered the last probe.
    pub argocd_reachable: std::sync::atomic::AtomicBool,
    /// Whether the last progress probe saw Argo CD's controller refresh the probe.
    pub argocd_progressing: std::sync::atomic::AtomicBool,
    pub status_events: AtomicU64,
    pub status_writes: AtomicU64,
    pub status_unmatched: AtomicU64,
    pub sync_progress_writes: AtomicU64,
    pub status_errors: AtomicU64,
    /// Times the Application watch listed everything again (at start, or after its
    /// resourceVersion was too old: 410 Gone).
    pub status_relists: AtomicU64,
    pub sweep_runs: AtomicU64,
    pub sweep_failures: AtomicU64,
    /// Operations enqueued because an owned object had no row (the reconciler deletes).
    pub sweep_deletions_enqueued: AtomicU64,
    /// Deletions refused because a sweep found more than the cap.
    pub sweep_deletions_refused: AtomicU64,
    /// Operations enqueued because a row had no object (or was being deleted).
    pub sweep_restores_enqueued: AtomicU64,
    /// Rows queued because their object drifted (spec hash or generation).
    pub sweep_resyncs_enqueued: AtomicU64,
    /// Tenants this instance let go of for a move (its objects removed, nothing pruned).
    pub tenants_released: AtomicU64,
    /// Tenants this instance took on after a move or a failover.
    pub tenants_adopted: AtomicU64,
    /// Objects of tenants placed elsewhere removed without pruning (sweep and fence).
    pub objects_released: AtomicU64,
    /// What dry-run sweeps would have enqueued.
    pub sweep_dry_run_skipped: AtomicU64,
    /// Set once the first sweep finished (for readiness and tests).
    pub sweep_done_once: AtomicBool,
    /// Whether this process holds the instance's duty lease (sweep, heartbeat).
    pub duty_held: AtomicBool,
    /// Destinations refused on the home cluster, by `RefusedKind` (in `ALL`'s order).
    destinations_refused: [AtomicU64; 3],
    consumer: std::sync::OnceLock<Arc<ConsumerStats>>,
    listen: std::sync::OnceLock<ListenProbe>,
}

/// The LISTEN connection, read when rendering.
struct ListenProbe(gitops_shared::listen::Listener);

impl std::fmt::Debug for ListenProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("connected", &self.0.is_connected()).finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            by_type: ResourceType::KNOWN
                .iter()
                .map(|t| TypeMetrics {
                    resource_type: *t,
                    claimed: AtomicU64::new(0),
                    completed: AtomicU64::new(0),
                    failed: AtomicU64::new(0),
                    duration: Histogram::new(DURATION_BUCKETS),
                })
                .collect(),
            claim_lag: Histogram::new(LAG_BUCKETS),
            queue_depth: AtomicI64::new(0),
            dead_letters: AtomicI64::new(0),
            xmin_horizon_age_xids: AtomicI64::new(0),
            xmin_horizon_age_seconds: AtomicI64::new(0),
            heartbeats: AtomicU64::new(0),
            argocd_reachable: std::sync::atomic::AtomicBool::new(true),
            argocd_progressing: std::sync::atomic::AtomicBool::new(true),
            argocd_probes: AtomicU64::new(0),
            status_events: AtomicU64::new(0),
            status_writes: AtomicU64::new(0),
            status_unmatched: AtomicU64::new(0),
            sync_progress_writes: AtomicU64::new(0),
            status_errors: AtomicU64::new(0),
            status_relists: AtomicU64::new(0),
            sweep_runs: AtomicU64::new(0),
            sweep_failures: AtomicU64::new(0),
            sweep_deletions_enqueued: AtomicU64::new(0),
            sweep_deletions_refused: AtomicU64::new(0),
            sweep_restores_enqueued: AtomicU64::new(0),
            sweep_resyncs_enqueued: AtomicU64::new(0),
            tenants_released: AtomicU64::new(0),
            tenants_adopted: AtomicU64::new(0),
            objects_released: AtomicU64::new(0),
            sweep_dry_run_skipped: AtomicU64::new(0),
            sweep_done_once: AtomicBool::new(false),
            duty_held: AtomicBool::new(false),
            destinations_refused: Default::default(),
            consumer: std::sync::OnceLock::new(),
            listen: std::sync::OnceLock::new(),
        }
    }
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl Metrics {
    /// The counters of `resource_type` (unknown types share the last slot).
    pub fn of(&self, resource_type: ResourceType) -> &TypeMetrics {
        self.by_type.iter().find(|m| m.resource_type == resource_type).unwrap_or_else(|| {
            // `by_type` is built from every known type and is never empty.
            &self.by_type[self.by_type.len() - 1]
        })
    }

    /// How many sweeps have finished (successfully or not).
    pub fn sweeps(&self) -> u64 {
        get(&self.sweep_runs)
    }

    /// Counts one refused destination of `kind`.
    pub fn destination_refused(&self, kind: RefusedKind) {
        self.destinations_refused[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Destinations of `kind` refused so far.
    pub fn destinations_refused(&self, kind: RefusedKind) -> u64 {
        get(&self.destinations_refused[kind as usize])
    }

    /// Shows the counters of the queue consumer (the `gitops_agent_consumer_*` series).
    pub fn attach_consumer(&self, stats: Arc<ConsumerStats>) {
        let _ = self.consumer.set(stats);
    }

    /// Shows the state of the LISTEN connection (the `gitops_agent_listen_*` series).
    pub fn attach_listener(&self, listener: gitops_shared::listen::Listener) {
        let _ = self.listen.set(ListenProbe(listener));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        let per_type: [PerType; 3] = [
            ("gitops_agent_operations_claimed_total", "Operations handed to the reconciler.", |m| get(&m.claimed)),
            ("gitops_agent_operations_completed_total", "Operations the reconciler finished.", |m| get(&m.completed)),
            ("gitops_agent_operations_failed_total", "Operations the reconciler failed (retried or dead).", |m| {
                get(&m.failed)
            }),
        ];
        for (name, help, value) in per_type {
            header(&mut out, name, help, "counter");
            for m in &self.by_type {
                let _ = writeln!(out, "{name}{{resource_type=\"{}\"}} {}", m.resource_type, value(m));
            }
        }
        let name = "gitops_agent_reconcile_duration_seconds";
        header(&mut out, name, "Time one reconcile took.", "histogram");
        for m in &self.by_type {
            m.duration.render(&mut out, name, &format!("resource_type=\"{}\"", m.resource_type));
        }
        let name = "gitops_agent_claim_lag_seconds";
        header(&mut out, name, "Time from an operation's insert to its claim.", "histogram");
        self.claim_lag.render(&mut out, name, "");
        gauge(&mut out, "gitops_agent_queue_depth", "Waiting operations of the instance at the last sample.", {
            self.queue_depth.load(Ordering::Relaxed)
        });
        gauge(&mut out, "gitops_agent_dead_letters", "Failed operations of the instance at the last sample.", {
            self.dead_letters.load(Ordering::Relaxed)
        });
        gauge(
            &mut out,
            "gitops_agent_xmin_horizon_age_xids",
            "Age in transaction ids of the oldest snapshot or transaction holding back cleanup in the database.",
            self.xmin_horizon_age_xids.load(Ordering::Relaxed),
        );
        gauge(
            &mut out,
            "gitops_agent_xmin_horizon_age_seconds",
            "How long the oldest holder of the database's xmin horizon has been in its transaction.",
            self.xmin_horizon_age_seconds.load(Ordering::Relaxed),
        );
        if let Some(stats) = self.consumer.get() {
            let consumer: [(&str, &str, &AtomicU64); 6] = [
                ("gitops_agent_consumer_claimed_total", "Operations claimed from the queue.", &stats.claimed),
                ("gitops_agent_consumer_completed_total", "Completions the queue accepted.", &stats.completed),
                ("gitops_agent_consumer_failed_total", "Failures recorded in the queue.", &stats.failed),
                ("gitops_agent_consumer_lease_lost_total", "Operations whose lease ended first.", &stats.lease_lost),
                ("gitops_agent_consumer_reclaimed_total", "Expired leases taken back.", &stats.reclaimed),
                ("gitops_agent_consumer_scans_total", "Claim statements run.", &stats.scans),
            ];
            for (name, help, value) in consumer {
                counter(&mut out, name, help, get(value));
            }
        }
        if let Some(ListenProbe(listener)) = self.listen.get() {
            counter(&mut out, "gitops_agent_listen_reconnects_total", "LISTEN reconnects.", listener.reconnects());
            gauge(&mut out, "gitops_agent_listen_connected", "1 while the LISTEN connection is up.", {
                i64::from(listener.is_connected())
            });
        }
        gauge(
            &mut out,
            "gitops_agent_argocd_reachable",
            "1 while the Argo CD namespace's API answers the agent.",
            i64::from(self.argocd_reachable.load(Ordering::Relaxed)),
        );
        gauge(
            &mut out,
            "gitops_agent_argocd_progressing",
            "1 while Argo CD's application controller refreshes the service's probe Application.",
            i64::from(self.argocd_progressing.load(Ordering::Relaxed)),
        );
        gauge(
            &mut out,
            "gitops_agent_duty_held",
            "1 while this process holds the instance's duty lease (its sweep, heartbeat and health probe).",
            i64::from(self.duty_held.load(Ordering::Relaxed)),
        );
        let plain: [(&str, &str, &AtomicU64); 17] = [
            ("gitops_agent_heartbeats_total", "Instance heartbeats written.", &self.heartbeats),
            ("gitops_agent_argocd_probes_total", "Probes of the Argo CD namespace's API.", &self.argocd_probes),
            ("gitops_agent_status_events_total", "Application watch events seen.", &self.status_events),
            ("gitops_agent_status_writes_total", "application_state rows written.", &self.status_writes),
            ("gitops_agent_status_unmatched_total", "Owned Applications without a row.", &self.status_unmatched),
            ("gitops_agent_sync_progress_writes_total", "sync_operation rows updated.", &self.sync_progress_writes),
            ("gitops_agent_status_errors_total", "Failed status writes.", &self.status_errors),
            (
                "gitops_agent_status_relists_total",
                "Times the Application watch listed everything again (start, or history gone: 410).",
                &self.status_relists,
            ),
            ("gitops_agent_sweep_runs_total", "Sweeps finished.", &self.sweep_runs),
            ("gitops_agent_sweep_failures_total", "Sweeps that failed.", &self.sweep_failures),
            (
                "gitops_agent_sweep_deletions_enqueued_total",
                "Orphaned objects queued for deletion.",
                &self.sweep_deletions_enqueued,
            ),
            (
                "gitops_agent_sweep_deletions_refused_total",
                "Orphaned objects left because a sweep exceeded the deletion cap.",
                &self.sweep_deletions_refused,
            ),
            (
                "gitops_agent_sweep_restores_enqueued_total",
                "Rows queued because their object was missing.",
                &self.sweep_restores_enqueued,
            ),
            (
                "gitops_agent_sweep_resyncs_enqueued_total",
                "Rows queued because their object no longer matched them (edited, or built from an older row).",
                &self.sweep_resyncs_enqueued,
            ),
            (
                "gitops_agent_tenants_released_total",
                "Tenants let go of for a move to another instance (nothing pruned).",
                &self.tenants_released,
            ),
            (
                "gitops_agent_tenants_adopted_total",
                "Tenants taken on after a move or a failover.",
                &self.tenants_adopted,
            ),
            (
                "gitops_agent_objects_released_total",
                "Objects of tenants placed elsewhere removed without pruning (by the sweep or a lifted fence).",
                &self.objects_released,
            ),
        ];
        for (name, help, value) in plain {
            counter(&mut out, name, help, get(value));
        }
        let name = "gitops_agent_destinations_refused_total";
        header(&mut out, name, "Destinations refused: a reserved or engine namespace of the home cluster.", "counter");
        for kind in RefusedKind::ALL {
            let _ = writeln!(out, "{name}{{kind=\"{}\"}} {}", kind.as_str(), self.destinations_refused(kind));
        }
        counter(
            &mut out,
            "gitops_agent_sweep_dry_run_skipped_total",
            "Operations a dry-run sweep reported instead of enqueueing.",
            get(&self.sweep_dry_run_skipped),
        );
        out
    }
}

/// A per-type counter: name, help and how to read it.
type PerType = (&'static str, &'static str, fn(&TypeMetrics) -> u64);

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn histograms_are_cumulative_and_every_type_is_listed() {
        let metrics = Metrics::default();
        metrics.of(ResourceType::Application).duration.observe(Duration::from_millis(30));
        metrics.of(ResourceType::Application).duration.observe(Duration::from_secs(2));
        metrics.of(ResourceType::Tenant).claimed.fetch_add(3, Ordering::Relaxed);
        let text = metrics.render();
        assert!(text.contains("gitops_agent_operations_claimed_total{resource_type=\"tenant\"} 3"));
        assert!(
            text.contains(
                "gitops_agent_reconcile_duration_seconds_bucket{resource_type=\"application\",le=\"0.05\"} 1"
            )
        );
        assert!(
            text.contains(
                "gitops_agent_reconcile_duration_seconds_bucket{resource_type=\"application\",le=\"+Inf\"} 2"
            )
        );
        assert!(text.contains("gitops_agent_claim_lag_seconds_count 0"));
        assert!(text.contains("gitops_agent_sweep_runs_total 0"));
        metrics.destination_refused(RefusedKind::ClusterSecret);
        let text = metrics.render();
        assert!(text.contains("gitops_agent_destinations_refused_total{kind=\"cluster_secret\"} 1"));
        assert!(text.contains("gitops_agent_destinations_refused_total{kind=\"project_destination\"} 0"));
    }
}
