//! Unit tests of `status::plan`: each scenario applies the planned merge patches
//! as the API server would and re-plans until nothing is left to write, proving
//! both the outcome and that the stand-in reaches a fixed point (no write loop).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;
use crate::argocd::heads::Head;
use crate::argocd::knobs::{COMPARISON_ERROR as COMPARISON_KNOB, HEALTH, SYNC};
use crate::argocd::operation::{RUNNING, SUCCEEDED_MESSAGE, TERMINATING};
use crate::argocd::project::{DestinationRule, NOT_VALID_MESSAGE};
use crate::argocd::revision::fake_revision;

const REPO: &str = "https://git.example.invalid/team/app";
const SERVER: &str = "https://cluster.example.invalid";

fn project() -> ProjectRules {
    ProjectRules {
        source_repos: vec!["https://git.example.invalid/team/*".into()],
        destinations: vec![DestinationRule { server: SERVER.into(), namespace: "team-*".into(), name: String::new() }],
        ..Default::default()
    }
}

fn app(annotations: &[(&str, &str)]) -> Value {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": "web", "namespace": "argocd", "annotations": annotations},
        "spec": {
            "project": "tenant",
            "source": {"repoURL": REPO, "path": "apps/web", "targetRevision": "main"},
            "destination": {"server": SERVER, "namespace": "team-a"},
        },
    })
}

fn annotations_of(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/annotations")
        .and_then(Value::as_object)
        .map(|map| map.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
        .unwrap_or_default()
}

fn plan_at(object: &Value, project: Option<&ProjectRules>, now: Timestamp) -> Plan {
    plan_reaching(object, project, now, None)
}

static NO_HEADS: Heads = Heads::NONE;

fn plan_reaching(object: &Value, project: Option<&ProjectRules>, now: Timestamp, unreachable: Option<&str>) -> Plan {
    plan_with_heads(object, project, now, unreachable, &NO_HEADS)
}

fn plan_with_heads(
    object: &Value,
    project: Option<&ProjectRules>,
    now: Timestamp,
    unreachable: Option<&str>,
    heads: &Heads,
) -> Plan {
    let annotations = annotations_of(object);
    plan(&PlanInput {
        object,
        annotations: &annotations,
        project,
        controller_namespace: "argocd",
        now,
        resync: Duration::from_secs(180),
        destination_error: unreachable,
        source_error: None,
        heads,
    })
}

fn now() -> Timestamp {
    "2030-01-01T00:00:00Z".parse().unwrap()
}

/// Applies plans until none writes; returns the object and the number of writes.
fn converge(object: &mut Value, project: Option<&ProjectRules>) -> usize {
    converge_with_heads(object, project, &NO_HEADS)
}

/// [`converge`] with the branch heads `heads`.
fn converge_with_heads(object: &mut Value, project: Option<&ProjectRules>, heads: &Heads) -> usize {
    for writes in 0..10 {
        match plan_with_heads(object, project, now(), None, heads).patch {
            Some(patch) => json_patch::merge(object, &patch),
            None => return writes,
        }
    }
    panic!("no fixed point after 10 writes: {object:#}");
}

#[test]
fn allowed_manual_application_is_out_of_sync_and_healthy_until_synced() {
    let mut object = app(&[]);
    assert_eq!(converge(&mut object, Some(&project())), 1);
    let status = &object["status"];
    // Never synced: nothing of it is deployed yet.
    assert_eq!(status["sync"]["status"], "OutOfSync");
    assert_eq!(status["sync"]["revision"], fake_revision(REPO, "apps/web", "main").as_str());
    assert_eq!(status["sync"]["comparedTo"]["source"]["path"], "apps/web");
    assert_eq!(status["health"]["status"], "Healthy");
    assert_eq!(status["resources"][0]["name"], "web");
    assert_eq!(status["resources"][0]["namespace"], "team-a");
    assert_eq!(status["reconciledAt"], "2030-01-01T00:00:00Z");
    assert_eq!(status["controllerNamespace"], "argocd");
    assert_eq!(status["sourceType"], "Directory");
    assert!(status.get("conditions").is_none());
}

#[test]
fn missing_or_refusing_project_gives_invalid_spec_error() {
    let mut object = app(&[]);
    assert_eq!(converge(&mut object, None), 1);
    assert_eq!(object["status"]["sync"]["status"], "Unknown");
    assert_eq!(object["status"]["health"]["status"], "Unknown");
    assert_eq!(object["status"]["conditions"][0]["type"], INVALID_SPEC_ERROR);
    assert_eq!(
        object["status"]["conditions"][0]["message"],
        "Application referencing project tenant which does not exist"
    );

    // The project appears: the condition goes, the app is compared.
    assert_eq!(converge(&mut object, Some(&project())), 1);
    assert!(object["status"].get("conditions").is_none());
    assert_eq!(object["status"]["sync"]["status"], "OutOfSync");

    let mut object = app(&[]);
    object["spec"]["source"]["repoURL"] = json!("https://git.example.invalid/other/app");
    converge(&mut object, Some(&project()));
    assert_eq!(
        object["status"]["conditions"][0]["message"],
        "application repo https://git.example.invalid/other/app is not permitted in project 'tenant'"
    );
}

#[test]
fn requested_sync_runs_succeeds_clears_and_records_history() {
    let mut object = app(&[]);
    converge(&mut object, Some(&project()));
    object["operation"] = json!({"sync": {"revision": "v2"}, "info": [{"name": "run", "value": "r1"}], "initiatedBy": {"username": "gitops"}});

    let running = plan_at(&object, Some(&project()), now());
    assert_eq!(running.operation_phase.as_deref(), Some(RUNNING));
    json_patch::merge(&mut object, &running.patch.unwrap());
    assert!(object["operation"].is_object(), "not cleared while running");

    assert_eq!(converge(&mut object, Some(&project())), 1);
    let revision = fake_revision(REPO, "apps/web", "v2");
    let state = &object["status"]["operationState"];
    assert_eq!(state["phase"], "Succeeded");
    assert_eq!(state["message"], SUCCEEDED_MESSAGE);
    assert_eq!(state["syncResult"]["revision"], revision.as_str());
    assert_eq!(state["operation"]["info"][0]["value"], "r1");
    assert!(object.get("operation").is_none());
    assert_eq!(object["status"]["sync"]["status"], "Synced");
    assert_eq!(object["status"]["sync"]["revision"], revision.as_str());
    assert_eq!(object["status"]["history"][0]["id"], 0);
    assert_eq!(object["status"]["history"][0]["initiatedBy"]["username"], "gitops");
}

#[test]
fn held_sync_is_terminated() {
    let mut object = app(&[(SYNC, "hold")]);
    object["operation"] = json!({"sync": {}});
    converge(&mut object, Some(&project()));
    assert_eq!(object["status"]["operationState"]["phase"], RUNNING);
    object["status"]["operationState"]["phase"] = json!(TERMINATING);
    assert_eq!(converge(&mut object, Some(&project())), 1);
    assert_eq!(object["status"]["operationState"]["phase"], "Failed");
    assert_eq!(object["status"]["operationState"]["message"], "Operation terminated");
    assert!(object.get("operation").is_none());
}

#[test]
fn degraded_and_comparison_error_knobs() {
    let mut object = app(&[(HEALTH, "Degraded")]);
    converge(&mut object, Some(&project()));
    assert_eq!(object["status"]["health"]["status"], "Degraded");
    assert_eq!(object["status"]["health"]["message"], "Deployment \"web\" exceeded its progress deadline");
    assert_eq!(object["status"]["resources"][0]["health"]["status"], "Degraded");

    let mut object = app(&[(COMPARISON_KNOB, "repository not found")]);
    converge(&mut object, Some(&project()));
    assert_eq!(object["status"]["sync"]["status"], "Unknown");
    assert_eq!(object["status"]["conditions"][0]["type"], COMPARISON_ERROR);
    assert_eq!(object["status"]["conditions"][0]["message"], "repository not found");
}

#[test]
fn automated_application_syncs_itself_and_fails_once() {
    let mut object = app(&[]);
    object["spec"]["syncPolicy"] = json!({"automated": {"prune": true, "selfHeal": true}});
    assert_eq!(converge(&mut object, Some(&project())), 2);
    assert_eq!(object["status"]["sync"]["status"], "Synced");
    assert_eq!(object["status"]["operationState"]["operation"]["initiatedBy"]["automated"], true);

    let mut failing = app(&[(SYNC, "fail")]);
    failing["spec"]["syncPolicy"] = json!({"automated": {}});
    assert_eq!(converge(&mut failing, Some(&project())), 2);
    assert_eq!(failing["status"]["sync"]["status"], "OutOfSync");
    assert_eq!(failing["status"]["operationState"]["phase"], "Failed");
    assert_eq!(failing["status"]["conditions"][0]["type"], SYNC_ERROR);
}

#[test]
fn refresh_and_resync_update_reconciled_at_only() {
    let mut object = app(&[]);
    converge(&mut object, Some(&project()));
    object["metadata"]["annotations"][REFRESH_ANNOTATION] = json!("normal");
    let later: Timestamp = "2030-01-01T00:01:00Z".parse().unwrap();
    let refresh = plan_at(&object, Some(&project()), later).patch.unwrap();
    assert_eq!(
        refresh,
        json!({"status": {"reconciledAt": "2030-01-01T00:01:00Z"}, "metadata": {"annotations": {REFRESH_ANNOTATION: null}}})
    );
    json_patch::merge(&mut object, &refresh);
    assert_eq!(plan_at(&object, Some(&project()), later).patch, None);
    let stale: Timestamp = "2030-01-01T00:04:00Z".parse().unwrap();
    let plan = plan_at(&object, Some(&project()), stale);
    assert_eq!(plan.patch, Some(json!({"status": {"reconciledAt": "2030-01-01T00:04:00Z"}})));
    assert_eq!(plan.requeue_after, Some(Duration::from_secs(180)));
    assert_eq!(plan_at(&object, Some(&project()), later).requeue_after, Some(Duration::from_secs(180)));
}

#[test]
fn odd_objects_do_not_panic_and_converge() {
    let odd = [
        json!({"metadata": {"name": "x"}}),
        json!({"metadata": {"name": "x"}, "spec": "nonsense", "status": 5, "operation": "sync"}),
        json!({"metadata": {"name": "x"}, "spec": {"source": {"path": 7}}, "status": {"conditions": "x", "health": [], "history": 1}}),
        json!({"metadata": {"name": "x"}, "status": {"operationState": {"phase": RUNNING}}}),
    ];
    for mut object in odd {
        converge(&mut object, Some(&project()));
        converge(&mut object, None);
    }
}

#[test]
fn deletion_held_condition_is_written_once() {
    let mut object = app(&[]);
    let patch = deletion_held_patch(&object, now()).unwrap();
    json_patch::merge(&mut object, &patch);
    assert_eq!(object["status"]["conditions"][0]["type"], DELETION_ERROR);
    assert_eq!(deletion_held_patch(&object, now()), None);
}

#[test]
fn merge_diff_round_trips() {
    let current = json!({"a": 1, "b": {"c": [1, 2], "d": "x"}, "e": true});
    let desired = json!({"a": 1, "b": {"c": [2]}, "g": {"h": 1}});
    let patch = merge_diff(&current, &desired).unwrap();
    assert_eq!(patch, json!({"b": {"c": [2], "d": null}, "e": null, "g": {"h": 1}}));
    let mut applied = current.clone();
    json_patch::merge(&mut applied, &patch);
    assert_eq!(applied, desired);
    assert_eq!(merge_diff(&desired, &desired), None);
}

#[test]
fn unreachable_destination_is_a_comparison_error_until_it_answers() {
    let mut object = app(&[]);
    let cause = "Failed to load live state: dial tcp 127.0.0.1:1: connection refused";
    for _ in 0..10 {
        match plan_reaching(&object, Some(&project()), now(), Some(cause)).patch {
            Some(patch) => json_patch::merge(&mut object, &patch),
            None => break,
        }
    }
    assert!(plan_reaching(&object, Some(&project()), now(), Some(cause)).patch.is_none(), "a fixed point");
    assert_eq!(object["status"]["sync"]["status"], "Unknown");
    assert_eq!(object["status"]["health"]["status"], "Unknown");
    assert_eq!(object["status"]["conditions"][0]["type"], COMPARISON_ERROR);
    assert_eq!(object["status"]["conditions"][0]["message"], cause);
    // A sync requested meanwhile fails, as Argo CD's would.
    object["operation"] = json!({"sync": {}});
    for _ in 0..10 {
        match plan_reaching(&object, Some(&project()), now(), Some(cause)).patch {
            Some(patch) => json_patch::merge(&mut object, &patch),
            None => break,
        }
    }
    assert_eq!(object["status"]["operationState"]["phase"], "Failed");
    // It answers again: the condition goes.
    converge(&mut object, Some(&project()));
    assert!(object["status"].get("conditions").is_none(), "{object:#}");
    assert_eq!(object["status"]["health"]["status"], "Healthy");
    assert_eq!(object["status"]["sync"]["status"], "OutOfSync");
}

#[test]
fn a_cluster_scoped_resource_syncs_only_where_the_project_whitelists_it() {
    let mut object = app(&[]);
    object["spec"]["source"]["path"] = json!("apps/cluster-rbac");
    object["operation"] = json!({"sync": {}});
    let mut refusing = object.clone();
    converge(&mut refusing, Some(&project()));
    let state = &refusing["status"]["operationState"];
    assert_eq!((state["phase"].as_str(), state["message"].as_str()), (Some("Failed"), Some(NOT_VALID_MESSAGE)));
    assert_eq!(
        state["syncResult"]["resources"][0]["message"],
        "resource rbac.authorization.k8s.io:ClusterRole is not permitted in project tenant"
    );
    assert_eq!(refusing["status"]["resources"][0]["kind"], "ClusterRole");
    assert!(refusing["status"]["resources"][0].get("namespace").is_none(), "cluster-scoped");

    let whitelisting = ProjectRules { cluster_resource_whitelist: vec![("*".into(), "*".into())], ..project() };
    converge(&mut object, Some(&whitelisting));
    assert_eq!(object["status"]["operationState"]["phase"], "Succeeded");
    assert_eq!(object["status"]["sync"]["status"], "Synced");
}

fn heads_at(commit: &str) -> Heads {
    Heads::new([Head { url: REPO.into(), branch: "main".into(), commit: commit.into() }])
}

#[test]
fn an_automated_application_follows_its_branch_head() {
    let (x, y) = ("1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222");
    let mut object = app(&[]);
    object["spec"]["syncPolicy"] = json!({"automated": {"prune": true}});
    assert_eq!(converge_with_heads(&mut object, Some(&project()), &heads_at(x)), 2);
    assert_eq!(
        (object["status"]["sync"]["status"].as_str(), object["status"]["sync"]["revision"].as_str()),
        (Some("Synced"), Some(x))
    );

    // A push: OutOfSync at the new head while the controller's sync runs, then Synced there.
    let pushed = heads_at(y);
    let running = plan_with_heads(&object, Some(&project()), now(), None, &pushed);
    assert_eq!((running.sync_status.as_str(), running.operation_phase.as_deref()), ("OutOfSync", Some(RUNNING)));
    json_patch::merge(&mut object, &running.patch.expect("a sync starts"));
    assert_eq!(object["status"]["sync"]["revision"], y, "Argo CD reports the revision it compares with");
    assert_eq!(object["status"]["operationState"]["operation"]["sync"]["revision"], y);
    assert_eq!(converge_with_heads(&mut object, Some(&project()), &pushed), 1);
    assert_eq!(object["status"]["sync"]["status"], "Synced");
    assert_eq!(object["status"]["sync"]["revision"], y);
    assert_eq!(object["status"]["operationState"]["syncResult"]["revision"], y);
    let history: Vec<&str> = object["status"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["revision"].as_str().unwrap())
        .collect();
    assert_eq!(history, [x, y]);

    // The head removed: back at the made-up commit of the branch, as without heads.
    converge(&mut object, Some(&project()));
    assert_eq!(object["status"]["sync"]["revision"], fake_revision(REPO, "apps/web", "main").as_str());
    assert_eq!(object["status"]["sync"]["status"], "Synced");
}

#[test]
fn a_manual_application_goes_out_of_sync_when_its_head_moves() {
    let (x, y) = ("1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222");
    let mut object = app(&[]);
    converge_with_heads(&mut object, Some(&project()), &heads_at(x));
    assert_eq!(object["status"]["sync"]["status"], "OutOfSync", "never synced");
    object["operation"] = json!({"sync": {}});
    converge_with_heads(&mut object, Some(&project()), &heads_at(x));
    assert_eq!(
        (object["status"]["sync"]["status"].as_str(), object["status"]["sync"]["revision"].as_str()),
        (Some("Synced"), Some(x))
    );
    // No sync of its own after a push: OutOfSync at the new head until asked.
    assert_eq!(converge_with_heads(&mut object, Some(&project()), &heads_at(y)), 1);
    assert_eq!(
        (object["status"]["sync"]["status"].as_str(), object["status"]["sync"]["revision"].as_str()),
        (Some("OutOfSync"), Some(y))
    );
    assert_eq!(object["status"]["operationState"]["syncResult"]["revision"], x);
    object["operation"] = json!({"sync": {}});
    converge_with_heads(&mut object, Some(&project()), &heads_at(y));
    assert_eq!(
        (object["status"]["sync"]["status"].as_str(), object["status"]["sync"]["revision"].as_str()),
        (Some("Synced"), Some(y))
    );
}

#[test]
fn a_head_of_another_branch_or_repository_changes_nothing() {
    let mut plain = app(&[]);
    plain["spec"]["syncPolicy"] = json!({"automated": {}});
    let mut headed = plain.clone();
    converge(&mut plain, Some(&project()));
    let elsewhere = Heads::new([
        Head { url: REPO.into(), branch: "v2".into(), commit: "1111111111111111111111111111111111111111".into() },
        Head {
            url: "https://git.example.invalid/team/other".into(),
            branch: "main".into(),
            commit: "2222222222222222222222222222222222222222".into(),
        },
    ]);
    converge_with_heads(&mut headed, Some(&project()), &elsewhere);
    assert_eq!(headed["status"], plain["status"]);
    assert_eq!(plain["status"]["sync"]["revision"], fake_revision(REPO, "apps/web", "main").as_str());
}
