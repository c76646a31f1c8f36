//! Kind-specific rules of the built-in kinds, applied on every write before the
//! object is stored: Secret `stringData` folded into base64 `data` (and data
//! validated), config keys checked, Namespace phase and `kubernetes` finalizer,
//! immutable `roleRef`, CRD defaulting/validation/status. Also what exists at
//! start (the four system namespaces, bootstrap RBAC) and what the
//! controller-manager would add (a `default` ServiceAccount per namespace).

use base64::Engine;
use serde_json::{Map, Value, json};

use super::crd;
use super::errors::{ApiError, Cause};
use super::meta;
use super::resources::{ADMISSION_GROUP, CRD_GROUP, RBAC_GROUP, Registry, ResourceInfo};
use super::store::State;
use super::write::commit;

fn valid_config_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn check_keys(map: Option<&Map<String, Value>>, field: &str, causes: &mut Vec<Cause>) {
    for key in map.into_iter().flat_map(|m| m.keys()) {
        if !valid_config_key(key) {
            causes.push(Cause::new(
                "FieldValueInvalid",
                format!("{field}[{key}]"),
                format!("Invalid value: \"{key}\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"),
            ));
        }
    }
}

/// What kube-apiserver does while decoding a body, before field management:
/// defaulting (Secret type, Namespace phase, CRD defaults) and Secret
/// `stringData` folded into base64 `data` (a conversion step).
pub fn decode(info: &ResourceInfo, object: &mut Value) -> Result<(), ApiError> {
    drop_empty_metadata(object);
    if !info.is_custom()
        && let Some(map) = object.as_object_mut()
    {
        // Typed kinds: `omitempty` drops null and empty optional fields.
        for field in ["data", "stringData", "binaryData", "secrets", "imagePullSecrets", "subjects"] {
            if map.get(field).is_some_and(is_empty) {
                map.remove(field);
            }
        }
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "secrets") => decode_secret(object),
        ("", "namespaces") => {
            if object.pointer("/status/phase").is_none_or(|p| p.as_str().is_none_or(str::is_empty)) {
                if !object.get("status").is_some_and(Value::is_object) {
                    object["status"] = json!({});
                }
                object["status"]["phase"] = json!("Active");
            }
            Ok(())
        }
        (CRD_GROUP, "customresourcedefinitions") => {
            crd::apply_defaults(object);
            Ok(())
        }
        (ADMISSION_GROUP, "validatingwebhookconfigurations") => {
            default_webhooks(object);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The `admissionregistration.k8s.io/v1` defaults of each webhook.
fn default_webhooks(object: &mut Value) {
    let Some(Value::Array(webhooks)) = object.get_mut("webhooks") else { return };
    for webhook in webhooks.iter_mut().filter_map(Value::as_object_mut) {
        for (field, default) in [
            ("failurePolicy", json!("Fail")),
            ("matchPolicy", json!("Equivalent")),
            ("namespaceSelector", json!({})),
            ("objectSelector", json!({})),
            ("timeoutSeconds", json!(10)),
        ] {
            if webhook.get(field).is_none_or(Value::is_null) {
                webhook.insert(field.to_owned(), default);
            }
        }
        if let Some(Value::Object(service)) = webhook.get_mut("clientConfig").and_then(|c| c.get_mut("service")) {
            service.entry("port").or_insert(json!(443));
        }
        if let Some(Value::Array(rules)) = webhook.get_mut("rules") {
            for rule in rules.iter_mut().filter_map(Value::as_object_mut) {
                rule.entry("scope").or_insert(json!("*"));
            }
        }
    }
}

/// What the real validation of a ValidatingWebhookConfiguration refuses most often:
/// no `sideEffects` (or one v1 does not allow), no `admissionReviewVersions`, not
/// exactly one of `clientConfig.url` and `clientConfig.service`.
fn validate_webhooks(object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let webhooks = object.get("webhooks").and_then(Value::as_array).into_iter().flatten();
    for (i, webhook) in webhooks.enumerate() {
        match webhook.get("sideEffects").and_then(Value::as_str) {
            None => causes.push(Cause::new(
                "FieldValueRequired",
                format!("webhooks[{i}].sideEffects"),
                "Required value: must specify one of None, NoneOnDryRun",
            )),
            Some("None" | "NoneOnDryRun") => {}
            Some(other) => causes.push(Cause::new(
                "FieldValueNotSupported",
                format!("webhooks[{i}].sideEffects"),
                format!("Unsupported value: \"{other}\": supported values: \"None\", \"NoneOnDryRun\""),
            )),
        }
        if webhook.get("admissionReviewVersions").and_then(Value::as_array).is_none_or(Vec::is_empty) {
            causes.push(Cause::new(
                "FieldValueRequired",
                format!("webhooks[{i}].admissionReviewVersions"),
                "Required value: must specify one of v1, v1beta1",
            ));
        }
        let client = webhook.get("clientConfig").unwrap_or(&Value::Null);
        if client.get("url").is_some() == client.get("service").is_some() {
            causes.push(Cause::new(
                "FieldValueRequired",
                format!("webhooks[{i}].clientConfig"),
                "Required value: exactly one of url or service is required",
            ));
        }
    }
    causes
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(list) => list.is_empty(),
        _ => false,
    }
}

/// ObjectMeta is typed for every kind: null and empty optional fields vanish.
fn drop_empty_metadata(object: &mut Value) {
    if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
        metadata.retain(|_, value| !is_empty(value));
    }
}

fn decode_secret(object: &mut Value) -> Result<(), ApiError> {
    let engine = base64::engine::general_purpose::STANDARD;
    let Some(object) = object.as_object_mut() else { return Ok(()) };
    if let Some(string_data) = object.remove("stringData") {
        let data = object.entry("data").or_insert_with(|| json!({}));
        if !data.is_object() {
            *data = json!({});
        }
        if let (Some(data), Some(strings)) = (data.as_object_mut(), string_data.as_object()) {
            for (key, value) in strings {
                let text = value.as_str().unwrap_or_default();
                data.insert(key.clone(), json!(engine.encode(text)));
            }
        }
    }
    if let Some(Value::Object(data)) = object.get("data") {
        for value in data.values() {
            let decoded = value.as_str().map(|s| engine.decode(s));
            if !matches!(decoded, Some(Ok(_))) && !value.is_null() {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: v1.Secret.Data: decode base64: illegal base64 data in {value}"
                )));
            }
        }
    }
    if !object.contains_key("type") {
        object.insert("type".into(), json!("Opaque"));
    }
    Ok(())
}

/// Kind-specific preparation of an object about to be stored (the strategy).
pub fn prepare(info: &ResourceInfo, old: Option<&Value>, new: &mut Value, now: &str) -> Result<(), ApiError> {
    let name = meta::name(new).to_owned();
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "secrets") => prepare_secret(info, old, new, &name),
        ("", "configmaps") => {
            let mut causes = Vec::new();
            check_keys(new.get("data").and_then(Value::as_object), "data", &mut causes);
            check_keys(new.get("binaryData").and_then(Value::as_object), "binaryData", &mut causes);
            if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid_object(info, &name, causes)) }
        }
        ("", "namespaces") => {
            match old {
                None => {
                    new["spec"] = json!({"finalizers": ["kubernetes"]});
                    new["status"] = json!({"phase": "Active"});
                }
                Some(old) => {
                    new["spec"] = old.get("spec").cloned().unwrap_or(json!({}));
                }
            }
            Ok(())
        }
        (RBAC_GROUP, "rolebindings" | "clusterrolebindings") => {
            if let Some(old) = old
                && old.get("roleRef") != new.get("roleRef")
            {
                let shown = new.get("roleRef").map(Value::to_string).unwrap_or_default();
                return Err(ApiError::invalid_object(
                    info,
                    &name,
                    vec![Cause::new(
                        "FieldValueInvalid",
                        "roleRef",
                        format!("Invalid value: {shown}: cannot change roleRef"),
                    )],
                ));
            }
            Ok(())
        }
        (ADMISSION_GROUP, "validatingwebhookconfigurations") => {
            let causes = validate_webhooks(new);
            if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid_object(info, &name, causes)) }
        }
        (CRD_GROUP, "customresourcedefinitions") => {
            let causes = crd::validate(new);
            if !causes.is_empty() {
                return Err(ApiError::invalid_object(info, &name, causes));
            }
            if let Some(old) = old
                && old.pointer("/spec/scope") != new.pointer("/spec/scope")
            {
                return Err(ApiError::invalid_object(
                    info,
                    &name,
                    vec![Cause::new(
                        "FieldValueInvalid",
                        "spec.scope",
                        format!(
                            "Invalid value: {}: field is immutable",
                            new.pointer("/spec/scope").cloned().unwrap_or_default()
                        ),
                    )],
                ));
            }
            crd::set_status(new, now);
            Ok(())
        }
        _ => Ok(()),
    }
}

fn prepare_secret(info: &ResourceInfo, old: Option<&Value>, new: &mut Value, name: &str) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    check_keys(new.get("data").and_then(Value::as_object), "data", &mut causes);
    if let Some(old) = old
        && old.get("type") != new.get("type")
    {
        let shown = new.get("type").and_then(Value::as_str).unwrap_or("");
        causes.push(Cause::new("FieldValueInvalid", "type", format!("Invalid value: \"{shown}\": field is immutable")));
    }
    if causes.is_empty() { Ok(()) } else { Err(ApiError::invalid_object(info, name, causes)) }
}

/// The names of the namespaces that exist at start.
pub const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-node-lease", "kube-public", "kube-system"];

/// The `default` ServiceAccount the controller-manager creates in each namespace.
pub fn default_service_account(namespace: &str, now: &str) -> Value {
    json!({
        "kind": "ServiceAccount",
        "apiVersion": "v1",
        "metadata": {
            "name": "default",
            "namespace": namespace,
            "uid": meta::new_uid(),
            "creationTimestamp": now,
        }
    })
}

/// A Namespace object as kube-apiserver creates it.
pub fn namespace(name: &str, now: &str) -> Value {
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": { "name": name, "uid": meta::new_uid(), "creationTimestamp": now },
        "spec": { "finalizers": ["kubernetes"] },
        "status": { "phase": "Active" }
    })
}

/// The answer to a TokenRequest.
pub fn token_request_response(request: &Value, token: &str, expires_unix: i64, expiration_seconds: i64) -> Value {
    let audiences =
        request.pointer("/spec/audiences").cloned().unwrap_or(json!(["https://kubernetes.default.svc.cluster.local"]));
    json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": { "creationTimestamp": null },
        "spec": {
            "audiences": audiences,
            "expirationSeconds": expiration_seconds,
            "boundObjectRef": request.pointer("/spec/boundObjectRef").cloned().unwrap_or(Value::Null),
        },
        "status": { "token": token, "expirationTimestamp": meta::rfc3339(expires_unix) }
    })
}

/// What exists when the emulator starts: the system namespaces (each with its
/// `default` ServiceAccount) and the bootstrap RBAC objects.
pub fn bootstrap(state: &mut State, rbac_objects: Vec<Value>) {
    let now = meta::now_rfc3339();
    let registry = Registry::new();
    for info in registry.storage_entries() {
        state.table(&info.storage_key());
    }
    if let Some(namespaces) = registry.lookup("", "v1", "namespaces") {
        for name in SYSTEM_NAMESPACES {
            commit(state, &namespaces, "", namespace(name, &now), &now);
        }
    }
    for mut object in rbac_objects {
        let plural = match object.get("kind").and_then(Value::as_str) {
            Some("ClusterRole") => "clusterroles",
            Some("ClusterRoleBinding") => "clusterrolebindings",
            Some("Role") => "roles",
            Some("RoleBinding") => "rolebindings",
            _ => continue,
        };
        let namespace = meta::meta_str(&object, "namespace").to_owned();
        let metadata = meta::metadata_mut(&mut object);
        metadata.entry("uid").or_insert_with(|| json!(meta::new_uid()));
        metadata.entry("creationTimestamp").or_insert_with(|| json!(now));
        object["apiVersion"] = json!(format!("{RBAC_GROUP}/v1"));
        state.put(&format!("{RBAC_GROUP}/{plural}"), &namespace, object);
    }
}

#[cfg(test)]
mod tests {
    use super::super::resources::builtins;
    use super::*;

    fn info(plural: &str) -> ResourceInfo {
        builtins().into_iter().find(|i| i.plural == plural).expect("builtin")
    }

    #[test]
    fn secrets_fold_string_data_and_reject_bad_base64() {
        let mut secret = json!({"metadata": {"name": "s"}, "data": {"a": "eA=="}, "stringData": {"b": "y"}});
        decode(&info("secrets"), &mut secret).expect("valid");
        prepare(&info("secrets"), None, &mut secret, "now").expect("valid");
        assert_eq!(secret, json!({"metadata": {"name": "s"}, "data": {"a": "eA==", "b": "eQ=="}, "type": "Opaque"}));
        let mut bad = json!({"metadata": {"name": "s"}, "data": {"a": "not base64!"}});
        assert_eq!(decode(&info("secrets"), &mut bad).map_err(|e| e.code), Err(400));
    }
}
