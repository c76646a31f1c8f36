//! The layer's counters, rendered as Prometheus text on `/metrics`: reconciles and
//! failed reconciles per controller, and the webhook's reviews per kind and outcome.

use std::sync::atomic::{AtomicU64, Ordering};

/// The controllers, as the `controller` label names them.
pub const CONTROLLERS: [&str; 7] =
    ["environment", "environment_legacy_owner", "binding", "promotion", "claim", "target", "spacerequest"];

/// The kinds the webhook judges, as the `kind` label names them (and `other`).
pub const ADMISSION_KINDS: [&str; 6] =
    ["Environment", "SnapshotEnvironmentBinding", "Snapshot", "PromotionRun", "DeploymentTarget", "other"];
/// A review's outcomes, as the `outcome` label names them.
pub const ADMISSION_OUTCOMES: [&str; 3] = ["allowed", "denied", "error"];

/// Counters per controller (indexed as [`CONTROLLERS`]), and admission reviews
/// (indexed as [`ADMISSION_KINDS`] × [`ADMISSION_OUTCOMES`]).
#[derive(Debug, Default)]
pub struct Metrics {
    reconciles: [AtomicU64; 7],
    failures: [AtomicU64; 7],
    admission: [[AtomicU64; 3]; 6],
    /// Whether this replica runs the controllers (holds the leader Lease).
    pub leading: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Metrics {
    /// Counts one reconcile of `controller`, failed or not.
    pub fn reconciled(&self, controller: &str, failed: bool) {
        if let Some(index) = CONTROLLERS.iter().position(|c| *c == controller) {
            self.reconciles[index].fetch_add(1, Ordering::Relaxed);
            if failed {
                self.failures[index].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts what one step of `controller`'s stream gave. A trigger for an object
    /// no longer in the controller's store (a deleted child waking its deleted owner,
    /// say) is no reconcile at all, and is not counted.
    pub fn outcome<T, E, Q>(&self, controller: &str, result: &Result<T, kube::runtime::controller::Error<E, Q>>)
    where
        E: std::error::Error + 'static,
        Q: std::error::Error + 'static,
    {
        if !matches!(result, Err(kube::runtime::controller::Error::ObjectNotFound(_))) {
            self.reconciled(controller, result.is_err());
        }
    }

    /// Counts one admission review of `kind` that ended `outcome`.
    pub fn admission_reviewed(&self, kind: &str, outcome: &str) {
        let kind = ADMISSION_KINDS.iter().position(|k| *k == kind).unwrap_or(ADMISSION_KINDS.len() - 1);
        if let Some(outcome) = ADMISSION_OUTCOMES.iter().position(|o| *o == outcome) {
            self.admission[kind][outcome].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP gitops_appstudio_reconciles_total Reconciles run, per controller.\n");
        out.push_str("# TYPE gitops_appstudio_reconciles_total counter\n");
        for (index, controller) in CONTROLLERS.iter().enumerate() {
            let value = self.reconciles[index].load(Ordering::Relaxed);
            out.push_str(&format!("gitops_appstudio_reconciles_total{{controller=\"{controller}\"}} {value}\n"));
        }
        out.push_str("# HELP gitops_appstudio_reconcile_failures_total Reconciles that failed and were retried, per controller.\n");
        out.push_str("# TYPE gitops_appstudio_reconcile_failures_total counter\n");
        for (index, controller) in CONTROLLERS.iter().enumerate() {
            let value = self.failures[index].load(Ordering::Relaxed);
            out.push_str(&format!(
                "gitops_appstudio_reconcile_failures_total{{controller=\"{controller}\"}} {value}\n"
            ));
        }
        out.push_str(
            "# HELP gitops_appstudio_leader 1 while this replica runs the controllers (holds the leader lease).\n",
        );
        out.push_str("# TYPE gitops_appstudio_leader gauge\n");
        out.push_str(&format!("gitops_appstudio_leader {}\n", u8::from(self.leading.load(Ordering::Relaxed))));
        out.push_str("# HELP gitops_appstudio_admission_reviews_total Admission reviews the layer's webhook answered, by kind and outcome.\n");
        out.push_str("# TYPE gitops_appstudio_admission_reviews_total counter\n");
        for (k, kind) in ADMISSION_KINDS.iter().enumerate() {
            for (o, outcome) in ADMISSION_OUTCOMES.iter().enumerate() {
                let value = self.admission[k][o].load(Ordering::Relaxed);
                out.push_str(&format!(
                    "gitops_appstudio_admission_reviews_total{{kind=\"{kind}\",outcome=\"{outcome}\"}} {value}\n"
                ));
            }
        }
        gitops_shared::process::ProcessStats::current().render(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_per_controller() {
        let metrics = Metrics::default();
        metrics.reconciled("binding", false);
        metrics.reconciled("binding", true);
        metrics.reconciled("unknown", true);
        metrics.admission_reviewed("Environment", "denied");
        metrics.admission_reviewed("Unknown", "allowed");
        let text = metrics.render();
        assert!(
            text.contains("gitops_appstudio_admission_reviews_total{kind=\"Environment\",outcome=\"denied\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("gitops_appstudio_admission_reviews_total{kind=\"other\",outcome=\"allowed\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("gitops_appstudio_reconciles_total{controller=\"binding\"} 2\n"), "{text}");
        assert!(text.contains("gitops_appstudio_reconcile_failures_total{controller=\"binding\"} 1\n"), "{text}");
        assert!(text.contains("gitops_appstudio_reconciles_total{controller=\"claim\"} 0\n"), "{text}");
    }
}
