//! `dryRun=All`: a write or delete goes through every check (authorization,
//! validation, defaults, server-side apply, admission webhooks) and answers what it
//! would have stored, but nothing is stored, no resourceVersion is taken and no
//! watch event is sent, as kube-apiserver does.

use std::sync::Arc;

use serde_json::{Value, json};

use super::delete::{self, DeleteOptions};
use super::errors::ApiError;
use super::meta;
use super::resources::ResourceInfo;
use super::store::State;

/// Whether the request asks for a dry run; any value but `All` is refused as the
/// real server refuses it.
pub fn requested(value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => {
            Err(ApiError::bad_request(format!("Invalid dry run value: \"{other}\": supported values: \"All\"")))
        }
    }
}

/// Whether a DELETE asks for a dry run, in its query or (as kube sends it) in its
/// `DeleteOptions` body's `dryRun` list.
pub fn requested_in_delete(query: Option<&str>, body: &[u8]) -> Result<bool, ApiError> {
    if requested(query)? {
        return Ok(true);
    }
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match options.get("dryRun").and_then(Value::as_array) {
        Some(values) => values.iter().try_fold(false, |any, value| Ok(any | requested(value.as_str())?)),
        None => Ok(false),
    }
}

/// What a DELETE would answer, the object left as it is: held by finalizers, the
/// object marked as deleting; otherwise the object itself.
pub fn delete(
    state: &State,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    options: &DeleteOptions,
    now: &str,
) -> Result<(Arc<Value>, bool), ApiError> {
    let object = delete::check(state, info, namespace, name, options)?;
    let held = object.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
    if !held {
        return Ok((object, false));
    }
    let mut copy = (*object).clone();
    let metadata = meta::metadata_mut(&mut copy);
    if !metadata.contains_key("deletionTimestamp") {
        metadata.insert("deletionTimestamp".into(), json!(now));
        metadata.insert("deletionGracePeriodSeconds".into(), json!(0));
    }
    Ok((Arc::new(copy), true))
}
