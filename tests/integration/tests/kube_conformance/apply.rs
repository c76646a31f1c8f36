//! Server-side apply, as the service uses it (one field manager per purpose, `force`
//! for state it owns): apply creates, two managers own separate fields side by side, a
//! conflicting apply without force is a 409 naming the other manager, force takes the
//! field over, and a field dropped from a manager's applied config is removed unless
//! another manager still owns it.

use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::{Env, GADGET, generation, refused_with};

fn apply(spec: Value) -> Patch<DynamicObject> {
    Patch::Apply(GADGET.object("g", json!({"spec": spec})))
}

/// The top-level spec fields `manager` owns, from managedFields.
fn owned_by(object: &DynamicObject, manager: &str) -> Vec<String> {
    let mut fields: Vec<String> = object
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| entry.manager.as_deref() == Some(manager))
        .filter_map(|entry| entry.fields_v1.as_ref())
        .filter_map(|fields| fields.0.get("f:spec").and_then(Value::as_object))
        .flat_map(|spec| spec.keys().filter_map(|k| k.strip_prefix("f:")).map(str::to_owned).collect::<Vec<_>>())
        .collect();
    fields.sort();
    fields
}

fn operation_of(object: &DynamicObject, manager: &str) -> Option<String> {
    let entries = object.metadata.managed_fields.iter().flatten();
    entries.filter(|e| e.manager.as_deref() == Some(manager)).find_map(|e| e.operation.clone())
}

#[tokio::test]
async fn two_managers_apply_fields_side_by_side() {
    let env = Env::new("apply-two-managers").await;
    let gadgets = env.api(GADGET);
    let created = gadgets.patch("g", &PatchParams::apply("alpha"), &apply(json!({"size": 1}))).await.unwrap();
    assert_eq!(generation(&created), 1, "apply creates a missing object");
    let both = gadgets.patch("g", &PatchParams::apply("beta"), &apply(json!({"color": "red"}))).await.unwrap();
    assert_eq!(both.data["spec"], json!({"size": 1, "color": "red"}));
    assert_eq!(owned_by(&both, "alpha"), ["size"]);
    assert_eq!(owned_by(&both, "beta"), ["color"]);
    assert_eq!(operation_of(&both, "alpha").as_deref(), Some("Apply"));

    // Applying the same config again changes nothing.
    let again = gadgets.patch("g", &PatchParams::apply("beta"), &apply(json!({"color": "red"}))).await.unwrap();
    assert_eq!(
        (again.metadata.resource_version.clone(), generation(&again)),
        (both.metadata.resource_version.clone(), 2)
    );
}

#[tokio::test]
async fn a_conflicting_apply_is_refused_until_forced() {
    let env = Env::new("apply-conflict").await;
    let gadgets = env.api(GADGET);
    gadgets.patch("g", &PatchParams::apply("alpha"), &apply(json!({"size": 1}))).await.unwrap();
    gadgets.patch("g", &PatchParams::apply("beta"), &apply(json!({"color": "red"}))).await.unwrap();

    let status = refused_with(
        gadgets.patch("g", &PatchParams::apply("beta"), &apply(json!({"color": "red", "size": 2}))).await,
        409,
        "Conflict",
    );
    assert_eq!(status.message, "Apply failed with 1 conflict: conflict with \"alpha\": .spec.size");
    let causes = status.details.expect("details").causes;
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!((causes[0].reason.as_str(), causes[0].field.as_str()), ("FieldManagerConflict", ".spec.size"));
    assert_eq!(causes[0].message, "conflict with \"alpha\"");
    assert_eq!(gadgets.get("g").await.unwrap().data["spec"]["size"], 1, "the refused apply changed nothing");

    // Force takes the field over: alpha no longer owns anything.
    let forced = PatchParams::apply("beta").force();
    let taken = gadgets.patch("g", &forced, &apply(json!({"color": "red", "size": 2}))).await.unwrap();
    assert_eq!(taken.data["spec"], json!({"size": 2, "color": "red"}));
    assert_eq!(owned_by(&taken, "beta"), ["color", "size"]);
    assert!(owned_by(&taken, "alpha").is_empty(), "{:?}", taken.metadata.managed_fields);

    // Now alpha is the one refused, naming beta.
    let status = refused_with(
        gadgets.patch("g", &PatchParams::apply("alpha"), &apply(json!({"size": 1}))).await,
        409,
        "Conflict",
    );
    assert!(status.message.contains("conflict with \"beta\""), "{status:?}");
}

#[tokio::test]
async fn an_apply_conflicts_with_a_field_set_by_an_update() {
    let env = Env::new("apply-vs-update").await;
    let gadgets = env.api(GADGET);
    gadgets.patch("g", &PatchParams::apply("alpha"), &apply(json!({"size": 1}))).await.unwrap();
    let edit = PatchParams { field_manager: Some("editor".into()), ..PatchParams::default() };
    let edited = gadgets.patch("g", &edit, &Patch::Merge(json!({"spec": {"color": "blue"}}))).await.unwrap();
    assert_eq!(owned_by(&edited, "editor"), ["color"]);
    assert_eq!(operation_of(&edited, "editor").as_deref(), Some("Update"));

    let status = refused_with(
        gadgets.patch("g", &PatchParams::apply("alpha"), &apply(json!({"size": 1, "color": "red"}))).await,
        409,
        "Conflict",
    );
    // An Update manager is named with the API version it wrote through.
    assert_eq!(
        status.message,
        format!("Apply failed with 1 conflict: conflict with \"editor\" using {}: .spec.color", super::API_VERSION)
    );
}

#[tokio::test]
async fn a_field_dropped_from_the_applied_config_is_removed_unless_shared() {
    let env = Env::new("apply-remove").await;
    let gadgets = env.api(GADGET);
    gadgets
        .patch("g", &PatchParams::apply("alpha"), &apply(json!({"size": 1, "color": "red", "tags": ["x"]})))
        .await
        .unwrap();
    // beta applies the same size value: both own it (no conflict for equal values).
    let shared = gadgets.patch("g", &PatchParams::apply("beta"), &apply(json!({"size": 1}))).await.unwrap();
    assert_eq!(owned_by(&shared, "beta"), ["size"]);
    assert_eq!(owned_by(&shared, "alpha"), ["color", "size", "tags"]);

    // alpha drops color (only alpha owned it: removed) and size (beta owns it too: kept).
    let dropped = gadgets.patch("g", &PatchParams::apply("alpha"), &apply(json!({"tags": ["x"]}))).await.unwrap();
    assert_eq!(dropped.data["spec"], json!({"size": 1, "tags": ["x"]}));
    assert_eq!(owned_by(&dropped, "alpha"), ["tags"]);
    assert_eq!(owned_by(&dropped, "beta"), ["size"]);
}
