//! The writer's metrics, kept in atomics and rendered by hand in the Prometheus text
//! format, as the agent does: a few counters and gauges do not justify a metrics
//! framework. Tests read the same counters to wait on events instead of on time.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Counters and gauges of one writer.
#[derive(Debug, Default)]
pub struct WriterMetrics {
    /// Reconciles that finished, by outcome.
    pub reconciles_ok: AtomicU64,
    pub reconciles_invalid: AtomicU64,
    pub reconciles_failed: AtomicU64,
    /// Objects waiting in the work queue.
    pub queue_depth: AtomicU64,
    /// Shards this writer holds a lease on.
    pub shards_owned: AtomicU64,
    /// Whether the watchers have listed their resources once.
    pub ready: AtomicBool,
}

impl WriterMetrics {
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP gitops_writer_reconciles_total Reconciles of tenant resources, by outcome.");
        let _ = writeln!(out, "# TYPE gitops_writer_reconciles_total counter");
        for (outcome, counter) in [
            ("ok", &self.reconciles_ok),
            ("invalid", &self.reconciles_invalid),
            ("failed", &self.reconciles_failed),
        ] {
            let _ = writeln!(
                out,
                "gitops_writer_reconciles_total{{outcome=\"{outcome}\"}} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(out, "# HELP gitops_writer_queue_depth Objects waiting in the work queue.");
        let _ = writeln!(out, "# TYPE gitops_writer_queue_depth gauge");
        let _ = writeln!(out, "gitops_writer_queue_depth {}", self.queue_depth.load(Ordering::Relaxed));
        let _ = writeln!(out, "# HELP gitops_writer_shards_owned Shards this writer holds a lease on.");
        let _ = writeln!(out, "# TYPE gitops_writer_shards_owned gauge");
        let _ = writeln!(out, "gitops_writer_shards_owned {}", self.shards_owned.load(Ordering::Relaxed));
        let _ = writeln!(out, "# HELP gitops_writer_ready Whether the writer's watchers have synced.");
        let _ = writeln!(out, "# TYPE gitops_writer_ready gauge");
        let _ = writeln!(out, "gitops_writer_ready {}", u8::from(self.is_ready()));
        out
    }
}
