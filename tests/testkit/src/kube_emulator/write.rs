//! The write verbs (create, update, patch, server-side apply) as one pipeline:
//! candidate object → identity checks → system metadata carried over → status
//! subresource rules → RBAC escalation check → kind rules → structural schema (CRs)
//! → finalizer rule → managedFields → generation: a [`Prepared`] write, the object
//! fully formed. [`finish`] stores it (no-op detection, removal by emptied
//! finalizers, commit) if the object it was based on is still the stored one, so that
//! admission webhooks can be called between the two without the store lock. Each
//! step runs under the lock, so a write and its watch event are atomic.

use std::sync::Arc;

use serde_json::{Value, json};

use super::access::StoreRbac;
use super::auth::Identity;
use super::builtin;
use super::delete;
use super::errors::{ApiError, Cause};
use super::escalation::{self, RbacWrite};
use super::fields;
use super::meta;
use super::patch::{self, PatchType};
use super::resources::{CRD_GROUP, ResourceInfo};
use super::store::State;

/// What a write addresses.
#[derive(Debug, Clone)]
pub struct Target {
    pub info: Arc<ResourceInfo>,
    /// "" for cluster-scoped resources.
    pub namespace: String,
    /// "" for a create by POST.
    pub name: String,
    pub subresource: Option<String>,
}

impl Target {
    fn sub(&self) -> Option<&str> {
        self.subresource.as_deref()
    }
}

/// Who writes, and when.
pub struct Writer {
    pub manager: String,
    pub now: String,
    pub who: Identity,
}

/// A write checked and fully formed, not yet stored.
#[derive(Debug)]
pub struct Prepared {
    pub target: Target,
    /// The object's name (the target's is "" for a create by POST).
    pub name: String,
    /// The stored object the write replaces (None: a create). [`finish`] stores the
    /// write only while this is still the stored object.
    pub old: Option<Arc<Value>>,
    pub object: Value,
    /// A create by apply: one that finds the object created meanwhile is prepared
    /// again as an update, where a POST fails with AlreadyExists.
    upsert: bool,
    now: String,
}

/// Stores a prepared write. `Ok(None)` when the stored object changed since the
/// write was prepared (the caller prepares it again).
pub fn finish(state: &mut State, prepared: Prepared) -> Result<Option<Arc<Value>>, ApiError> {
    let Prepared { target, name, old, object, upsert, now } = prepared;
    let info = &target.info;
    let current = state.get(&info.storage_key(), &target.namespace, &name);
    let unchanged = match (&old, &current) {
        (None, None) => true,
        // As kube-apiserver, whose storage refuses the create after admission.
        (None, Some(_)) if !upsert => return Err(ApiError::already_exists(info, &name)),
        (Some(old), Some(current)) => meta::resource_version(old) == meta::resource_version(current),
        _ => false,
    };
    if !unchanged {
        return Ok(None);
    }
    let Some(old) = old else {
        check_namespace_open(state, &target, &name)?;
        return Ok(Some(commit(state, info, &target.namespace, object, &now)));
    };
    if without_rv(&object) == without_rv(&old) {
        return Ok(Some(old));
    }
    let mut new = object;
    if meta::is_deleting(&new) && delete::may_remove(state, info, &new) {
        // As kube-apiserver: emptied finalizers delete the object (one DELETED
        // event carrying the last stored state); the response shows the update.
        delete::remove_now(state, info, &target.namespace, &name);
        let old_rv = meta::resource_version(&old).to_owned();
        meta::metadata_mut(&mut new).insert("resourceVersion".into(), json!(old_rv));
        return Ok(Some(Arc::new(new)));
    }
    Ok(Some(commit(state, info, &target.namespace, new, &now)))
}

/// What [`finish`] would store, without storing it (`dryRun=All`): the same
/// AlreadyExists and closed-namespace checks, nothing written, no event.
pub fn finish_dry(state: &State, prepared: Prepared) -> Result<Value, ApiError> {
    let Prepared { target, name, old, object, upsert, now: _ } = prepared;
    let current = state.get(&target.info.storage_key(), &target.namespace, &name);
    if old.is_none() {
        if current.is_some() && !upsert {
            return Err(ApiError::already_exists(&target.info, &name));
        }
        check_namespace_open(state, &target, &name)?;
    }
    Ok(object)
}

/// kube-apiserver's RBAC escalation prevention for writes of roles and bindings.
fn check_escalation(
    state: &State,
    writer: &Writer,
    target: &Target,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), ApiError> {
    let write = RbacWrite { info: &target.info, namespace: &target.namespace, url_name: &target.name, old, new };
    escalation::check(&StoreRbac(state), &writer.who, &write)
}

/// The object as a client of `info`'s version sees it.
pub fn present(info: &ResourceInfo, object: &Arc<Value>) -> Arc<Value> {
    let wanted = info.api_version();
    if object.get("apiVersion").and_then(Value::as_str) == Some(wanted.as_str()) {
        return object.clone();
    }
    let mut copy = (**object).clone();
    copy["apiVersion"] = json!(wanted);
    Arc::new(copy)
}

fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the request body is not a JSON object (the emulator accepts JSON only): {e}"))
    })?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// Checks apiVersion/kind of a request body and fills them when absent.
fn check_type(info: &ResourceInfo, object: &mut Value) -> Result<(), ApiError> {
    let expected = info.api_version();
    match object.get("apiVersion").and_then(Value::as_str) {
        Some(given) if !given.is_empty() && given != expected => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({given}) does not match the expected API version ({expected})"
            )));
        }
        _ => {}
    }
    match object.get("kind").and_then(Value::as_str) {
        Some(given) if !given.is_empty() && given != info.kind => {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({given}) does not match the expected kind ({})",
                info.kind
            )));
        }
        _ => {}
    }
    object["apiVersion"] = json!(info.storage_api_version());
    object["kind"] = json!(info.kind);
    Ok(())
}

/// Body namespace against the URL's; fills it in (or clears it, cluster-scoped).
/// `create` picks the message the real server gives on create.
fn check_namespace(target: &Target, object: &mut Value, create: bool) -> Result<(), ApiError> {
    let given = meta::meta_str(object, "namespace").to_owned();
    if !target.info.namespaced {
        meta::metadata_mut(object).remove("namespace");
        return Ok(());
    }
    if !given.is_empty() && given != target.namespace && create {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    if !given.is_empty() && given != target.namespace {
        return Err(ApiError::bad_request(format!(
            "the namespace of the object ({given}) does not match the namespace on the request ({})",
            target.namespace
        )));
    }
    meta::metadata_mut(object).insert("namespace".into(), json!(target.namespace));
    Ok(())
}

/// The namespace of a namespaced create must exist and not be terminating.
fn check_namespace_open(state: &State, target: &Target, name: &str) -> Result<(), ApiError> {
    if !target.info.namespaced {
        return Ok(());
    }
    match state.get("/namespaces", "", &target.namespace) {
        None => Err(ApiError::new(404, "NotFound", format!("namespaces \"{}\" not found", target.namespace))
            .with_resource_details(target.namespace.as_str(), "", "namespaces")),
        Some(ns) if meta::is_deleting(&ns) => Err(ApiError::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                target.info.qualified(),
                target.namespace
            ),
        )
        .with_resource_details(name, &target.info.group, &target.info.plural)),
        Some(_) => Ok(()),
    }
}

impl ApiError {
    fn with_resource_details(mut self, name: &str, group: &str, kind: &str) -> ApiError {
        let mut details = serde_json::Map::new();
        details.insert("name".into(), json!(name));
        if !group.is_empty() {
            details.insert("group".into(), json!(group));
        }
        details.insert("kind".into(), json!(kind));
        self.details = Some(Value::Object(details));
        self
    }
}

/// What decoding does to a request body before anything else looks at it:
/// kind defaults (Secret `stringData`, …) and, for custom resources, pruning
/// and schema defaults. Field management sees the result.
fn decode(info: &ResourceInfo, object: &mut Value) -> Result<(), ApiError> {
    builtin::decode(info, object)?;
    if let Some(schema) = info.custom.as_ref().and_then(|c| c.schema.as_ref()) {
        schema.prune(object, true);
        schema.apply_defaults(object);
    }
    Ok(())
}

/// Validation of a custom resource against its schema.
fn validate_schema(info: &ResourceInfo, object: &Value) -> Result<(), ApiError> {
    let Some(schema) = info.custom.as_ref().and_then(|c| c.schema.as_ref()) else { return Ok(()) };
    let causes = schema.validate_root(object);
    if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid_object(info, meta::name(object), causes)) }
}

/// POST: a new object.
pub fn create(state: &State, writer: &Writer, target: &Target, body: &[u8]) -> Result<Prepared, ApiError> {
    let mut object = parse_object(body)?;
    check_type(&target.info, &mut object)?;
    create_object(state, writer, target, object, false)
}

fn create_object(
    state: &State,
    writer: &Writer,
    target: &Target,
    mut object: Value,
    fields_done: bool,
) -> Result<Prepared, ApiError> {
    let info = &target.info;
    check_namespace(target, &mut object, true)?;
    let mut name = meta::name(&object).to_owned();
    let generate = meta::meta_str(&object, "generateName").to_owned();
    if name.is_empty() && !generate.is_empty() {
        loop {
            name = format!("{generate}{}", meta::random_suffix());
            if state.get(&info.storage_key(), &target.namespace, &name).is_none() {
                break;
            }
        }
    }
    if name.is_empty() {
        return Err(ApiError::invalid_object(
            info,
            "",
            vec![Cause::new("FieldValueRequired", "metadata.name", "Required value: name or generateName is required")],
        ));
    }
    let causes = meta::validate_name(&name, info.name_rule);
    if !causes.is_empty() {
        return Err(ApiError::invalid_object(info, &name, causes));
    }
    check_namespace_open(state, target, &name)?;
    let metadata = meta::metadata_mut(&mut object);
    metadata.insert("name".into(), json!(name));
    metadata.insert("uid".into(), json!(meta::new_uid()));
    metadata.insert("creationTimestamp".into(), json!(writer.now));
    for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
        metadata.remove(field);
    }
    if info.uses_generation {
        metadata.insert("generation".into(), json!(1));
    } else {
        metadata.remove("generation");
    }
    // kube-apiserver v1.20 order: decode, field management, then the strategy
    // (status dropped, kind rules) and validation.
    decode(info, &mut object)?;
    if !fields_done {
        fields::record_update(None, &mut object, &writer.manager, None, &writer.now);
    }
    if info.status_subresource
        && info.is_custom()
        && let Some(map) = object.as_object_mut()
    {
        map.remove("status");
    }
    check_escalation(state, writer, target, None, &object)?;
    builtin::prepare(info, None, &mut object, &writer.now)?;
    validate_schema(info, &object)?;
    Ok(Prepared { target: target.clone(), name, old: None, object, upsert: fields_done, now: writer.now.clone() })
}

/// Stores an object and runs what follows from it (default ServiceAccount of a
/// new namespace, registry of a CRD).
pub fn commit(state: &mut State, info: &ResourceInfo, namespace: &str, object: Value, now: &str) -> Arc<Value> {
    let created = state.get(&info.storage_key(), namespace, meta::name(&object)).is_none();
    let stored = state.put(&info.storage_key(), namespace, object);
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "namespaces") if created => {
            let name = meta::name(&stored).to_owned();
            if state.get("/serviceaccounts", &name, "default").is_none() {
                state.put("/serviceaccounts", &name, builtin::default_service_account(&name, now));
            }
        }
        (CRD_GROUP, "customresourcedefinitions") => {
            let served = super::crd::served_resources(&stored);
            // The resource's history starts when it is first served, as a watch
            // cache starts with its first list.
            if let Some(info) = served.first() {
                state.table(&info.storage_key());
            }
            state.registry.set_crd(meta::name(&stored), served);
        }
        _ => {}
    }
    if created {
        super::gc::collect_if_orphaned(state, info, namespace, &stored);
    }
    stored
}

/// PUT: replaces an object (optimistic concurrency when the body has a resourceVersion).
pub fn update(state: &State, writer: &Writer, target: &Target, body: &[u8]) -> Result<Prepared, ApiError> {
    let mut object = parse_object(body)?;
    check_type(&target.info, &mut object)?;
    let given = meta::name(&object).to_owned();
    if given != target.name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({given}) does not match the name on the URL ({})",
            target.name
        )));
    }
    check_namespace(target, &mut object, false)?;
    let old = state
        .get(&target.info.storage_key(), &target.namespace, &target.name)
        .ok_or_else(|| ApiError::not_found(&target.info, &target.name))?;
    if target.info.is_custom() && meta::resource_version(&object).is_empty() {
        // Custom resources allow no unconditional update.
        return Err(ApiError::invalid(
            &target.info.plural,
            &target.info.group,
            &target.name,
            vec![Cause::new(
                "FieldValueInvalid",
                "metadata.resourceVersion",
                "Invalid value: 0x0: must be specified for an update",
            )],
        ));
    }
    store_update(state, writer, target, &old, object, false)
}

/// PATCH: merge, JSON, strategic merge, or server-side apply (which creates when
/// the object does not exist: then `old` of the result is None).
pub fn patch(
    state: &State,
    writer: &Writer,
    target: &Target,
    patch_type: PatchType,
    body: &[u8],
    force: bool,
) -> Result<Prepared, ApiError> {
    let info = &target.info;
    let old = state.get(&info.storage_key(), &target.namespace, &target.name);
    if patch_type == PatchType::Apply {
        let mut applied = parse_object(body)?;
        check_type(info, &mut applied)?;
        meta::metadata_mut(&mut applied).insert("name".into(), json!(target.name));
        if info.namespaced {
            check_namespace(target, &mut applied, old.is_none())?;
        }
        let live = old.as_ref().map(|o| present(info, o));
        let mut merged =
            fields::server_side_apply(live.as_deref(), &applied, &writer.manager, force, target.sub(), &writer.now)?;
        merged["apiVersion"] = json!(info.storage_api_version());
        return match old {
            None => {
                if target.sub().is_some() {
                    return Err(ApiError::not_found(info, &target.name));
                }
                create_object(state, writer, target, merged, true)
            }
            Some(old) => store_update(state, writer, target, &old, merged, true),
        };
    }
    let old = old.ok_or_else(|| ApiError::not_found(info, &target.name))?;
    if patch_type == PatchType::Strategic && info.is_custom() {
        return Err(ApiError::unsupported_media_type(&[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ]));
    }
    let mut candidate = (*present(info, &old)).clone();
    patch::apply_patch(&mut candidate, patch_type, body)?;
    // A patch that sets a resourceVersion is conditional on it; otherwise it is not.
    let patched_rv = meta::resource_version(&candidate).to_owned();
    if patched_rv == meta::resource_version(&old) {
        meta::metadata_mut(&mut candidate).remove("resourceVersion");
    }
    candidate["apiVersion"] = json!(info.storage_api_version());
    candidate["kind"] = json!(info.kind);
    store_update(state, writer, target, &old, candidate, false)
}

/// Everything but metadata (and status, when it is a subresource).
fn spec_part(info: &ResourceInfo, object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        map.remove("metadata");
        if info.status_subresource {
            map.remove("status");
        }
    }
    copy
}

/// The object as no-op detection compares it: without its resourceVersion and
/// without the times of managedFields entries (a write that changes nothing but
/// the clock is a no-op, as kube-apiserver treats it; otherwise the outcome
/// would depend on whether two writes fall in the same second).
fn without_rv(object: &Value) -> Value {
    let mut copy = object.clone();
    let metadata = meta::metadata_mut(&mut copy);
    metadata.remove("resourceVersion");
    if let Some(Value::Array(entries)) = metadata.get_mut("managedFields") {
        for entry in entries.iter_mut() {
            if let Some(entry) = entry.as_object_mut() {
                entry.remove("time");
            }
        }
    }
    copy
}

/// The shared tail of update, patch and apply on an existing object.
fn store_update(
    state: &State,
    writer: &Writer,
    target: &Target,
    old: &Arc<Value>,
    candidate: Value,
    fields_done: bool,
) -> Result<Prepared, ApiError> {
    let info = &target.info;
    let given_rv = meta::resource_version(&candidate);
    if !given_rv.is_empty() && given_rv != meta::resource_version(old) {
        return Err(ApiError::conflict(info, &target.name));
    }
    let given_uid = meta::uid(&candidate);
    if !given_uid.is_empty() && given_uid != meta::uid(old) {
        return Err(ApiError::conflict_because(
            info,
            &target.name,
            &format!("Precondition failed: UID in precondition: {}, UID in object meta: {given_uid}", meta::uid(old)),
        ));
    }
    let mut candidate = candidate;
    decode(info, &mut candidate)?;
    // namespaces/finalize changes spec.finalizers and nothing else.
    let finalize = (target.sub() == Some("finalize"))
        .then(|| candidate.pointer("/spec/finalizers").cloned().unwrap_or(Value::Null));
    if !fields_done {
        fields::record_update(Some(old), &mut candidate, &writer.manager, target.sub(), &writer.now);
    }
    let mut new = if target.sub() == Some("status") {
        let mut new = (**old).clone();
        match candidate.get("status") {
            Some(status) => new["status"] = status.clone(),
            None => {
                if let Some(map) = new.as_object_mut() {
                    map.remove("status");
                }
            }
        }
        if let Some(managed) = candidate.pointer("/metadata/managedFields") {
            meta::metadata_mut(&mut new).insert("managedFields".into(), managed.clone());
        }
        new
    } else {
        let mut new = candidate;
        if info.status_subresource
            && let Some(map) = new.as_object_mut()
        {
            match old.get("status") {
                Some(status) => map.insert("status".into(), status.clone()),
                None => map.remove("status"),
            };
        }
        let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
        let metadata = meta::metadata_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "name",
            "namespace",
        ] {
            match old_meta.get(field) {
                Some(value) => metadata.insert(field.into(), value.clone()),
                None => metadata.remove(field),
            };
        }
        metadata.remove("selfLink");
        new
    };
    check_escalation(state, writer, target, Some(old), &new)?;
    builtin::prepare(info, Some(old), &mut new, &writer.now)?;
    if let Some(finalizers) = finalize {
        let mut finalized = (**old).clone();
        finalized["spec"] = if finalizers.is_null() { json!({}) } else { json!({ "finalizers": finalizers }) };
        if let Some(managed) = new.pointer("/metadata/managedFields") {
            meta::metadata_mut(&mut finalized).insert("managedFields".into(), managed.clone());
        }
        new = finalized;
    }
    validate_schema(info, &new)?;
    if meta::is_deleting(old) {
        let before = meta::finalizers(old);
        let added: Vec<String> = meta::finalizers(&new).into_iter().filter(|f| !before.contains(f)).collect();
        if !added.is_empty() {
            let quoted: Vec<String> = added.iter().map(|f| format!("\"{f}\"")).collect();
            let message = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                quoted.join(", ")
            );
            return Err(ApiError::invalid_object(
                info,
                &target.name,
                vec![Cause::new("FieldValueForbidden", "metadata.finalizers", message)],
            ));
        }
    }
    // The generation moves only with the spec, so a no-op write (found by `finish`)
    // keeps it.
    if info.uses_generation && spec_part(info, &new) != spec_part(info, old) {
        let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        meta::metadata_mut(&mut new).insert("generation".into(), json!(generation + 1));
    }
    Ok(Prepared {
        target: target.clone(),
        name: target.name.clone(),
        old: Some(old.clone()),
        object: new,
        upsert: false,
        now: writer.now.clone(),
    })
}
