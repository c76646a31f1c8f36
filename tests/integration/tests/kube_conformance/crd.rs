//! CustomResourceDefinitions: a new CRD is Established and served (and discoverable)
//! at once, deleting it deletes its objects; the status subresource splits spec and
//! status writes; without one (Argo CD's Application shape) status lives on the main
//! resource and any non-metadata change bumps generation; structural schemas prune
//! unknown fields and refuse wrong types with 422 Invalid.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Env, GADGET, GIZMO, generation, random_name, refused_with};
use crate::support::eventually;

#[tokio::test]
async fn a_new_crd_is_served_at_once_and_takes_its_objects_when_deleted() {
    let env = Env::new("crd-lifecycle").await;
    let group = format!("{}.conformance.gitops.example.invalid", random_name("g"));
    let crd = GADGET.crd_in(&group);
    let name = crd.metadata.name.clone().unwrap();
    let crds = Api::<CustomResourceDefinition>::all(env.client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let established = eventually("the new CRD to be Established", || async {
        let crd = crds.get(&name).await.unwrap();
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        let is_true = |kind: &str| conditions.iter().any(|c| c.type_ == kind && c.status == "True");
        (is_true("Established") && is_true("NamesAccepted")).then_some(())
    });
    established.await;

    // Discovery lists the resource and its status subresource. kube-apiserver
    // updates discovery shortly after Established (404 until then), so wait for it.
    let resources = eventually("the new group in discovery", || async {
        env.client.list_api_group_resources(&format!("{group}/v1")).await.ok()
    })
    .await;
    let gadgets = resources.resources.iter().find(|r| r.name == "gadgets").expect("gadgets in discovery");
    assert!(gadgets.namespaced);
    assert_eq!(gadgets.kind, "Gadget");
    for verb in ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"] {
        assert!(gadgets.verbs.iter().any(|v| v == verb), "verb {verb} in {:?}", gadgets.verbs);
    }
    assert!(resources.resources.iter().any(|r| r.name == "gadgets/status"), "{:?}", resources.resources);

    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(&group, "v1", "Gadget"),
        "gadgets",
    );
    let objects = Api::<kube::api::DynamicObject>::namespaced_with(env.client.clone(), env.ns(), &resource);
    let mut object = GADGET.object("g", json!({"spec": {"size": 1}}));
    object.types.as_mut().unwrap().api_version = format!("{group}/v1");
    objects.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(objects.list(&ListParams::default()).await.unwrap().items.len(), 1);

    crds.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually("the CRD and its objects to be gone", || async {
        crds.get_opt(&name).await.unwrap().is_none().then_some(())
    })
    .await;
    // The group is gone: a plain 404 (the real server answers "404 page not found", not a Status).
    match objects.get("g").await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 404, "{status:?}"),
        other => panic!("expected a 404, got {other:?}"),
    }
}

#[tokio::test]
async fn the_status_subresource_splits_spec_and_status_writes() {
    let env = Env::new("crd-status").await;
    let gadgets = env.api(GADGET);
    let object = GADGET.object("g", json!({"spec": {"size": 1}, "status": {"ready": true}}));
    let created = gadgets.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(created.data.get("status"), None, "status is ignored on create");
    assert_eq!(generation(&created), 1);

    // Main resource: spec changes (generation bumps), status is ignored.
    let both = json!({"spec": {"size": 2}, "status": {"ready": true}});
    let patched = gadgets.patch("g", &PatchParams::default(), &Patch::Merge(both.clone())).await.unwrap();
    assert_eq!((patched.data["spec"]["size"].clone(), patched.data.get("status")), (json!(2), None));
    assert_eq!(generation(&patched), 2);

    // Status subresource: status changes, spec is ignored, generation stays.
    let status = gadgets
        .patch_status(
            "g",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 3}, "status": {"ready": true, "observedGeneration": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(status.data["spec"]["size"], 2);
    assert_eq!(status.data["status"], json!({"ready": true, "observedGeneration": 2}));
    assert_eq!(generation(&status), 2, "a status write does not bump generation");
    assert_ne!(status.metadata.resource_version, patched.metadata.resource_version);

    // The same through update (PUT) of each half.
    let mut whole = gadgets.get_status("g").await.unwrap();
    assert_eq!(whole.data["spec"]["size"], 2, "GET status returns the whole object");
    whole.data["spec"]["size"] = json!(10);
    whole.data["status"]["ready"] = json!(false);
    let replaced = gadgets.replace_status("g", &PostParams::default(), &whole).await.unwrap();
    assert_eq!(
        (replaced.data["spec"]["size"].clone(), replaced.data["status"]["ready"].clone()),
        (json!(2), json!(false))
    );
    assert_eq!(generation(&replaced), 2);
    let mut whole = replaced;
    whole.data["spec"]["size"] = json!(4);
    whole.data["status"]["ready"] = json!(true);
    let replaced = gadgets.replace("g", &PostParams::default(), &whole).await.unwrap();
    assert_eq!(
        (replaced.data["spec"]["size"].clone(), replaced.data["status"]["ready"].clone()),
        (json!(4), json!(false))
    );
    assert_eq!(generation(&replaced), 3);

    // Metadata changes do not bump generation.
    let labelled = gadgets
        .patch("g", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})))
        .await
        .unwrap();
    assert_eq!(generation(&labelled), 3);

    // Server-side apply through the status subresource, with its own manager.
    let applied = gadgets
        .patch_status(
            "g",
            &PatchParams::apply("status-writer"),
            &Patch::Apply(GADGET.object("g", json!({"status": {"message": "hi"}}))),
        )
        .await
        .unwrap();
    assert_eq!(applied.data["status"]["message"], "hi");
    assert_eq!(generation(&applied), 3);
}

#[tokio::test]
async fn without_a_status_subresource_any_non_metadata_change_bumps_generation() {
    let env = Env::new("crd-no-status").await;
    let gizmos = env.api(GIZMO);
    let object = GIZMO.object("app", json!({"spec": {"size": 1}, "status": {"phase": "New"}}));
    let created = gizmos.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(created.data["status"]["phase"], "New", "status is part of the main resource");
    assert_eq!(generation(&created), 1);

    let merge = |patch| Patch::Merge(patch);
    let steps = [
        (json!({"status": {"phase": "Synced", "observedGeneration": 1}}), 2, "status"),
        (json!({"metadata": {"labels": {"a": "b"}, "annotations": {"c": "d"}}}), 2, "labels and annotations"),
        (json!({"metadata": {"finalizers": ["conformance.gitops.example.invalid/x"]}}), 2, "finalizers"),
        (json!({"operation": {"sync": {"revision": "HEAD"}}}), 3, "operation"),
        (json!({"operation": null}), 4, "removing operation"),
        (json!({"spec": {"size": 2}}), 5, "spec"),
        (json!({"metadata": {"finalizers": null}}), 5, "finalizers"),
    ];
    for (patch, expected, what) in steps {
        let patched = gizmos.patch("app", &PatchParams::default(), &merge(patch)).await.unwrap();
        assert_eq!(generation(&patched), expected, "after changing {what}");
    }

    // There is no status subresource to write to.
    let refused = gizmos.patch_status("app", &PatchParams::default(), &merge(json!({"status": {"phase": "X"}}))).await;
    refused_with(refused, 404, "NotFound");
    refused_with(gizmos.get_status("app").await, 404, "NotFound");
}

#[tokio::test]
async fn structural_schemas_prune_unknown_fields_and_refuse_wrong_types() {
    let env = Env::new("crd-schema").await;
    let gadgets = env.api(GADGET);
    let object = GADGET.object(
        "g",
        json!({
            "spec": {"size": 1, "unknown": "x", "extra": {"anything": {"goes": [1, "two"]}}},
            "junk": {"a": 1},
        }),
    );
    let created = gadgets.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(created.data["spec"], json!({"size": 1, "extra": {"anything": {"goes": [1, "two"]}}}));
    assert_eq!(created.data.get("junk"), None, "unknown top-level fields are pruned");
    assert_eq!(gadgets.get("g").await.unwrap().data, created.data, "pruned in storage too");

    let patched =
        gadgets.patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": {"other": 1}}))).await.unwrap();
    assert_eq!(patched.data["spec"].get("other"), None, "pruned on update");
    assert_eq!(
        patched.metadata.resource_version, created.metadata.resource_version,
        "a pruned-away change is no change"
    );

    let wrong = GADGET.object("bad", json!({"spec": {"size": "big"}}));
    let status = refused_with(gadgets.create(&PostParams::default(), &wrong).await, 422, "Invalid");
    assert_eq!(
        status.message,
        format!(
            "Gadget.{} \"bad\" is invalid: spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\"",
            super::GROUP
        )
    );
    let details = status.details.expect("details");
    assert_eq!((details.name.as_str(), details.kind.as_str(), details.group.as_str()), ("bad", "Gadget", super::GROUP));
    assert_eq!(
        (details.causes[0].reason.as_str(), details.causes[0].field.as_str()),
        ("FieldValueInvalid", "spec.size")
    );

    let status = refused_with(
        gadgets.patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": {"tags": [1]}}))).await,
        422,
        "Invalid",
    );
    // The field is `spec.tags` on v1.20 and `spec.tags[0]` on later servers.
    assert!(
        status.details.expect("details").causes.iter().any(|c| c.field.starts_with("spec.tags")),
        "{}",
        status.message
    );
    refused_with(
        gadgets.patch("g", &PatchParams::default(), &Patch::Merge(json!({"spec": "flat"}))).await,
        422,
        "Invalid",
    );
    refused_with(gadgets.get("bad").await, 404, "NotFound");
}
