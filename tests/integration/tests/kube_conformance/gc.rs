//! Garbage collection by `ownerReferences`: deleting an owner deletes the dependents
//! that have no other owner left (background propagation), and `Orphan` leaves them
//! without the reference. On a real cluster kube-controller-manager's collector
//! does it a moment later, so each outcome is awaited with a deadline.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams, PropagationPolicy};
use serde_json::json;

use super::Env;
use crate::support::eventually;

fn config_map(name: &str, owners: &[&ConfigMap]) -> ConfigMap {
    let owners: Vec<_> = owners
        .iter()
        .map(|owner| {
            json!({"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name, "uid": owner.metadata.uid})
        })
        .collect();
    let mut object = json!({"metadata": {"name": name}});
    if !owners.is_empty() {
        object["metadata"]["ownerReferences"] = json!(owners);
    }
    serde_json::from_value(object).expect("a ConfigMap")
}

#[tokio::test]
async fn deleting_an_owner_collects_its_sole_dependents_and_orphan_keeps_them() {
    let env = Env::new("gc").await;
    let api = env.namespaced::<ConfigMap>();
    let post = PostParams::default();
    let owner = api.create(&post, &config_map("owner", &[])).await.unwrap();
    let other = api.create(&post, &config_map("other-owner", &[])).await.unwrap();
    let child = api.create(&post, &config_map("child", &[&owner])).await.unwrap();
    api.create(&post, &config_map("grandchild", &[&child])).await.unwrap();
    api.create(&post, &config_map("shared", &[&owner, &other])).await.unwrap();

    api.delete("owner", &DeleteParams::background()).await.unwrap();
    for name in ["child", "grandchild"] {
        eventually(&format!("{name} collected"), || async {
            api.get_opt(name).await.expect("get").is_none().then_some(())
        })
        .await;
    }
    let shared = api.get_opt("shared").await.expect("get");
    assert!(shared.is_some(), "a dependent with another owner left stays");

    // Orphan: the dependent stays, without its reference to the owner.
    let orphaned_owner = api.create(&post, &config_map("orphaning", &[])).await.unwrap();
    api.create(&post, &config_map("orphan", &[&orphaned_owner])).await.unwrap();
    let params = DeleteParams { propagation_policy: Some(PropagationPolicy::Orphan), ..Default::default() };
    api.delete("orphaning", &params).await.unwrap();
    eventually("the orphaning owner gone", || async {
        api.get_opt("orphaning").await.expect("get").is_none().then_some(())
    })
    .await;
    let orphan = api.get("orphan").await.expect("the orphan stays");
    assert!(orphan.metadata.owner_references.unwrap_or_default().is_empty(), "the reference to the owner is removed");
    // And the other owner's dependent outlives the deletion of both owners' first.
    api.delete("other-owner", &DeleteParams::background()).await.unwrap();
    eventually("shared collected once its last owner is gone", || async {
        api.get_opt("shared").await.expect("get").is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_dependent_written_after_its_owner_went_is_collected() {
    let env = Env::new("gc-late").await;
    let api = env.namespaced::<ConfigMap>();
    let post = PostParams::default();
    let owner = api.create(&post, &config_map("owner", &[])).await.unwrap();
    api.delete("owner", &DeleteParams::background()).await.unwrap();
    eventually("the owner gone", || async { api.get_opt("owner").await.expect("get").is_none().then_some(()) }).await;
    // A controller that read the owner just before it went writes a dependent now.
    api.create(&post, &config_map("late", &[&owner])).await.unwrap();
    api.create(&post, &config_map("unowned", &[])).await.unwrap();
    eventually("the late dependent collected", || async {
        api.get_opt("late").await.expect("get").is_none().then_some(())
    })
    .await;
    assert!(api.get_opt("unowned").await.expect("get").is_some(), "an object without owners stays");
}
