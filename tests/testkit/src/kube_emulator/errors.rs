//! Errors as the API server reports them: every failure leaves the emulator as a
//! `Status` object (kind Status, apiVersion v1, status Failure, message, reason,
//! details, code) with the reasons, codes and message formats kube-apiserver v1.20
//! uses, because clients (kube's `ErrorResponse`, kubectl) branch on them.

use std::borrow::Cow;

use serde_json::{Value, json};

use super::resources::ResourceInfo;

/// One entry of `details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

impl Cause {
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Cause {
        Cause { reason, message: message.into(), field: field.into() }
    }

    /// `field: message`, as the causes appear joined in an Invalid message.
    fn summary(&self) -> String {
        if self.field.is_empty() { self.message.clone() } else { format!("{}: {}", self.field, self.message) }
    }
}

/// A failed request, rendered as a `Status`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    /// A `StatusReason`; borrowed for the server's own, owned for one a webhook gave.
    pub reason: Cow<'static, str>,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { code, reason: Cow::Borrowed(reason), message: message.into(), details: None }
    }

    /// An error whose reason comes from elsewhere (a webhook's `Status`).
    pub fn with_reason(code: u16, reason: String, message: impl Into<String>) -> ApiError {
        ApiError { code, reason: Cow::Owned(reason), message: message.into(), details: None }
    }

    pub fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// `{"name":…, "group":…, "kind": plural}` as the storage layer reports it.
    fn resource_details(info: &ResourceInfo, name: &str) -> Value {
        let mut details = serde_json::Map::new();
        if !name.is_empty() {
            details.insert("name".into(), json!(name));
        }
        if !info.group.is_empty() {
            details.insert("group".into(), json!(info.group));
        }
        details.insert("kind".into(), json!(info.plural));
        Value::Object(details)
    }

    pub fn not_found(info: &ResourceInfo, name: &str) -> ApiError {
        ApiError::new(404, "NotFound", format!("{} \"{name}\" not found", info.qualified()))
            .with_details(Self::resource_details(info, name))
    }

    /// A path that names no served resource.
    pub fn no_such_resource() -> ApiError {
        ApiError::new(404, "NotFound", "the server could not find the requested resource").with_details(json!({}))
    }

    pub fn already_exists(info: &ResourceInfo, name: &str) -> ApiError {
        ApiError::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", info.qualified()))
            .with_details(Self::resource_details(info, name))
    }

    /// Optimistic concurrency failure (stale resourceVersion).
    pub fn conflict(info: &ResourceInfo, name: &str) -> ApiError {
        Self::conflict_because(
            info,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict_because(info: &ResourceInfo, name: &str, why: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {} \"{name}\": {why}", info.qualified()),
        )
        .with_details(Self::resource_details(info, name))
    }

    /// 422 Invalid: `Kind[.group] "name" is invalid: cause` or `…: [cause, cause]`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> ApiError {
        let qualified_kind = if group.is_empty() { kind.to_owned() } else { format!("{kind}.{group}") };
        let summaries: Vec<String> = causes.iter().map(Cause::summary).collect();
        let joined = match summaries.len() {
            1 => summaries[0].clone(),
            _ => format!("[{}]", summaries.join(", ")),
        };
        let mut details = serde_json::Map::new();
        if !name.is_empty() {
            details.insert("name".into(), json!(name));
        }
        if !group.is_empty() {
            details.insert("group".into(), json!(group));
        }
        if !kind.is_empty() {
            details.insert("kind".into(), json!(kind));
        }
        details.insert(
            "causes".into(),
            Value::Array(
                causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect(),
            ),
        );
        ApiError::new(422, "Invalid", format!("{qualified_kind} \"{name}\" is invalid: {joined}"))
            .with_details(Value::Object(details))
    }

    pub fn invalid_object(info: &ResourceInfo, name: &str, causes: Vec<Cause>) -> ApiError {
        Self::invalid(&info.kind, &info.group, name, causes)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: String, details: Value) -> ApiError {
        ApiError::new(403, "Forbidden", message).with_details(details)
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            .with_details(json!({}))
    }

    pub fn unsupported_media_type(accepted: &[&str]) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// The watch event of a resourceVersion older than the kept history.
    pub fn expired(requested: u64, oldest: u64) -> ApiError {
        ApiError::new(410, "Expired", format!("too old resource version: {requested} ({oldest})"))
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The `Status` object for this error.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        if self.reason.is_empty()
            && let Some(map) = status.as_object_mut()
        {
            // `reason` is omitempty: a webhook's denial may come without one.
            map.remove("reason");
        }
        status
    }
}

/// The `Status` a successful DELETE answers with when the object is gone.
pub fn success_status(info: &ResourceInfo, name: &str, uid: &str) -> Value {
    let mut details = serde_json::Map::new();
    details.insert("name".into(), json!(name));
    if !info.group.is_empty() {
        details.insert("group".into(), json!(info.group));
    }
    details.insert("kind".into(), json!(info.plural));
    details.insert("uid".into(), json!(uid));
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}
