//! The Grafana dashboards in `ops/dashboards/` and the alert rules in `ops/alerts/` stay
//! true to the metrics: every series a panel or a rule queries is one the writer or the
//! agent really renders, and every label a query aggregates by is one those series
//! carry; every rule links to a section of the runbook that exists. Renaming a metric
//! without them fails here instead of leaving an operator looking at an empty panel or
//! an alert that can never fire.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use gitops_agent::metrics::Metrics as AgentMetrics;
use gitops_shared::listen::Listener;
use gitops_shared::queue::ConsumerStats;
use gitops_shared::signal::Signal;
use gitops_testkit::TestDb;
use gitops_writer::metrics::{ObjectRef, WriterMetrics};
use gitops_writer::work_queue::Kind;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::support::DEADLINE;

/// Labels Prometheus adds when it scrapes; queries may group by them.
const TARGET_LABELS: &[&str] = &["instance", "job", "namespace", "pod"];

/// Every dashboard in `ops/dashboards/`: (file name, parsed JSON).
fn dashboards() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/dashboards");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("ops/dashboards exists") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if !name.ends_with(".json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable dashboard");
        let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
        found.push((name, json));
    }
    assert!(!found.is_empty(), "no dashboard in {}", dir.display());
    found
}

/// Every panel of `dashboard`, the panels inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn title(panel: &Value) -> &str {
    panel["title"].as_str().unwrap_or_default()
}

fn is_row(panel: &Value) -> bool {
    panel["type"] == "row"
}

/// The PromQL of every target of `panel`.
fn exprs(panel: &Value) -> Vec<&str> {
    panel["targets"].as_array().into_iter().flatten().filter_map(|t| t["expr"].as_str()).collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The identifiers of `expr` with the byte offset just past each, label values in
/// quotes left out.
fn identifiers(expr: &str) -> Vec<(&str, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    let mut quoted = false;
    for (i, c) in expr.char_indices().chain(std::iter::once((expr.len(), ' '))) {
        if quoted {
            quoted = c != '"';
            continue;
        }
        match (start, is_ident(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push((&expr[s..i], i));
                start = None;
            }
            _ => {}
        }
        quoted = c == '"';
    }
    out
}

/// The metric names `expr` queries: identifiers `gitops_(writer|agent)_…`.
fn metric_names(expr: &str) -> BTreeSet<&str> {
    identifiers(expr)
        .into_iter()
        .map(|(ident, _)| ident)
        .filter(|ident| ident.starts_with("gitops_writer_") || ident.starts_with("gitops_agent_"))
        .collect()
}

/// The labels of every `by (…)` and `without (…)` clause of `expr`.
fn grouping_labels(expr: &str) -> BTreeSet<&str> {
    let mut labels = BTreeSet::new();
    for (ident, end) in identifiers(expr) {
        if ident != "by" && ident != "without" {
            continue;
        }
        let Some(rest) = expr[end..].trim_start().strip_prefix('(') else { continue };
        let list = rest.split_once(')').map_or(rest, |(list, _)| list);
        labels.extend(list.split(',').map(str::trim).filter(|l| !l.is_empty()));
    }
    labels
}

/// Series name → label names, from a Prometheus text exposition.
fn series(exposition: &str, into: &mut BTreeMap<String, BTreeSet<String>>) {
    for line in exposition.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, _value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample without a value: {line}"));
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let labels = labels.trim_end_matches('}').split(',').filter_map(|pair| pair.split_once('=')).map(|(k, _)| k);
        into.entry(name.to_owned()).or_default().extend(labels.map(str::to_owned));
    }
}

/// What the writer and the agent render: every metric family with at least one
/// series. Histograms render their buckets from the start; the validation failures
/// and the agent's consumer and LISTEN series only once there is something to show.
async fn rendered() -> BTreeMap<String, BTreeSet<String>> {
    let mut found = BTreeMap::new();

    let writer = WriterMetrics::default();
    let object = ObjectRef { kind: Kind::Deployment, namespace: "team-a".into(), name: "web".into() };
    writer.validation_failed(object, Some(1), "InvalidPath");
    writer.resync_repaired(Kind::Deployment, "tombstoned", 1);
    writer.resync_refused("too_many_tombstones");
    writer.admission_reviewed("GitOpsDeployment", "denied");
    writer.set_instance_health(BTreeMap::from([("argocd-1".to_owned(), "lost".to_owned())]));
    series(&writer.render(), &mut found);

    let db = TestDb::empty().await;
    let cancel = CancellationToken::new();
    let listener = Listener::start(&db.url(), &[Signal::status()], cancel.clone()).expect("start a listener");
    assert!(listener.wait_connected(DEADLINE).await, "the LISTEN connection came up");
    let agent = AgentMetrics::default();
    agent.attach_consumer(Arc::new(ConsumerStats::default()));
    agent.attach_listener(listener);
    series(&agent.render(), &mut found);
    cancel.cancel();

    let conditional = [
        "gitops_writer_validation_failures_total",
        "gitops_writer_invalid_objects",
        "gitops_writer_resync_repairs_total",
        "gitops_writer_resync_refused_total",
        "gitops_writer_admission_reviews_total",
        "gitops_writer_engine_instance_health",
        "gitops_agent_listen_connected",
        "gitops_agent_consumer_scans_total",
    ];
    for family in conditional {
        assert!(found.contains_key(family), "{family} was not rendered; the test no longer sees every metric");
    }
    found
}

#[test]
fn dashboards_parse_and_every_panel_has_a_title_and_a_query() {
    for (file, dashboard) in dashboards() {
        assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()), "{file}: a dashboard title");
        let variable = dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == "DS_PROMETHEUS")
            .unwrap_or_else(|| panic!("{file}: no DS_PROMETHEUS variable"));
        assert_eq!((&variable["type"], &variable["query"]), (&Value::from("datasource"), &Value::from("prometheus")));

        let all = panels(&dashboard);
        assert!(all.iter().any(|p| !is_row(p)), "{file}: no panels");
        for panel in all {
            assert!(!title(panel).is_empty(), "{file}: a panel without a title: {panel}");
            if is_row(panel) {
                continue;
            }
            let targets = panel["targets"].as_array().map_or(0, Vec::len);
            assert!(targets > 0, "{file}: panel {:?} has no target", title(panel));
            assert_eq!(exprs(panel).len(), targets, "{file}: panel {:?} has a target without expr", title(panel));
            for target in panel["targets"].as_array().into_iter().flatten() {
                assert_eq!(
                    target["datasource"]["uid"],
                    "${DS_PROMETHEUS}",
                    "{file}: panel {:?} does not query the chosen data source",
                    title(panel)
                );
            }
        }
    }
}

#[tokio::test]
async fn dashboards_query_only_metrics_and_labels_that_are_rendered() {
    let rendered = rendered().await;
    for (file, dashboard) in dashboards() {
        for panel in panels(&dashboard) {
            for expr in exprs(panel) {
                let names = metric_names(expr);
                assert!(!names.is_empty(), "{file}: panel {:?} queries no gitops metric: {expr}", title(panel));
                for name in &names {
                    assert!(
                        rendered.contains_key(*name),
                        "{file}: panel {:?} queries {name}, which neither the writer nor the agent renders",
                        title(panel)
                    );
                }
                let carried = names.iter().flat_map(|n| &rendered[*n]).map(String::as_str);
                let available: BTreeSet<&str> = carried.chain(TARGET_LABELS.iter().copied()).collect();
                for label in grouping_labels(expr) {
                    assert!(
                        available.contains(label),
                        "{file}: panel {:?} groups by {label}, which none of {names:?} carries",
                        title(panel)
                    );
                }
            }
        }
    }
}

#[test]
fn expressions_are_read_as_promql() {
    let expr = concat!(
        r#"histogram_quantile(0.99, sum by (le, resource_type) "#,
        r#"(rate(gitops_agent_reconcile_duration_seconds_bucket{x="gitops_writer_no"}[5m])))"#,
    );
    assert_eq!(metric_names(expr).into_iter().collect::<Vec<_>>(), ["gitops_agent_reconcile_duration_seconds_bucket"]);
    assert_eq!(grouping_labels(expr).into_iter().collect::<Vec<_>>(), ["le", "resource_type"]);
    let unspaced = grouping_labels("sum without(kind) (x) / sum by(outcome)(y)");
    assert_eq!(unspaced.into_iter().collect::<Vec<_>>(), ["kind", "outcome"]);
}

/// Every alert rule in `ops/alerts/`: (file, rule).
fn alert_rules() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/alerts");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("ops/alerts exists") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if !name.ends_with(".rules.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("a readable rule file");
        let json: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON-compatible YAML: {e}"));
        for group in json["groups"].as_array().expect("groups") {
            for rule in group["rules"].as_array().expect("rules") {
                found.push((name.clone(), rule.clone()));
            }
        }
    }
    assert!(!found.is_empty(), "no alert rule in {}", dir.display());
    found
}

/// The anchors of the runbook's headings, as Markdown renderers make them.
fn runbook_anchors() -> BTreeSet<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/runbook.md");
    let text = std::fs::read_to_string(path).expect("ops/runbook.md");
    text.lines()
        .filter_map(|line| line.strip_prefix('#').map(|rest| rest.trim_start_matches('#').trim()))
        .map(|heading| {
            heading
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn alert_rules_query_rendered_metrics_and_link_the_runbook() {
    let rendered = rendered().await;
    let anchors = runbook_anchors();
    for (file, rule) in alert_rules() {
        let name = rule["alert"].as_str().unwrap_or_else(|| panic!("{file}: a rule without a name"));
        let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{file}: {name} has no expr"));
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{file}: {name} queries no gitops metric");
        for metric in &names {
            assert!(rendered.contains_key(*metric), "{file}: {name} queries {metric}, which nothing renders");
        }
        let available: BTreeSet<&str> =
            names.iter().flat_map(|n| &rendered[*n]).map(String::as_str).chain(TARGET_LABELS.iter().copied()).collect();
        for label in grouping_labels(expr) {
            assert!(available.contains(label), "{file}: {name} groups by {label}, which none of {names:?} carries");
        }
        let link =
            rule["annotations"]["runbook_url"].as_str().unwrap_or_else(|| panic!("{file}: {name} has no runbook link"));
        let anchor = link.strip_prefix("ops/runbook.md#").unwrap_or_else(|| panic!("{file}: {name} links {link}"));
        assert!(anchors.contains(anchor), "{file}: {name} links #{anchor}, which ops/runbook.md does not have");
        assert!(rule["labels"]["severity"].is_string(), "{file}: {name} has no severity");
    }
}

/// Every promtool unit test file in `ops/alerts/tests/`, parsed (JSON-compatible YAML).
fn alert_tests() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/alerts/tests");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("ops/alerts/tests exists") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        let text = std::fs::read_to_string(&path).expect("a readable test file");
        found.push((name.clone(), serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))));
    }
    found
}

/// Each alert has a promtool unit test with input series in which it fires
/// (`promtool test rules ops/alerts/tests/*.yaml` runs them in `ops/test`), and each
/// test file loads the rule file its alerts come from.
#[test]
fn every_alert_rule_has_a_unit_test_in_which_it_fires() {
    let mut fired = BTreeSet::new();
    for (file, test) in alert_tests() {
        let rule_files: Vec<&str> =
            test["rule_files"].as_array().expect("rule_files").iter().filter_map(Value::as_str).collect();
        for group in test["tests"].as_array().expect("tests") {
            assert!(
                !group["input_series"].as_array().expect("input series").is_empty(),
                "{file}: a test without input"
            );
            for case in group["alert_rule_test"].as_array().into_iter().flatten() {
                if case["exp_alerts"].as_array().is_some_and(|alerts| !alerts.is_empty()) {
                    fired.insert((
                        rule_files.clone().join(","),
                        case["alertname"].as_str().expect("alertname").to_owned(),
                    ));
                }
            }
        }
    }
    for (file, rule) in alert_rules() {
        let name = rule["alert"].as_str().expect("a name");
        assert!(
            fired.iter().any(|(files, alert)| alert == name && files.contains(&format!("../{file}"))),
            "{file}: {name} has no unit test in ops/alerts/tests/ in which it fires"
        );
    }
}

/// The Prometheus Operator component carries the same rules as `ops/alerts/`.
#[test]
fn the_prometheus_rule_component_matches_the_rule_files() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../ops/deploy/components/prometheus-operator/writer/prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).expect("the PrometheusRule");
    let rule: Value = serde_json::from_str(&text).expect("the PrometheusRule is JSON-compatible YAML");
    assert_eq!(rule["kind"], "PrometheusRule");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ops/alerts");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("ops/alerts")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.to_str().is_some_and(|p| p.ends_with(".rules.yaml")))
        .collect();
    files.sort();
    let mut groups = Vec::new();
    for file in files {
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&file).expect("a rule file")).expect("JSON");
        groups.extend(json["groups"].as_array().expect("groups").iter().cloned());
    }
    assert_eq!(
        rule["spec"]["groups"],
        Value::Array(groups),
        "the PrometheusRule is out of date: run ops/alerts/render-prometheusrule"
    );
}
