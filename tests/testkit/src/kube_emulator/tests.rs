//! In-process tests of the emulator through kube's real client: each starts an
//! emulator, talks to it with `kube::Api`, and checks what a real API server
//! would answer. The cross-tier conformance suite lives in tests/integration.

use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use serde_json::{Value, json};

use super::{EmulatorOptions, KubeEmulator};

async fn emulator() -> KubeEmulator {
    KubeEmulator::start(EmulatorOptions::default()).await.expect("start the emulator")
}

/// (code, reason, message) of an API error.
fn status<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone(), status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn config_map(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
        .expect("config map")
}

/// Polls `check` until it holds, for at most five seconds.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn crud_conflicts_and_selectors() {
    let emulator = emulator().await;
    let client = emulator.client().await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = maps.create(&PostParams::default(), &config_map("a", json!({"app": "web"}))).await.expect("create");
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some() && meta.resource_version.is_some());
    assert_eq!(meta.generation, None, "ConfigMaps have no generation");

    let (code, reason, message) = status(maps.create(&PostParams::default(), &config_map("a", json!({}))).await);
    assert_eq!((code, reason.as_str(), message.as_str()), (409, "AlreadyExists", "configmaps \"a\" already exists"));
    let (code, reason, _) = status(maps.get("missing").await);
    assert_eq!((code, reason.as_str()), (404, "NotFound"));

    let mut stale = created.clone();
    let mut fresh = created.clone();
    fresh.data = Some([("k".to_owned(), "w".to_owned())].into());
    maps.replace("a", &PostParams::default(), &fresh).await.expect("update");
    stale.data = Some([("k".to_owned(), "x".to_owned())].into());
    let (code, reason, _) = status(maps.replace("a", &PostParams::default(), &stale).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));

    maps.create(&PostParams::default(), &config_map("b", json!({"app": "db", "tier": "back"}))).await.expect("b");
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("generated");
    let generated = maps.create(&PostParams::default(), &generated).await.expect("generateName");
    assert!(generated.metadata.name.as_deref().is_some_and(|n| n.starts_with("gen-") && n.len() == 9));

    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items.into_iter().filter_map(|c| c.metadata.name).collect()
    };
    let selected = maps.list(&ListParams::default().labels("app in (web,db),tier!=front")).await.expect("list");
    assert_eq!(names(selected), ["a", "b"]);
    let by_field = maps.list(&ListParams::default().fields("metadata.name=b")).await.expect("list");
    assert_eq!(names(by_field), ["b"]);
    let first = maps.list(&ListParams::default().limit(2)).await.expect("page 1");
    let token = first.metadata.continue_.clone().expect("a continue token");
    let second = maps.list(&ListParams::default().limit(2).continue_token(&token)).await.expect("page 2");
    assert_eq!(first.items.len() + second.items.len(), 3);
    assert_eq!(second.metadata.continue_.as_deref().unwrap_or(""), "");

    let all: Api<ConfigMap> = Api::all(client.clone());
    assert_eq!(all.list(&ListParams::default()).await.expect("all namespaces").items.len(), 3);
    let deleted = maps.delete("a", &DeleteParams::default()).await.expect("delete");
    assert!(deleted.is_right(), "a ConfigMap without finalizers is answered with a Status");
}

/// Lists by `key=value` start from the label index: what they answer must be what
/// a walk over every object answers, through relabels, deletions, namespaces and
/// pages over one snapshot.
#[tokio::test]
async fn label_selected_lists_follow_relabels_deletions_and_snapshots() {
    let emulator = emulator().await;
    let client = emulator.client().await;
    for ns in ["team-a", "team-b"] {
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
    }
    let a: Api<ConfigMap> = Api::namespaced(client.clone(), "team-a");
    let b: Api<ConfigMap> = Api::namespaced(client.clone(), "team-b");
    for i in 0..6 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        let labels = json!({"owner": "svc", "tier": tier});
        a.create(&PostParams::default(), &config_map(&format!("m{i}"), labels.clone())).await.expect("create");
        b.create(&PostParams::default(), &config_map(&format!("m{i}"), labels)).await.expect("create");
    }
    let names = |list: kube::core::ObjectList<ConfigMap>| -> Vec<String> {
        list.items
            .into_iter()
            .map(|c| format!("{}/{}", c.metadata.namespace.unwrap_or_default(), c.metadata.name.unwrap_or_default()))
            .collect()
    };
    let all: Api<ConfigMap> = Api::all(client.clone());
    let even = all.list(&ListParams::default().labels("owner=svc,tier==even")).await.expect("list");
    assert_eq!(names(even), ["team-a/m0", "team-a/m2", "team-a/m4", "team-b/m0", "team-b/m2", "team-b/m4"]);
    let in_one = a.list(&ListParams::default().labels("tier in (odd),owner=svc")).await.expect("list");
    assert_eq!(names(in_one), ["team-a/m1", "team-a/m3", "team-a/m5"]);
    assert!(all.list(&ListParams::default().labels("tier=none")).await.expect("list").items.is_empty());

    // A page of the even ones, then m2 turns odd, m4 is deleted and m6 is created even:
    // the later pages still show the first page's snapshot.
    let first = all.list(&ListParams::default().labels("tier=even").limit(2)).await.expect("page 1");
    let token = first.metadata.continue_.clone().expect("a continue token");
    let relabel = json!({"metadata": {"labels": {"tier": "odd"}}});
    a.patch("m2", &PatchParams::default(), &Patch::Merge(&relabel)).await.expect("relabel");
    b.patch("m2", &PatchParams::default(), &Patch::Merge(&relabel)).await.expect("relabel");
    b.delete("m4", &DeleteParams::default()).await.expect("delete");
    let into = json!({"metadata": {"labels": {"tier": "even"}}});
    b.patch("m1", &PatchParams::default(), &Patch::Merge(&into)).await.expect("relabel into the selector");
    a.create(&PostParams::default(), &config_map("m6", json!({"owner": "svc", "tier": "even"}))).await.expect("m6");
    let mut snapshot = names(first);
    let mut token = Some(token);
    while let Some(next) = token.take() {
        let page = all.list(&ListParams::default().labels("tier=even").limit(2).continue_token(&next)).await;
        let page = page.expect("next page");
        token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        snapshot.extend(names(page));
    }
    assert_eq!(snapshot, ["team-a/m0", "team-a/m2", "team-a/m4", "team-b/m0", "team-b/m2", "team-b/m4"]);

    // A fresh list sees the changes, as a selector no index serves (every object walked) does.
    let now = all.list(&ListParams::default().labels("owner=svc,tier=even")).await.expect("list");
    let walked = all.list(&ListParams::default().labels("tier in (even,none)")).await.expect("list");
    assert_eq!(names(now), ["team-a/m0", "team-a/m4", "team-a/m6", "team-b/m0", "team-b/m1"]);
    assert_eq!(names(walked), ["team-a/m0", "team-a/m4", "team-a/m6", "team-b/m0", "team-b/m1"]);
    let odd = b.list(&ListParams::default().labels("tier=odd")).await.expect("list");
    assert_eq!(names(odd), ["team-b/m2", "team-b/m3", "team-b/m5"]);
    let dropped = json!({"metadata": {"labels": {"tier": null}}});
    a.patch("m0", &PatchParams::default(), &Patch::Merge(&dropped)).await.expect("drop a label");
    let now = a.list(&ListParams::default().labels("tier=even")).await.expect("list");
    assert_eq!(names(now), ["team-a/m4", "team-a/m6"]);
}

#[tokio::test]
async fn secrets_fold_string_data() {
    let emulator = emulator().await;
    let secrets: Api<Secret> = Api::namespaced(emulator.client().await, "default");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"user": "me"}})).expect("secret");
    let stored = secrets.create(&PostParams::default(), &secret).await.expect("create");
    assert_eq!(stored.type_.as_deref(), Some("Opaque"));
    assert_eq!(stored.data.expect("data")["user"].0, b"me");
    assert!(stored.string_data.is_none());
}

#[tokio::test]
async fn watch_replays_resumes_and_reports_expired() {
    let emulator = emulator().await;
    let maps: Api<ConfigMap> = Api::namespaced(emulator.client().await, "default");
    let first = maps.create(&PostParams::default(), &config_map("w1", json!({"w": "1"}))).await.expect("create");
    let rv = first.metadata.resource_version.clone().expect("rv");
    maps.create(&PostParams::default(), &config_map("w2", json!({"w": "1"}))).await.expect("create");
    maps.delete("w1", &DeleteParams::default()).await.expect("delete");

    let params = WatchParams::default().labels("w=1").timeout(2).disable_bookmarks();
    let events: Vec<WatchEvent<ConfigMap>> =
        maps.watch(&params, &rv).await.expect("watch").try_collect().await.expect("events");
    let kinds: Vec<String> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(c) => format!("ADDED {}", c.metadata.name.as_deref().unwrap_or("")),
            WatchEvent::Deleted(c) => format!("DELETED {}", c.metadata.name.as_deref().unwrap_or("")),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["ADDED w2", "DELETED w1"]);

    // Bookmarks when asked for.
    let params = WatchParams::default().timeout(3);
    let mut stream = maps.watch(&params, "0").await.expect("watch").boxed();
    let mut saw_bookmark = false;
    while let Some(event) = stream.try_next().await.expect("event") {
        if matches!(event, WatchEvent::Bookmark(_)) {
            saw_bookmark = true;
            break;
        }
    }
    assert!(saw_bookmark);

    // A resourceVersion older than the watch window: ERROR event with 410 Expired;
    // a `continue` token older than the list window: 410 too. Both are counted.
    maps.create(&PostParams::default(), &config_map("w3", json!({}))).await.expect("create");
    let page = maps.list(&ListParams::default().limit(1)).await.expect("page 1");
    let token = page.metadata.continue_.clone().expect("a continue token");
    assert_eq!(emulator.expired_answers(), super::ExpiredAnswers::default());
    {
        let mut state = super::router::lock(&emulator.state);
        state.set_history(super::HistoryWindows {
            watch_age: std::time::Duration::ZERO,
            watch_events: 100,
            list_age: std::time::Duration::ZERO,
        });
        for i in 0..200 {
            let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("bulk{}", i % 10), "namespace": "default"}});
            state.put("/configmaps", "default", object);
        }
    }
    let mut stream = maps.watch(&WatchParams::default(), &rv).await.expect("watch").boxed();
    match stream.try_next().await.expect("event") {
        Some(WatchEvent::Error(error)) => assert_eq!((error.code, error.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    match maps.list(&ListParams::default().limit(1).continue_token(&token)).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 410),
        other => panic!("expected 410 Expired, got {other:?}"),
    }
    assert_eq!(emulator.expired_answers(), super::ExpiredAnswers { watches: 1, lists: 1 });
}

fn widget_crd(status_subresource: bool) -> CustomResourceDefinition {
    let mut version = json!({
        "name": "v1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer"},
                "color": {"type": "string", "enum": ["red", "blue"]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }},
            "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
        }}}
    });
    if status_subresource {
        version["subresources"] = json!({"status": {}});
    }
    serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
                 "versions": [version]}
    }))
    .expect("crd")
}

fn widget_resource() -> ApiResource {
    ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}),
    )
    .expect("widget")
}

#[tokio::test]
async fn custom_resources_follow_their_schema_and_status_rules() {
    let emulator = emulator().await;
    let client = emulator.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.create(&PostParams::default(), &widget_crd(true)).await.expect("create crd");
    let conditions = crd.status.and_then(|s| s.conditions).expect("conditions");
    assert!(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"));

    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &widget_resource());
    let mut object = widget("w", json!({"size": 1, "junk": true, "free": {"any": {"x": 1}}}));
    object.data["status"] = json!({"phase": "ignored on create"});
    let created = widgets.create(&PostParams::default(), &object).await.expect("create widget");
    assert_eq!(created.data["spec"], json!({"size": 1, "free": {"any": {"x": 1}}}), "unknown fields are pruned");
    assert_eq!(created.data.get("status"), None);
    assert_eq!(created.metadata.generation, Some(1));

    let (code, reason, message) =
        status(widgets.create(&PostParams::default(), &widget("bad", json!({"size": "x", "color": "green"}))).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert_eq!(
        message,
        "Widget.example.com \"bad\" is invalid: [spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\", spec.color: Unsupported value: \"green\": supported values: \"red\", \"blue\"]"
    );

    let status_patch = Patch::Merge(json!({"status": {"phase": "Ready"}, "spec": {"size": 9}}));
    let patched = widgets.patch_status("w", &PatchParams::default(), &status_patch).await.expect("status");
    assert_eq!(patched.data["status"]["phase"], "Ready");
    assert_eq!(patched.data["spec"]["size"], 1, "a status write ignores the spec");
    assert_eq!(patched.metadata.generation, Some(1), "a status write keeps the generation");

    let spec_patch = Patch::Merge(json!({"status": {"phase": "Gone"}, "spec": {"size": 2}}));
    let patched = widgets.patch("w", &PatchParams::default(), &spec_patch).await.expect("spec");
    assert_eq!(patched.data["status"]["phase"], "Ready", "a spec write ignores the status");
    assert_eq!(patched.metadata.generation, Some(2));
    let same = widgets.patch("w", &PatchParams::default(), &spec_patch).await.expect("no-op");
    assert_eq!(same.metadata.resource_version, patched.metadata.resource_version, "a no-op writes nothing");

    let strategic = widgets.patch("w", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"size": 3}}))).await;
    assert_eq!(status(strategic).0, 415);
}

#[tokio::test]
async fn without_a_status_subresource_any_change_bumps_generation() {
    let emulator = emulator().await;
    let client = emulator.client().await;
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &widget_crd(false))
        .await
        .expect("create crd");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, "default", &widget_resource());
    let mut object = widget("w", json!({"size": 1}));
    object.data["status"] = json!({"phase": "kept"});
    let created = widgets.create(&PostParams::default(), &object).await.expect("create");
    assert_eq!(created.data["status"]["phase"], "kept");
    let patched = widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Synced"}})))
        .await
        .expect("patch");
    assert_eq!(patched.metadata.generation, Some(2));
    let labelled = widgets
        .patch("w", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})))
        .await
        .expect("label");
    assert_eq!(labelled.metadata.generation, Some(2), "metadata changes keep the generation");
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let emulator = emulator().await;
    let maps: Api<ConfigMap> = Api::namespaced(emulator.client().await, "default");
    let mut held = config_map("held", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    maps.create(&PostParams::default(), &held).await.expect("create");
    let answer = maps.delete("held", &DeleteParams::default()).await.expect("delete");
    let pending = answer.left().expect("the object comes back while finalizers hold it");
    assert!(pending.metadata.deletion_timestamp.is_some());

    let add = Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}}));
    let (code, reason, message) = status(maps.patch("held", &PatchParams::default(), &add).await);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(message.contains("no new finalizers can be added if the object is being deleted"), "{message}");

    let remove = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    maps.patch("held", &PatchParams::default(), &remove).await.expect("remove finalizer");
    assert!(maps.get_opt("held").await.expect("get").is_none());
}

#[tokio::test]
async fn namespace_deletion_removes_its_objects() {
    let emulator = emulator().await;
    let client = emulator.client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team"}})).expect("ns");
    let created = namespaces.create(&PostParams::default(), &ns).await.expect("create ns");
    assert_eq!(created.status.and_then(|s| s.phase).as_deref(), Some("Active"));
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "team");
    eventually("the default ServiceAccount", || async { accounts.get_opt("default").await.ok().flatten().is_some() })
        .await;

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    let mut held = config_map("held", json!({}));
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    maps.create(&PostParams::default(), &held).await.expect("create");
    maps.create(&PostParams::default(), &config_map("free", json!({}))).await.expect("create");

    let answer = namespaces.delete("team", &DeleteParams::default()).await.expect("delete ns");
    let terminating = answer.left().expect("the namespace comes back");
    assert_eq!(terminating.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));
    let (code, _, _) = status(maps.create(&PostParams::default(), &config_map("late", json!({}))).await);
    assert_eq!(code, 403);
    assert!(maps.get_opt("free").await.expect("get").is_none());
    assert!(namespaces.get_opt("team").await.expect("get").is_some(), "held by the finalizer of its object");
    maps.patch("held", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .expect("release");
    assert!(namespaces.get_opt("team").await.expect("get").is_none());
    assert_eq!(status(namespaces.delete("default", &DeleteParams::default()).await).0, 403);
}

#[tokio::test]
async fn server_side_apply_tracks_managers() {
    let emulator = emulator().await;
    let maps: Api<ConfigMap> = Api::namespaced(emulator.client().await, "default");
    let apply = |data: Value| {
        Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data}))
    };
    let created =
        maps.patch("ssa", &PatchParams::apply("first"), &apply(json!({"a": "1", "b": "2"}))).await.expect("apply");
    assert_eq!(created.metadata.managed_fields.as_ref().map(Vec::len), Some(1));

    let (code, reason, message) =
        status(maps.patch("ssa", &PatchParams::apply("second"), &apply(json!({"a": "9"}))).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(message, "Apply failed with 1 conflict: conflict with \"first\": .data.a");

    let forced =
        maps.patch("ssa", &PatchParams::apply("second").force(), &apply(json!({"a": "9"}))).await.expect("force");
    assert_eq!(forced.data.as_ref().expect("data")["a"], "9");
    let shrunk = maps.patch("ssa", &PatchParams::apply("first"), &apply(json!({}))).await.expect("apply less");
    let data = shrunk.data.unwrap_or_default();
    assert_eq!(data.get("a").map(String::as_str), Some("9"), "owned by second now");
    assert!(!data.contains_key("b"), "fields first no longer applies are removed");

    let missing_manager = maps.patch("ssa", &PatchParams::default(), &apply(json!({}))).await;
    assert_eq!(status(missing_manager).0, 422);
}

#[tokio::test]
async fn rbac_for_service_account_tokens_anonymous_and_bad_tokens() {
    let emulator = emulator().await;
    let admin = emulator.client().await;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "reader"}})).expect("sa");
    accounts.create(&PostParams::default(), &account).await.expect("create sa");
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "read-maps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}))
    .expect("role");
    Api::<Role>::namespaced(admin.clone(), "default").create(&PostParams::default(), &role).await.expect("role");
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-maps"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}))
    .expect("binding");
    Api::<RoleBinding>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).expect("token request");
    let minted = accounts.create_token_request("reader", &PostParams::default(), &request).await.expect("token");
    let token = minted.status.expect("status").token;

    let reader = emulator.client_with_token(&token).await;
    let maps: Api<ConfigMap> = Api::namespaced(reader.clone(), "default");
    maps.list(&ListParams::default()).await.expect("allowed to list");
    let (code, reason, message) = status(maps.create(&PostParams::default(), &config_map("x", json!({}))).await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "configmaps is forbidden: User \"system:serviceaccount:default:reader\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );

    let anonymous = emulator.client_with_token("").await;
    let (code, _, message) = status(Api::<Namespace>::all(anonymous).list(&ListParams::default()).await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "namespaces is forbidden: User \"system:anonymous\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope"
    );
    let bad = emulator.client_with_token("not-a-token").await;
    assert_eq!(status(Api::<Namespace>::all(bad).list(&ListParams::default()).await).0, 401);

    accounts.delete("reader", &DeleteParams::default()).await.expect("delete sa");
    assert_eq!(status(maps.list(&ListParams::default()).await).0, 401, "tokens die with their ServiceAccount");
}

#[tokio::test]
async fn watcher_follows_changes_over_tls() {
    let emulator =
        KubeEmulator::start(EmulatorOptions { tls: true, ..EmulatorOptions::default() }).await.expect("start");
    assert!(emulator.url().starts_with("https://"));
    let client = emulator.client().await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stream = watcher(maps.clone(), watcher::Config::default()).boxed();
    maps.create(&PostParams::default(), &config_map("seen", json!({}))).await.expect("create");
    let mut stream = stream;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let event = tokio::time::timeout_at(deadline, stream.try_next()).await.expect("in time").expect("event");
        match event {
            Some(watcher::Event::Apply(c) | watcher::Event::InitApply(c))
                if c.metadata.name.as_deref() == Some("seen") =>
            {
                break;
            }
            Some(_) => continue,
            None => panic!("watcher ended"),
        }
    }
    let version = client.apiserver_version().await.expect("version");
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "20"));
}

#[derive(Debug, thiserror::Error)]
#[error("reconcile failed: {0}")]
struct ReconcileError(#[from] kube::Error);

#[tokio::test]
async fn a_controller_with_a_finalizer_runs_against_the_emulator() {
    use std::sync::Arc;

    use kube::runtime::controller::{Action, Controller};
    use kube::runtime::finalizer::{Event as Finalizer, finalizer};

    let emulator = emulator().await;
    let maps: Api<ConfigMap> = Api::namespaced(emulator.client().await, "default");
    let controller_api = maps.clone();
    let controller = tokio::spawn(
        Controller::new(maps.clone(), watcher::Config::default())
            .run(
                move |object: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>| async move {
                    finalizer(&api, "example.com/cleanup", object, |event| async {
                        match event {
                            Finalizer::Apply(map) => {
                                let name = map.metadata.name.clone().unwrap_or_default();
                                let mark = Patch::Merge(json!({"metadata": {"annotations": {"reconciled": "yes"}}}));
                                api.patch(&name, &PatchParams::default(), &mark).await?;
                                Ok::<_, ReconcileError>(Action::await_change())
                            }
                            Finalizer::Cleanup(_) => Ok(Action::await_change()),
                        }
                    })
                    .await
                    .map_err(|e| ReconcileError(kube::Error::Service(e.to_string().into())))
                },
                |_, _, _| Action::requeue(Duration::from_millis(50)),
                Arc::new(controller_api),
            )
            .for_each(|_| async {}),
    );

    maps.create(&PostParams::default(), &config_map("managed", json!({}))).await.expect("create");
    eventually("the reconciler's mark and finalizer", || async {
        let map = maps.get("managed").await.expect("get");
        let marked = map.metadata.annotations.is_some_and(|a| a.contains_key("reconciled"));
        let finalized = map.metadata.finalizers.is_some_and(|f| f.iter().any(|f| f == "example.com/cleanup"));
        marked && finalized
    })
    .await;
    maps.delete("managed", &DeleteParams::default()).await.expect("delete");
    eventually("the cleanup to release the object", || async { maps.get_opt("managed").await.expect("get").is_none() })
        .await;
    controller.abort();
}
