//! Patches: JSON merge patch (RFC 7386), JSON patch (RFC 6902, including a failing
//! `test`), and strategic merge patch — which merges lists by key on built-in kinds and
//! is refused (415) on custom resources.

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Env, GADGET, generation, refused_with};

#[tokio::test]
async fn a_merge_patch_sets_merges_and_removes_keys() {
    let env = Env::new("patch-merge").await;
    let gadgets = env.api(GADGET);
    let object = GADGET.object(
        "g",
        json!({"metadata": {"labels": {"keep": "1", "drop": "1"}},
        "spec": {"size": 1, "color": "red", "tags": ["a", "b"]}}),
    );
    gadgets.create(&PostParams::default(), &object).await.unwrap();

    let patch =
        json!({"metadata": {"labels": {"drop": null, "new": "1"}}, "spec": {"color": null, "tags": ["c"], "size": 2}});
    let patched = gadgets.patch("g", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    assert_eq!(patched.data["spec"], json!({"size": 2, "tags": ["c"]}), "null removes, lists are replaced whole");
    let labels = patched.labels();
    assert_eq!(
        (labels.get("keep"), labels.get("new"), labels.get("drop")),
        (Some(&"1".into()), Some(&"1".into()), None)
    );
    assert_eq!(generation(&patched), 2);

    // A patch that changes nothing keeps the object as it was.
    let same = gadgets.patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}}))).await.unwrap();
    assert_eq!(
        (same.metadata.resource_version.clone(), generation(&same)),
        (patched.metadata.resource_version.clone(), 2)
    );
}

#[tokio::test]
async fn a_json_patch_applies_its_operations_or_none() {
    let env = Env::new("patch-json").await;
    let gadgets = env.api(GADGET);
    gadgets
        .create(&PostParams::default(), &GADGET.object("g", json!({"spec": {"size": 1, "tags": ["a", "b"]}})))
        .await
        .unwrap();

    // `test` of an absent field against null passes (kube::runtime::finalizer relies on it).
    let ops = json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "test", "path": "/spec/size", "value": 1},
        {"op": "replace", "path": "/spec/size", "value": 5},
        {"op": "add", "path": "/spec/tags/-", "value": "c"},
        {"op": "remove", "path": "/spec/tags/0"},
        {"op": "add", "path": "/spec/color", "value": "blue"},
        {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
    ]);
    let patched = gadgets
        .patch("g", &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(ops).unwrap()))
        .await
        .unwrap();
    assert_eq!(patched.data["spec"], json!({"size": 5, "tags": ["b", "c"], "color": "blue"}));
    assert_eq!(patched.labels().get("x").map(String::as_str), Some("y"));

    // A failing test (or a path that is not there) refuses the whole patch: 422.
    for ops in [
        json!([{"op": "replace", "path": "/spec/size", "value": 9}, {"op": "test", "path": "/spec/size", "value": 1}]),
        json!([{"op": "replace", "path": "/spec/size", "value": 9}, {"op": "remove", "path": "/spec/nothing"}]),
    ] {
        let patch = Patch::Json::<()>(serde_json::from_value(ops).unwrap());
        refused_with(gadgets.patch("g", &PatchParams::default(), &patch).await, 422, "Invalid");
    }
    assert_eq!(gadgets.get("g").await.unwrap().data["spec"]["size"], 5, "refused patches changed nothing");
}

#[tokio::test]
async fn a_strategic_merge_patch_merges_built_in_lists_by_key() {
    let env = Env::new("patch-strategic").await;
    let config_maps = env.namespaced::<ConfigMap>();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"a": "1", "b": "2"}})).unwrap();
    config_maps.create(&PostParams::default(), &cm).await.unwrap();
    let patch = Patch::Strategic(json!({"data": {"b": null, "c": "3"}}));
    let patched = config_maps.patch("cm", &PatchParams::default(), &patch).await.unwrap();
    assert_eq!(patched.data.unwrap(), [("a".to_owned(), "1".to_owned()), ("c".to_owned(), "3".to_owned())].into());

    // ServiceAccount.secrets merges by `name` under a strategic merge patch, while a JSON
    // merge patch replaces the list. (A real cluster's token controller may add a token
    // secret of its own to the list: only the names the test wrote are checked.)
    let accounts = env.namespaced::<ServiceAccount>();
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "sa"}, "secrets": [{"name": "one"}]})).unwrap();
    accounts.create(&PostParams::default(), &sa).await.unwrap();
    let secret_names = |sa: &ServiceAccount| -> Vec<String> {
        let mine = ["one", "two", "three"];
        sa.secrets.iter().flatten().filter_map(|s| s.name.clone()).filter(|n| mine.contains(&n.as_str())).collect()
    };
    let strategic = Patch::Strategic(json!({"secrets": [{"name": "two"}]}));
    let merged = accounts.patch("sa", &PatchParams::default(), &strategic).await.unwrap();
    let mut names = secret_names(&merged);
    names.sort();
    assert_eq!(names, ["one", "two"]);
    let replacing = Patch::Merge(json!({"secrets": [{"name": "three"}]}));
    let replaced = accounts.patch("sa", &PatchParams::default(), &replacing).await.unwrap();
    assert_eq!(secret_names(&replaced), ["three"]);
    // `$patch: delete` removes one entry by key.
    let delete = Patch::Strategic(json!({"secrets": [{"name": "three", "$patch": "delete"}]}));
    let deleted = accounts.patch("sa", &PatchParams::default(), &delete).await.unwrap();
    assert!(secret_names(&deleted).is_empty(), "{:?}", deleted.secrets);
}

#[tokio::test]
async fn a_strategic_merge_patch_on_a_custom_resource_is_unsupported() {
    let env = Env::new("patch-strategic-cr").await;
    let gadgets = env.api(GADGET);
    gadgets.create(&PostParams::default(), &GADGET.object("g", json!({"spec": {"size": 1}}))).await.unwrap();
    let patch = Patch::Strategic(json!({"spec": {"size": 2}}));
    let status = refused_with(gadgets.patch("g", &PatchParams::default(), &patch).await, 415, "UnsupportedMediaType");
    assert!(status.message.contains("application/merge-patch+json"), "{status:?}");
}
