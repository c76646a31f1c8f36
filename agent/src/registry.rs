//! The instances one agent process serves, as its single HTTP endpoint sees them:
//! `/metrics` shows every instance's series with an `instance` label (one metric
//! family each, whatever the number of instances), `/readyz` says which instance
//! is not ready. An instance joins when the process starts serving it and leaves
//! when it is dropped (deregistered, or moved to another host cluster).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use gitops_shared::db::DbPool;
use gitops_shared::listen::Listener;
use gitops_shared::serve::{HealthEndpoints, database_reachable};

use crate::metrics::Metrics;

/// One instance's metrics and, while it is served, its LISTEN connection.
#[derive(Default)]
struct Entry {
    metrics: Arc<Metrics>,
    listener: Option<Listener>,
}

/// The instances of one process (shared by the serving tasks and the endpoint).
#[derive(Default)]
pub struct Registry {
    entries: Mutex<BTreeMap<String, Entry>>,
    /// Instances the process must serve to be ready (those named with `--instance`).
    expected: Mutex<BTreeSet<String>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("instances", &self.names()).finish_non_exhaustive()
    }
}

impl Registry {
    /// The metrics of instance `name` (made on first use, so a caller may hold
    /// them before the instance is served).
    pub fn metrics(&self, name: &str) -> Arc<Metrics> {
        let Ok(mut entries) = self.entries.lock() else {
            return Arc::default();
        };
        entries.entry(name.to_owned()).or_default().metrics.clone()
    }

    /// The instances this process serves now.
    pub fn names(&self) -> Vec<String> {
        self.entries
            .lock()
            .map(|entries| {
                entries.iter().filter(|(_, entry)| entry.listener.is_some()).map(|(name, _)| name.clone()).collect()
            })
            .unwrap_or_default()
    }

    pub(crate) fn expect(&self, names: impl IntoIterator<Item = String>) {
        if let Ok(mut expected) = self.expected.lock() {
            expected.extend(names);
        }
    }

    pub(crate) fn serving(&self, name: &str, listener: Listener) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.entry(name.to_owned()).or_default().listener = Some(listener);
        }
    }

    /// The instance is no longer served: its series leave `/metrics` (its counters
    /// are kept for when it is served again).
    pub(crate) fn stopped(&self, name: &str) {
        if let Ok(mut entries) = self.entries.lock()
            && let Some(entry) = entries.get_mut(name)
        {
            entry.listener = None;
        }
    }

    /// The Prometheus text of every served instance, each series labelled with its
    /// instance, plus the process's own series.
    pub fn render(&self) -> String {
        let served: Vec<(String, Arc<Metrics>)> = self
            .entries
            .lock()
            .map(|entries| {
                entries
                    .iter()
                    .filter(|(_, entry)| entry.listener.is_some())
                    .map(|(name, entry)| (name.clone(), entry.metrics.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let mut families = Families::default();
        for (name, metrics) in &served {
            families.add(&metrics.render(), &format!("instance=\"{name}\""));
        }
        let mut out = families.text();
        let name = "gitops_agent_instances_served";
        let _ = writeln!(out, "# HELP {name} Engine instances this process serves.");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name} {}", served.len());
        let name = "gitops_agent_unclassified_errors_total";
        let _ = writeln!(out, "# HELP {name} Argo CD errors no class was found for (retried as transient).");
        let _ = writeln!(out, "# TYPE {name} counter");
        let _ = writeln!(out, "{name} {}", crate::engine::argocd::UNCLASSIFIED_ERRORS.load(Ordering::Relaxed));
        gitops_shared::process::ProcessStats::current().render(&mut out);
        out
    }

    /// What is not ready: an expected instance not served, a LISTEN connection
    /// down, or no served instance's Argo CD answering (one unreachable instance
    /// among others leaves the process ready: the others are served).
    fn not_ready(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let (Ok(entries), Ok(expected)) = (self.entries.lock(), self.expected.lock()) else {
            return vec!["registry=poisoned".to_owned()];
        };
        for name in expected.iter() {
            if entries.get(name).is_none_or(|entry| entry.listener.is_none()) {
                problems.push(format!("{name}.served=false"));
            }
        }
        let mut reachable = Vec::new();
        for (name, entry) in entries.iter() {
            let Some(listener) = &entry.listener else { continue };
            if !listener.is_connected() {
                problems.push(format!("{name}.listen_connected=false"));
            }
            let answers = entry.metrics.argocd_reachable.load(Ordering::Relaxed);
            if !answers {
                problems.push(format!("{name}.argocd_reachable=false"));
            }
            reachable.push(answers);
        }
        if !reachable.is_empty() && !reachable.iter().any(|r| *r) {
            problems.push("argocd_reachable=false".to_owned());
        } else {
            // Single unreachable instances are reported by their metrics, not here.
            problems.retain(|p| !p.ends_with(".argocd_reachable=false"));
        }
        problems
    }
}

/// Metric families in their first order, their samples gathered from every
/// instance (the text format wants a family's samples together, under one header).
#[derive(Default)]
struct Families {
    order: Vec<String>,
    by_name: BTreeMap<String, (Vec<String>, Vec<String>)>,
}

impl Families {
    fn add(&mut self, text: &str, label: &str) {
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# ") {
                let name = rest.split_whitespace().nth(1).unwrap_or_default().to_owned();
                if !self.by_name.contains_key(&name) {
                    self.order.push(name.clone());
                }
                let family = self.by_name.entry(name.clone()).or_default();
                if !family.0.iter().any(|h| h == line) {
                    family.0.push(line.to_owned());
                }
                current = name;
            } else if !line.is_empty() {
                let family = self.by_name.entry(current.clone()).or_default();
                family.1.push(with_label(line, label));
            }
        }
    }

    fn text(&self) -> String {
        let mut out = String::with_capacity(16 * 1024);
        for name in &self.order {
            if let Some((headers, samples)) = self.by_name.get(name) {
                for line in headers.iter().chain(samples) {
                    let _ = writeln!(out, "{line}");
                }
            }
        }
        out
    }
}

/// `name{a="b"} 1` → `name{<label>,a="b"} 1`; `name 1` → `name{<label>} 1`.
fn with_label(sample: &str, label: &str) -> String {
    let name_end = sample.find([' ', '{']).unwrap_or(sample.len());
    let (name, rest) = sample.split_at(name_end);
    match rest.strip_prefix('{') {
        Some(labels) if labels.starts_with('}') => format!("{name}{{{label}{labels}"),
        Some(labels) => format!("{name}{{{label},{labels}"),
        None => format!("{name}{{{label}}}{rest}"),
    }
}

/// What the process's endpoint reads.
#[derive(Clone)]
pub struct Endpoints {
    pub registry: Arc<Registry>,
    pub pool: DbPool,
}

impl HealthEndpoints for Endpoints {
    fn metrics(&self) -> String {
        self.registry.render()
    }

    async fn readiness(&self) -> Result<(), String> {
        let mut problems = self.registry.not_ready();
        if !database_reachable(&self.pool).await {
            problems.push("database_reachable=false".to_owned());
        }
        if problems.is_empty() { Ok(()) } else { Err(problems.join(" ")) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_get_the_instance_label_and_families_stay_together() {
        assert_eq!(with_label("a_total 3", "instance=\"x\""), "a_total{instance=\"x\"} 3");
        assert_eq!(with_label("a{kind=\"k\"} 3", "instance=\"x\""), "a{instance=\"x\",kind=\"k\"} 3");
        let mut families = Families::default();
        families
            .add("# HELP a A.\n# TYPE a counter\na 1\n# HELP b B.\n# TYPE b gauge\nb{k=\"v\"} 2\n", "instance=\"i1\"");
        families
            .add("# HELP a A.\n# TYPE a counter\na 5\n# HELP b B.\n# TYPE b gauge\nb{k=\"v\"} 6\n", "instance=\"i2\"");
        assert_eq!(
            families.text(),
            "# HELP a A.\n# TYPE a counter\na{instance=\"i1\"} 1\na{instance=\"i2\"} 5\n\
             # HELP b B.\n# TYPE b gauge\nb{instance=\"i1\",k=\"v\"} 2\nb{instance=\"i2\",k=\"v\"} 6\n"
        );
    }

    #[test]
    fn a_named_instance_not_served_yet_is_not_ready_and_not_shown() {
        let registry = Registry::default();
        registry.expect(["a".to_owned()]);
        assert_eq!(registry.not_ready(), ["a.served=false"]);
        let metrics = registry.metrics("a");
        assert!(Arc::ptr_eq(&metrics, &registry.metrics("a")), "one set of counters per instance");
        assert!(registry.names().is_empty(), "not served yet");
        assert!(!registry.render().contains("instance=\"a\""), "its series show once it is served");
        assert!(registry.render().contains("gitops_agent_instances_served 0"));
    }
}
