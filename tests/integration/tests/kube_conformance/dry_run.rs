//! `dryRun=All`: writes and deletes answer what they would have done and store
//! nothing — no object, no new resourceVersion — while their errors are the real
//! ones (AlreadyExists, NotFound, schema validation).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Env, GADGET, refused_with, resource_version};

fn dry_post() -> PostParams {
    PostParams { dry_run: true, ..Default::default() }
}

#[tokio::test]
async fn dry_run_create_update_apply_and_delete_store_nothing() {
    let env = Env::new("dry-run").await;
    let gadgets = env.api(GADGET);

    // Create: the answer is the object as it would be stored, but it is not there.
    let answered = gadgets.create(&dry_post(), &GADGET.object("ghost", json!({"spec": {"size": 3}}))).await.unwrap();
    assert_eq!(answered.metadata.name.as_deref(), Some("ghost"));
    assert_eq!(answered.data["spec"]["size"], 3);
    assert!(answered.metadata.creation_timestamp.is_some(), "{:?}", answered.metadata);
    assert!(gadgets.get_opt("ghost").await.unwrap().is_none(), "a dry-run create stored the object");

    // A dry run is validated as a real write is.
    let invalid = gadgets.create(&dry_post(), &GADGET.object("bad", json!({"spec": {"size": "three"}}))).await;
    refused_with(invalid, 422, "Invalid");

    let stored =
        gadgets.create(&PostParams::default(), &GADGET.object("real", json!({"spec": {"size": 1}}))).await.unwrap();
    let rv = resource_version(&stored);
    refused_with(
        gadgets.create(&dry_post(), &GADGET.object("real", json!({"spec": {"size": 1}}))).await,
        409,
        "AlreadyExists",
    );

    // Update and patches: answered changed, stored unchanged.
    let mut changed = stored.clone();
    changed.data["spec"]["size"] = json!(2);
    let answered = gadgets.replace("real", &dry_post(), &changed).await.unwrap();
    assert_eq!(answered.data["spec"]["size"], 2);
    let params = PatchParams { dry_run: true, ..Default::default() };
    let answered = gadgets.patch("real", &params, &Patch::Merge(json!({"spec": {"size": 5}}))).await.unwrap();
    assert_eq!(answered.data["spec"]["size"], 5);
    let apply = PatchParams { dry_run: true, ..PatchParams::apply("conformance").force() };
    let object = json!({"apiVersion": super::API_VERSION, "kind": GADGET.kind, "metadata": {"name": "real"}, "spec": {"size": 7}});
    let answered = gadgets.patch("real", &apply, &Patch::Apply(&object)).await.unwrap();
    assert_eq!(answered.data["spec"]["size"], 7);
    let read = gadgets.get("real").await.unwrap();
    assert_eq!(read.data["spec"]["size"], 1, "a dry-run write changed the object");
    assert_eq!(resource_version(&read), rv, "a dry-run write took a resourceVersion");

    // Apply that would create: nothing created.
    let object = json!({"apiVersion": super::API_VERSION, "kind": GADGET.kind, "metadata": {"name": "applied"}, "spec": {"size": 1}});
    gadgets.patch("applied", &apply, &Patch::Apply(&object)).await.unwrap();
    assert!(gadgets.get_opt("applied").await.unwrap().is_none(), "a dry-run apply created the object");

    // Delete: the object stays; a missing one is NotFound.
    let dry_delete = DeleteParams { dry_run: true, ..Default::default() };
    gadgets.delete("real", &dry_delete).await.unwrap();
    assert_eq!(resource_version(&gadgets.get("real").await.unwrap()), rv, "a dry-run delete removed the object");
    refused_with(gadgets.delete("ghost", &dry_delete).await.map(|_| ()), 404, "NotFound");

    // Built-in kinds too.
    let config_maps = env.namespaced::<ConfigMap>();
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dry"}, "data": {"a": "b"}})).unwrap();
    let answered = config_maps.create(&dry_post(), &cm).await.unwrap();
    assert_eq!(answered.data.unwrap_or_default().get("a").map(String::as_str), Some("b"));
    assert!(config_maps.get_opt("dry").await.unwrap().is_none(), "a dry-run ConfigMap was stored");
}
