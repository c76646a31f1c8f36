//! Deletion and finalizers: a delete of an object with finalizers only sets
//! `deletionTimestamp` (watchers see MODIFIED), no finalizer may be added from then on
//! (422), the object goes (DELETED) when the last finalizer is removed; and deleting a
//! namespace refuses new objects in it (403) and removes the objects it holds.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use serde_json::json;

use super::{Env, GADGET, event_object, next_change, refused_with, summary};
use crate::support::eventually;

const HOLD: &str = "conformance.gitops.example.invalid/hold";
const KEEP: &str = "conformance.gitops.example.invalid/keep";

#[tokio::test]
async fn an_object_with_finalizers_is_deleted_when_the_last_one_is_removed() {
    let env = Env::new("finalizers").await;
    let gadgets = env.api(GADGET);
    let object = GADGET.object("g", json!({"metadata": {"finalizers": [HOLD, KEEP]}, "spec": {"size": 1}}));
    gadgets.create(&PostParams::default(), &object).await.unwrap();
    let version = gadgets.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut events = gadgets.watch(&WatchParams::default(), &version).await.unwrap().boxed();

    let deleting = gadgets.delete("g", &DeleteParams::default()).await.unwrap();
    let deleting = deleting.left().expect("the delete answers with the object, still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(deleting.finalizers(), [HOLD, KEEP]);
    let modified = next_change(&mut events).await;
    assert_eq!(summary(&modified), ("MODIFIED", "g".into()), "watchers see the deletion start");
    assert!(event_object(modified).metadata.deletion_timestamp.is_some());

    // Deleting again changes nothing; the object is still readable.
    let again = gadgets.delete("g", &DeleteParams::default()).await.unwrap().left().expect("still there");
    assert_eq!(again.metadata.deletion_timestamp, deleting.metadata.deletion_timestamp);
    assert!(gadgets.get("g").await.unwrap().metadata.deletion_timestamp.is_some());

    // No new finalizers once deletion started.
    let add =
        Patch::Merge(json!({"metadata": {"finalizers": [HOLD, KEEP, "conformance.gitops.example.invalid/late"]}}));
    let status = refused_with(gadgets.patch("g", &PatchParams::default(), &add).await, 422, "Invalid");
    assert!(status.message.contains("no new finalizers can be added if the object is being deleted"), "{status:?}");
    assert!(status.details.expect("details").causes.iter().any(|c| c.field == "metadata.finalizers"));

    // Other changes are still accepted.
    let spec = gadgets.patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}}))).await.unwrap();
    assert_eq!(spec.data["spec"]["size"], 2);
    assert_eq!(summary(&next_change(&mut events).await), ("MODIFIED", "g".into()));

    let one_left = Patch::Merge(json!({"metadata": {"finalizers": [KEEP]}}));
    let kept = gadgets.patch("g", &PatchParams::default(), &one_left).await.unwrap();
    assert_eq!(kept.finalizers(), [KEEP]);
    assert_eq!(summary(&next_change(&mut events).await), ("MODIFIED", "g".into()));

    let none_left = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    gadgets.patch("g", &PatchParams::default(), &none_left).await.unwrap();
    assert_eq!(summary(&next_change(&mut events).await), ("DELETED", "g".into()));
    refused_with(gadgets.get("g").await, 404, "NotFound");
}

#[tokio::test]
async fn an_object_without_finalizers_goes_at_once() {
    let env = Env::new("delete-plain").await;
    let gadgets = env.api(GADGET);
    gadgets.create(&PostParams::default(), &GADGET.object("g", json!({"spec": {"size": 1}}))).await.unwrap();
    gadgets.delete("g", &DeleteParams::default()).await.unwrap();
    refused_with(gadgets.get("g").await, 404, "NotFound");
    refused_with(gadgets.delete("g", &DeleteParams::default()).await, 404, "NotFound");

    // A precondition on the uid guards against deleting a re-created object.
    let created =
        gadgets.create(&PostParams::default(), &GADGET.object("g", json!({"spec": {"size": 1}}))).await.unwrap();
    let stale = DeleteParams::default().preconditions(kube::api::Preconditions {
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        resource_version: None,
    });
    refused_with(gadgets.delete("g", &stale).await, 409, "Conflict");
    let current = DeleteParams::default()
        .preconditions(kube::api::Preconditions { uid: created.metadata.uid.clone(), resource_version: None });
    gadgets.delete("g", &current).await.unwrap();
    refused_with(gadgets.get("g").await, 404, "NotFound");
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_objects() {
    let env = Env::new("namespace-deletion").await;
    // A second namespace, deleted by the test itself.
    let doomed = env.cluster.namespace("doomed").await;
    let name = doomed.name().to_owned();
    let config_maps = Api::<ConfigMap>::namespaced(env.client.clone(), &name);
    let gadgets = GADGET.api(&env.client, &name);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"a": "1"}})).unwrap();
    config_maps.create(&PostParams::default(), &cm).await.unwrap();
    gadgets.create(&PostParams::default(), &GADGET.object("free", json!({"spec": {"size": 1}}))).await.unwrap();
    let held = GADGET.object("held", json!({"metadata": {"finalizers": [HOLD]}, "spec": {"size": 1}}));
    gadgets.create(&PostParams::default(), &held).await.unwrap();

    let namespaces = Api::<Namespace>::all(env.client.clone());
    namespaces.delete(&name, &DeleteParams::default()).await.unwrap();
    let terminating = namespaces.get(&name).await.unwrap();
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.status.and_then(|s| s.phase).as_deref(), Some("Terminating"));

    // Nothing new may be created in a terminating namespace.
    let late: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap();
    let status = refused_with(config_maps.create(&PostParams::default(), &late).await, 403, "Forbidden");
    assert!(status.message.contains("because it is being terminated"), "{status:?}");

    eventually("the namespace's deletable objects to be gone", || async {
        let cms = config_maps.list(&ListParams::default()).await.unwrap().items;
        let left: Vec<_> = gadgets.list(&ListParams::default()).await.unwrap().items;
        let held_only =
            left.len() == 1 && left[0].name_any() == "held" && left[0].metadata.deletion_timestamp.is_some();
        (cms.is_empty() && held_only).then_some(())
    })
    .await;
    assert!(namespaces.get_opt(&name).await.unwrap().is_some(), "the namespace waits for the held object");

    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    gadgets.patch("held", &PatchParams::default(), &release).await.unwrap();
    eventually("the namespace to be gone", || async {
        namespaces.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
}
