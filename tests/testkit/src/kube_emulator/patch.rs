//! The non-apply PATCH content types: JSON merge patch (RFC 7386), JSON patch
//! (RFC 6902, via the json-patch crate), and an approximation of strategic merge
//! patch for the built-in kinds.
//!
//! Strategic merge approximation: merge-patch semantics, plus lists with a known
//! merge key (by field name: `containers`/`initContainers`/`ephemeralContainers`/
//! `volumes`/`env`/`imagePullSecrets`/`secrets` by `name`, `ports` by
//! `containerPort`, `volumeMounts` by `mountPath`, `ownerReferences` by `uid`)
//! merged element by element, `metadata.finalizers` merged as a set, and the
//! directives `$patch: replace|delete` and `$deleteFromPrimitiveList/<field>`;
//! `$setElementOrder/…` and `$retainKeys` are accepted and ignored. Every other
//! list is replaced, as for lists without a patch strategy.

use serde_json::{Map, Value};

use super::errors::ApiError;

/// The PATCH body formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// Applies a merge, JSON or strategic merge patch to `doc`.
pub fn apply_patch(doc: &mut Value, kind: PatchType, body: &[u8]) -> Result<(), ApiError> {
    match kind {
        PatchType::Merge => {
            let patch: Value = parse(body)?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("merge patch must be a JSON object"));
            }
            json_patch::merge(doc, &patch);
            Ok(())
        }
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body).map_err(|e| {
                ApiError::bad_request(format!("the server rejected our request due to an error in our request: {e}"))
            })?;
            let rejected = || {
                let mut error =
                    ApiError::new(422, "Invalid", "the server rejected our request due to an error in our request");
                error.details = Some(serde_json::json!({}));
                error
            };
            for operation in &patch.0 {
                // As Kubernetes' json-patch: testing a missing path against null
                // succeeds (kube's finalizer helper relies on it).
                if let json_patch::PatchOperation::Test(test) = operation
                    && test.value.is_null()
                {
                    match doc.pointer(test.path.as_str()) {
                        None | Some(Value::Null) => continue,
                        Some(_) => return Err(rejected()),
                    }
                }
                json_patch::patch(doc, std::slice::from_ref(operation)).map_err(|_| rejected())?;
            }
            Ok(())
        }
        PatchType::Strategic => {
            let patch: Value = parse(body)?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("strategic merge patch must be a JSON object"));
            }
            strategic_merge(doc, &patch, None);
            Ok(())
        }
        PatchType::Apply => Err(ApiError::internal("apply patches go through server-side apply")),
    }
}

fn parse(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
}

fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "secrets" => Some("name"),
        "ports" => Some("containerPort"),
        "volumeMounts" => Some("mountPath"),
        "ownerReferences" => Some("uid"),
        _ => None,
    }
}

/// Strategic merge of `patch` into `doc`; `field` names the map entry being merged.
fn strategic_merge(doc: &mut Value, patch: &Value, field: Option<&str>) {
    let Some(patch_map) = patch.as_object() else {
        *doc = patch.clone();
        return;
    };
    if patch_map.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = patch_map.clone();
        replaced.remove("$patch");
        *doc = Value::Object(replaced);
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Some(doc_map) = doc.as_object_mut() else { return };
    for (key, value) in patch_map {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(target) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Some(remove)) = (doc_map.get_mut(target), value.as_array()) {
                list.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if value.is_null() {
            doc_map.remove(key);
            continue;
        }
        let is_finalizers = key == "finalizers" && field == Some("metadata");
        match (doc_map.get_mut(key), value) {
            (Some(existing @ Value::Array(_)), Value::Array(items)) if is_finalizers => {
                if let Value::Array(list) = existing {
                    for item in items {
                        if !list.contains(item) {
                            list.push(item.clone());
                        }
                    }
                }
            }
            (Some(existing @ Value::Array(_)), Value::Array(items)) if merge_key(key).is_some() => {
                let merge_on = merge_key(key).unwrap_or("name");
                merge_keyed_list(existing, items, merge_on);
            }
            (Some(existing @ Value::Object(_)), Value::Object(_)) => strategic_merge(existing, value, Some(key)),
            _ => {
                let mut fresh = Value::Null;
                strategic_merge_new(&mut fresh, value, key);
                doc_map.insert(key.clone(), fresh);
            }
        }
    }
}

/// A patch value for a field the document lacks: directives are stripped.
fn strategic_merge_new(slot: &mut Value, value: &Value, key: &str) {
    match value {
        Value::Object(_) => {
            *slot = Value::Object(Map::new());
            strategic_merge(slot, value, Some(key));
        }
        Value::Array(items) => {
            *slot = Value::Array(
                items.iter().filter(|i| i.get("$patch").and_then(Value::as_str) != Some("delete")).cloned().collect(),
            );
        }
        other => *slot = other.clone(),
    }
}

fn merge_keyed_list(existing: &mut Value, items: &[Value], key: &str) {
    let Value::Array(list) = existing else { return };
    if items.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace")) {
        *list = items.iter().filter(|i| i.get("$patch").is_none()).cloned().collect();
        return;
    }
    for item in items {
        let Some(id) = item.get(key) else {
            list.push(item.clone());
            continue;
        };
        let position = list.iter().position(|e| e.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (position, delete) {
            (Some(i), true) => {
                list.remove(i);
            }
            (Some(i), false) => strategic_merge(&mut list[i], item, None),
            (None, true) => {}
            (None, false) => list.push(item.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_merge_merges_keyed_lists_and_finalizers() {
        let mut doc = json!({
            "metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "secrets": [{"name": "s1"}, {"name": "s2"}],
            "rules": [{"verbs": ["get"]}]
        });
        let patch = json!({
            "metadata": {"finalizers": ["b"], "labels": {"y": null, "z": "3"}},
            "secrets": [{"name": "s3"}, {"name": "s1", "$patch": "delete"}],
            "rules": [{"verbs": ["list"]}]
        });
        apply_patch(&mut doc, PatchType::Strategic, patch.to_string().as_bytes()).expect("patch");
        assert_eq!(
            doc,
            json!({
                "metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "z": "3"}},
                "secrets": [{"name": "s2"}, {"name": "s3"}],
                "rules": [{"verbs": ["list"]}]
            })
        );
    }

    #[test]
    fn json_and_merge_patches() {
        let mut doc = json!({"a": {"b": 1}, "l": [1, 2]});
        apply_patch(&mut doc, PatchType::Merge, br#"{"a":{"b":null,"c":2}}"#).expect("merge");
        apply_patch(&mut doc, PatchType::Json, br#"[{"op":"add","path":"/l/-","value":3}]"#).expect("json");
        assert_eq!(doc, json!({"a": {"c": 2}, "l": [1, 2, 3]}));
        let finalizer = br#"[{"op":"test","path":"/f","value":null},{"op":"add","path":"/f","value":["x"]}]"#;
        apply_patch(&mut doc, PatchType::Json, finalizer).expect("null test on a missing path");
        assert_eq!(doc["f"], json!(["x"]));
        let failed = apply_patch(&mut doc, PatchType::Json, br#"[{"op":"test","path":"/a/c","value":9}]"#);
        assert_eq!(failed.map_err(|e| e.code), Err(422));
    }
}
