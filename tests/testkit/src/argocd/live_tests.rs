//! The stand-in against a live API server: installs the CRDs (keeping foreign
//! argoproj.io ones), runs the controller in a random namespace, and checks every
//! behaviour through the API as the agent would see it. The server is the test
//! tier's (`crate::cluster`): the emulator, or the cluster named by
//! `GITOPS_TEST_KUBECONFIG`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::*;

/// How long any one expected state may take to appear.
const DEADLINE: Duration = Duration::from_secs(30);
const REPO: &str = "https://git.example.invalid/team/app";
const SERVER: &str = "https://cluster.example.invalid?env=dev";

#[tokio::test]
async fn standin_against_live_api_server() {
    let path = crate::cluster::TestCluster::get().await.kubeconfig_path().to_owned();
    let client = client_from_kubeconfig(&path).await.expect("client from the test cluster's kubeconfig");
    let outcomes = install_crds(&client, ForeignCrds::Keep, Duration::from_secs(60)).await.expect("install the CRDs");
    assert_eq!(outcomes.len(), 2);
    let namespace = TestNamespace::create(&client, &path).await;
    exercise(client, &namespace.name).await;
}

/// Branch heads through the API: a test's push (a ConfigMap) moves the Applications
/// of that repository and branch, automated ones to a sync at the new commit,
/// manual ones to OutOfSync there; an Application of another branch stays at its
/// made-up commit; deleting the head returns the branch to it.
#[tokio::test]
async fn standin_follows_branch_heads_against_live_api_server() {
    let path = crate::cluster::TestCluster::get().await.kubeconfig_path().to_owned();
    let client = client_from_kubeconfig(&path).await.expect("client from the test cluster's kubeconfig");
    install_crds(&client, ForeignCrds::Keep, Duration::from_secs(60)).await.expect("install the CRDs");
    let namespace = TestNamespace::create(&client, &path).await;
    let ns = namespace.name.as_str();
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &application_resource());
    let projects: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &app_project_resource());
    create(
        &projects,
        json!({"metadata": {"name": "tenant"}, "spec": {
            "sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
        }}),
    )
    .await;
    let (x, y) = ("1111111111111111111111111111111111111111", "2222222222222222222222222222222222222222");
    // The repository as the test's pusher spells it: the stand-in compares it normalised.
    let pushed_as = "https://git.example.invalid/Team/App.git";
    push_head(&client, ns, pushed_as, "main", x).await.expect("push x");
    let cancel = CancellationToken::new();
    let standin = tokio::spawn({
        let (client, namespace, cancel) = (client.clone(), ns.to_owned(), cancel.clone());
        async move { run(client, &namespace, StandinOptions::default(), cancel).await }
    });
    let automated = json!({"spec": {"syncPolicy": {"automated": {}}}});
    create(&apps, app("follows", &[], automated.clone())).await;
    create(&apps, app("manual", &[], json!({"operation": {"sync": {}}}))).await;
    let mut other_branch = automated.clone();
    other_branch["spec"]["source"] = json!({"targetRevision": "v2"});
    create(&apps, app("other-branch", &[], other_branch)).await;

    let at = |revision: &'static str| move |app: &Value| sync_status(app) == "Synced" && sync_revision(app) == revision;
    wait_for(&apps, "follows", "Synced at x", at(x)).await;
    wait_for(&apps, "manual", "Synced at x", at(x)).await;
    let other = wait_for(&apps, "other-branch", "Synced", |app| sync_status(app) == "Synced").await;
    let v2 = fake_revision(REPO, "apps/web", "v2");
    assert_eq!(sync_revision(&other), v2, "another branch keeps its made-up commit");

    push_head(&client, ns, pushed_as, "main", y).await.expect("push y");
    let followed = wait_for(&apps, "follows", "Synced at y", at(y)).await;
    assert_eq!(followed["status"]["operationState"]["operation"]["initiatedBy"]["automated"], true);
    let history: Vec<&str> = followed["status"]["history"]
        .as_array()
        .map(|entries| entries.iter().filter_map(|entry| entry["revision"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(history, [x, y]);
    wait_for(&apps, "manual", "OutOfSync at y", |app| sync_status(app) == "OutOfSync" && sync_revision(app) == y).await;
    merge(&apps, "manual", json!({"operation": {"sync": {}}})).await;
    wait_for(&apps, "manual", "Synced at y after a sync", at(y)).await;
    let other = serde_json::to_value(apps.get("other-branch").await.expect("get")).expect("serialise");
    assert_eq!(sync_revision(&other), v2, "a push to main leaves v2 alone");

    // The head goes: the branch is at its made-up commit again.
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    config_maps.delete(&head_name(pushed_as, "main"), &DeleteParams::default()).await.expect("delete the head");
    let main = fake_revision(REPO, "apps/web", "main");
    wait_for(&apps, "follows", "Synced at the made-up commit", |app| {
        sync_status(app) == "Synced" && sync_revision(app) == main
    })
    .await;

    cancel.cancel();
    let result = tokio::time::timeout(DEADLINE, standin).await.expect("the stand-in stops when cancelled");
    result.expect("the stand-in task").expect("the stand-in ends without error");
}

/// Every behaviour of the stand-in, in `namespace`: the caller installs the CRDs
/// (`install_crds`) and creates the namespace; the stand-in runs inside and is
/// stopped before this returns. For any API server (the emulator tier calls it
/// with its own client).
pub(crate) async fn exercise(client: Client, namespace: &str) {
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &application_resource());
    let projects: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &app_project_resource());
    create(
        &projects,
        json!({
            "metadata": {"name": "tenant"},
            "spec": {
                "sourceRepos": ["https://git.example.invalid/team/*"],
                "destinations": [
                    {"server": SERVER, "namespace": "team-*"},
                    {"server": "https://127.0.0.1:*", "namespace": "team-*"},
                ],
                "clusterResourceWhitelist": [],
            },
        }),
    )
    .await;

    let cancel = CancellationToken::new();
    let standin = tokio::spawn({
        let (client, namespace, cancel) = (client.clone(), namespace.to_owned(), cancel.clone());
        async move { run(client, &namespace, StandinOptions::default(), cancel).await }
    });

    // Every Application at once: the controller works on them concurrently.
    create(&apps, app("ok", &[], json!({}))).await;
    create(
        &apps,
        app("bad-repo", &[], json!({"spec": {"source": {"repoURL": "https://git.example.invalid/other/app"}}})),
    )
    .await;
    create(&apps, app("bad-dest", &[], json!({"spec": {"destination": {"namespace": "kube-system"}}}))).await;
    create(&apps, app("no-project", &[], json!({"spec": {"project": "missing"}}))).await;
    let info = json!([{"name": "sync-run", "value": "run-1"}]);
    let sync = json!({"sync": {"revision": "v2", "prune": true}, "info": info, "initiatedBy": {"username": "gitops"}});
    create(&apps, app("sync", &[], json!({"operation": sync}))).await;
    create(&apps, app("held", &[(SYNC_KNOB, "hold")], json!({"operation": {"sync": {}}}))).await;
    create(&apps, app("released", &[(SYNC_KNOB, "hold")], json!({"operation": {"sync": {}}}))).await;
    create(
        &apps,
        app("failing", &[(SYNC_KNOB, "fail"), (SYNC_MESSAGE_KNOB, "boom")], json!({"operation": {"sync": {}}})),
    )
    .await;
    create(&apps, app("degraded", &[(HEALTH_KNOB, "Degraded")], json!({}))).await;
    create(&apps, app("unreadable", &[(COMPARISON_ERROR_KNOB, "repository not found")], json!({}))).await;
    create(&apps, app("automated", &[], json!({"spec": {"syncPolicy": {"automated": {"prune": true}}}}))).await;
    // Destinations that do not answer: one off loopback (the knob), one on a
    // loopback port where nothing listens (probed).
    create(&apps, app("cluster-away", &[(DESTINATION_KNOB, "unreachable")], json!({}))).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address");
    let closed_server = format!("https://{closed}");
    create(&apps, app("cluster-down", &[], json!({"spec": {"destination": {"server": closed_server}}}))).await;
    create(
        &apps,
        app("deleted", &[], json!({"metadata": {"finalizers": [RESOURCES_FINALIZER, "example.invalid/keep"]}})),
    )
    .await;
    create(
        &apps,
        app("hanging", &[(FINALIZER_KNOB, "hang")], json!({"metadata": {"finalizers": [RESOURCES_FINALIZER]}})),
    )
    .await;

    // An allowed manual Application never synced: OutOfSync (nothing deployed yet)
    // and Healthy, status on the main resource.
    let ok = wait_for(&apps, "ok", "OutOfSync and Healthy", |app| {
        sync_status(app) == "OutOfSync" && health(app) == "Healthy"
    })
    .await;
    assert_eq!(ok["status"]["sync"]["revision"], fake_revision(REPO, "apps/web", "main").as_str());
    assert_eq!(ok["status"]["resources"][0]["kind"], "Deployment");
    assert_eq!(ok["status"]["resources"][0]["name"], "web");
    assert!(ok["status"]["reconciledAt"].is_string());
    assert!(ok["status"].get("conditions").is_none());
    assert!(ok["metadata"]["generation"].as_i64().unwrap_or(0) >= 2, "status writes bump generation: {ok:#}");

    // The project refuses: Argo CD's condition, Unknown.
    let refused =
        wait_for(&apps, "bad-repo", "InvalidSpecError", |app| condition(app, INVALID_SPEC_ERROR).is_some()).await;
    assert_eq!(
        condition(&refused, INVALID_SPEC_ERROR).unwrap(),
        "application repo https://git.example.invalid/other/app is not permitted in project 'tenant'"
    );
    assert_eq!(sync_status(&refused), "Unknown");
    let refused =
        wait_for(&apps, "bad-dest", "InvalidSpecError", |app| condition(app, INVALID_SPEC_ERROR).is_some()).await;
    assert_eq!(
        condition(&refused, INVALID_SPEC_ERROR).unwrap(),
        format!(
            "application destination server '{SERVER}' and namespace 'kube-system' do not match any of the allowed destinations in project 'tenant'"
        )
    );
    let missing =
        wait_for(&apps, "no-project", "InvalidSpecError", |app| condition(app, INVALID_SPEC_ERROR).is_some()).await;
    assert_eq!(
        condition(&missing, INVALID_SPEC_ERROR).unwrap(),
        "Application referencing project missing which does not exist"
    );
    // Changing the project re-checks its Applications.
    merge(&projects, "tenant", json!({"spec": {"sourceRepos": ["https://git.example.invalid/*"]}})).await;
    let allowed =
        wait_for(&apps, "bad-repo", "OutOfSync after the project allowed it", |app| sync_status(app) == "OutOfSync")
            .await;
    assert!(allowed["status"].get("conditions").is_none());

    // An automated sync that fails is retried as the Application asks (twice, after
    // 1 s and 2 s), then fails for good with Argo CD's SyncError. Created here, so the
    // watch below is open before its first retry (the whole sequence takes seconds).
    let retry = json!({"limit": 2, "backoff": {"duration": "1s", "factor": 2, "maxDuration": "2s"}});
    create(
        &apps,
        app(
            "retrying",
            &[(SYNC_KNOB, "fail"), (SYNC_MESSAGE_KNOB, "boom")],
            json!({"spec": {"syncPolicy": {"automated": {"prune": true}, "retry": retry}}}),
        ),
    )
    .await;
    let retried =
        wait_for(&apps, "retrying", "a retry waiting", |app| app["status"]["operationState"]["retryCount"] == 1).await;
    assert_eq!(op_phase(&retried), "Running");
    assert_eq!(retried["status"]["operationState"]["operation"]["retry"]["limit"], 2);
    let given_up = wait_for(&apps, "retrying", "failed for good", |app| op_phase(app) == "Failed").await;
    assert_eq!(given_up["status"]["operationState"]["retryCount"], 2);
    assert_eq!(given_up["status"]["operationState"]["message"], "boom");
    assert!(condition(&given_up, SYNC_ERROR).is_some_and(|m| m.ends_with("boom")), "{given_up:#}");

    // A requested sync: Succeeded at the requested revision, info echoed, operation cleared.
    let synced = wait_for(&apps, "sync", "a succeeded sync", |app| {
        op_phase(app) == "Succeeded" && app.get("operation").is_none()
    })
    .await;
    let revision = fake_revision(REPO, "apps/web", "v2");
    let state = &synced["status"]["operationState"];
    assert_eq!(state["syncResult"]["revision"], revision.as_str());
    assert_eq!(state["message"], SUCCEEDED_MESSAGE);
    assert_eq!(state["operation"]["info"], info);
    assert!(state["startedAt"].is_string() && state["finishedAt"].is_string());
    assert_eq!(synced["status"]["sync"]["status"], "Synced");
    assert_eq!(synced["status"]["sync"]["revision"], revision.as_str());
    assert_eq!(synced["status"]["history"][0]["revision"], revision.as_str());

    // A held sync stays Running until terminated...
    wait_for(&apps, "held", "a running sync", |app| op_phase(app) == "Running").await;
    merge(&apps, "held", json!({"status": {"operationState": {"phase": "Terminating"}}})).await;
    let terminated = wait_for(&apps, "held", "a terminated sync", |app| op_phase(app) == "Failed").await;
    assert_eq!(terminated["status"]["operationState"]["message"], TERMINATED_MESSAGE);
    assert!(terminated.get("operation").is_none());
    // ...or released.
    wait_for(&apps, "released", "a running sync", |app| op_phase(app) == "Running").await;
    merge(&apps, "released", json!({"metadata": {"annotations": {SYNC_KNOB: "release"}}})).await;
    wait_for(&apps, "released", "a released sync", |app| {
        op_phase(app) == "Succeeded" && app.get("operation").is_none()
    })
    .await;

    // The failing knob.
    let failed = wait_for(&apps, "failing", "a failed sync", |app| op_phase(app) == "Failed").await;
    assert_eq!(failed["status"]["operationState"]["message"], "boom");
    assert_eq!(sync_status(&failed), "OutOfSync");
    assert!(failed.get("operation").is_none());

    // Health and comparison knobs.
    let degraded = wait_for(&apps, "degraded", "Degraded", |app| health(app) == "Degraded").await;
    assert!(degraded["status"]["health"]["message"].is_string());
    let unreadable =
        wait_for(&apps, "unreadable", "ComparisonError", |app| condition(app, COMPARISON_ERROR).is_some()).await;
    assert_eq!(condition(&unreadable, COMPARISON_ERROR).unwrap(), "repository not found");
    assert_eq!(sync_status(&unreadable), "Unknown");

    // Destinations that do not answer: Argo CD cannot compare.
    for name in ["cluster-away", "cluster-down"] {
        let away = wait_for(&apps, name, "ComparisonError", |app| condition(app, COMPARISON_ERROR).is_some()).await;
        let message = condition(&away, COMPARISON_ERROR).unwrap();
        assert!(message.starts_with("Failed to load live state: "), "{name}: {message}");
        assert_eq!(sync_status(&away), "Unknown", "{name}");
        assert_eq!(health(&away), "Unknown", "{name}");
    }
    let down = apps.get("cluster-down").await.expect("get");
    let message = down.data.pointer("/status/conditions/0/message").and_then(Value::as_str).unwrap_or_default();
    assert!(message.contains(&closed.to_string()), "{message}");

    // An automated Application syncs itself.
    let automated = wait_for(&apps, "automated", "an automated sync", |app| sync_status(app) == "Synced").await;
    assert_eq!(automated["status"]["operationState"]["phase"], "Succeeded");
    assert_eq!(automated["status"]["operationState"]["operation"]["initiatedBy"]["automated"], true);

    // Refresh: the annotation is consumed.
    merge(&apps, "ok", json!({"metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}}})).await;
    wait_for(&apps, "ok", "the refresh annotation removed", |app| {
        app.pointer(&format!("/metadata/annotations/{}", REFRESH_ANNOTATION.replace('/', "~1"))).is_none()
    })
    .await;

    // Deletion: Argo CD's finalizer goes, others stay (then ours, so the object goes).
    wait_for(&apps, "deleted", "compared before deletion", |app| sync_status(app) == "OutOfSync").await;
    apps.delete("deleted", &DeleteParams::default()).await.expect("delete");
    let deleting = wait_for(&apps, "deleted", "the resources finalizer removed", |app| {
        finalizers(app) == ["example.invalid/keep"]
    })
    .await;
    assert!(deleting["metadata"]["deletionTimestamp"].is_string());
    merge(&apps, "deleted", json!({"metadata": {"finalizers": null}})).await;
    wait_gone(&apps, "deleted").await;

    // A hanging finalizer stays (and says why) until the knob goes.
    wait_for(&apps, "hanging", "compared before deletion", |app| sync_status(app) == "OutOfSync").await;
    apps.delete("hanging", &DeleteParams::default()).await.expect("delete");
    let held = wait_for(&apps, "hanging", "DeletionError", |app| condition(app, DELETION_ERROR).is_some()).await;
    assert!(finalizers(&held).contains(&RESOURCES_FINALIZER.to_owned()));
    merge(&apps, "hanging", json!({"metadata": {"annotations": {FINALIZER_KNOB: null}}})).await;
    wait_gone(&apps, "hanging").await;

    cancel.cancel();
    let result = tokio::time::timeout(DEADLINE, standin).await.expect("the stand-in stops when cancelled");
    result.expect("the stand-in task").expect("the stand-in ends without error");
}

fn app(name: &str, annotations: &[(&str, &str)], extra: Value) -> Value {
    let annotations: serde_json::Map<String, Value> =
        annotations.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    let mut app = json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "project": "tenant",
            "source": {"repoURL": REPO, "path": "apps/web", "targetRevision": "main"},
            "destination": {"server": SERVER, "namespace": "team-a"},
        },
    });
    json_patch::merge(&mut app, &extra);
    app
}

async fn create(api: &Api<DynamicObject>, mut object: Value) {
    let resource =
        if api.resource_url().ends_with("/appprojects") { app_project_resource() } else { application_resource() };
    object["apiVersion"] = json!(resource.api_version);
    object["kind"] = json!(resource.kind);
    let object: DynamicObject = serde_json::from_value(object).expect("a DynamicObject");
    api.create(&PostParams::default(), &object).await.expect("create");
}

async fn merge(api: &Api<DynamicObject>, name: &str, patch: Value) {
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("merge patch");
}

async fn wait_for(api: &Api<DynamicObject>, name: &str, what: &str, condition: impl Fn(&Value) -> bool) -> Value {
    let matches = move |object: Option<&DynamicObject>| {
        object.and_then(|object| serde_json::to_value(object).ok()).is_some_and(|object| condition(&object))
    };
    match tokio::time::timeout(DEADLINE, await_condition(api.clone(), name, matches)).await {
        Ok(Ok(Some(object))) => serde_json::to_value(object).expect("serialise"),
        Ok(Ok(None)) => panic!("{name} disappeared while waiting for {what}"),
        Ok(Err(error)) => panic!("watching {name} for {what}: {error}"),
        Err(_) => {
            let now =
                api.get_opt(name).await.ok().flatten().map(|object| serde_json::to_value(object).unwrap_or_default());
            panic!("{name}: no {what} within {DEADLINE:?}; it is now {now:#?}");
        }
    }
}

async fn wait_gone(api: &Api<DynamicObject>, name: &str) {
    let gone = |object: Option<&DynamicObject>| object.is_none();
    match tokio::time::timeout(DEADLINE, await_condition(api.clone(), name, gone)).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => panic!("watching {name} until gone: {error}"),
        Err(_) => panic!("{name} still exists after {DEADLINE:?}: {:#?}", api.get_opt(name).await),
    }
}

fn sync_status(app: &Value) -> &str {
    str_at(app, "/status/sync/status")
}

fn sync_revision(app: &Value) -> &str {
    str_at(app, "/status/sync/revision")
}

fn health(app: &Value) -> &str {
    str_at(app, "/status/health/status")
}

fn op_phase(app: &Value) -> &str {
    str_at(app, "/status/operationState/phase")
}

fn condition<'a>(app: &'a Value, kind: &str) -> Option<&'a str> {
    app.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| str_at(c, "/type") == kind)
        .map(|c| str_at(c, "/message"))
}

fn finalizers(app: &Value) -> Vec<String> {
    app.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A randomly named namespace, deleted on drop (also when the test panics), with
/// the finalizers of its Applications stripped so it can go.
struct TestNamespace {
    name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    async fn create(client: &Client, kubeconfig: &Path) -> Self {
        let mut random = [0_u8; 4];
        getrandom::fill(&mut random).expect("random bytes");
        let name = format!("standin-{}", random.iter().map(|b| format!("{b:02x}")).collect::<String>());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("a Namespace");
        namespaces.create(&PostParams::default(), &namespace).await.expect("create the test namespace");
        TestNamespace { name, kubeconfig: kubeconfig.to_owned() }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let (name, kubeconfig) = (self.name.clone(), self.kubeconfig.clone());
        // The test's runtime may be unwinding: a short-lived one does the work.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                let Ok(client) = client_from_kubeconfig(&kubeconfig).await else { return };
                let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &name, &application_resource());
                if let Ok(list) = apps.list(&ListParams::default()).await {
                    for app in list.items.iter().filter_map(|app| app.metadata.name.as_deref()) {
                        let strip = json!({"metadata": {"finalizers": null}});
                        let _ = apps.patch(app, &PatchParams::default(), &Patch::Merge(&strip)).await;
                    }
                }
                let namespaces: Api<Namespace> = Api::all(client);
                let _ = namespaces.delete(&name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}
