//! The parts of an Application the stand-in reads, taken leniently from its JSON.
//!
//! The API server validates Applications against the CRD schema, but the stand-in
//! must not trust that (the emulator, an older CRD, a hand-made object): every
//! field is read with a default, so an odd object is refused or reported, never a
//! reason to panic or to stop the controller.

use serde_json::Value;

/// The string at JSON pointer `pointer`, or "" when absent or not a string.
pub fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `spec.source` of an Application (single-source only).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    pub repo_url: String,
    pub path: String,
    /// `targetRevision`, defaulted to `HEAD` as Argo CD does.
    pub target_revision: String,
}

/// `spec.destination` of an Application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destination {
    pub server: String,
    pub namespace: String,
    pub name: String,
}

/// What the stand-in needs of an Application's spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppSpec {
    /// `spec.project`, defaulted to `default` as Argo CD does.
    pub project: String,
    pub source: Source,
    pub destination: Destination,
    /// `spec.syncPolicy.automated` is set (and not `enabled: false`).
    pub automated: bool,
    /// `spec.syncPolicy.automated.prune`.
    pub automated_prune: bool,
    /// `spec.syncPolicy.retry` as written (an automated sync's retry strategy).
    pub retry: Option<Value>,
    /// `spec.source` as written, echoed into `comparedTo`, `syncResult` and history.
    pub source_json: Value,
    /// `spec.destination` as written, echoed into `comparedTo`.
    pub destination_json: Value,
}

impl AppSpec {
    /// Reads the spec of an Application's JSON (the whole object).
    pub fn from_object(app: &Value) -> Self {
        let spec = app.get("spec").filter(|spec| spec.is_object()).unwrap_or(&Value::Null);
        let project = match str_at(spec, "/project") {
            "" => "default",
            project => project,
        };
        let target_revision = match str_at(spec, "/source/targetRevision") {
            "" => "HEAD",
            revision => revision,
        };
        let automated = spec
            .pointer("/syncPolicy/automated")
            .is_some_and(|automated| automated.is_object() && automated.get("enabled") != Some(&Value::Bool(false)));
        let automated_prune = automated && spec.pointer("/syncPolicy/automated/prune") == Some(&Value::Bool(true));
        let object_or_empty = |pointer: &str| {
            spec.pointer(pointer)
                .filter(|value| value.is_object())
                .cloned()
                .unwrap_or_else(|| Value::Object(Default::default()))
        };
        AppSpec {
            project: project.to_owned(),
            source: Source {
                repo_url: str_at(spec, "/source/repoURL").to_owned(),
                path: str_at(spec, "/source/path").to_owned(),
                target_revision: target_revision.to_owned(),
            },
            destination: Destination {
                server: str_at(spec, "/destination/server").to_owned(),
                namespace: str_at(spec, "/destination/namespace").to_owned(),
                name: str_at(spec, "/destination/name").to_owned(),
            },
            automated,
            automated_prune,
            retry: spec.pointer("/syncPolicy/retry").filter(|retry| retry.is_object()).cloned(),
            source_json: object_or_empty("/source"),
            destination_json: object_or_empty("/destination"),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_fields_with_argo_defaults() {
        let spec = AppSpec::from_object(&json!({"spec": {
            "source": {"repoURL": "https://git.example.invalid/a", "path": "web"},
            "destination": {"server": "https://c.example.invalid", "namespace": "ns"},
            "syncPolicy": {"automated": {"prune": true}},
        }}));
        assert_eq!(spec.project, "default");
        assert_eq!(spec.source.target_revision, "HEAD");
        assert_eq!(spec.destination.namespace, "ns");
        assert!(spec.automated);
        assert_eq!(spec.source_json["path"], "web");
    }

    #[test]
    fn odd_objects_read_as_empty() {
        for odd in [json!(null), json!({"spec": 1}), json!({"spec": {"source": "x", "destination": [], "project": 5}})]
        {
            let spec = AppSpec::from_object(&odd);
            assert_eq!(spec.project, "default");
            assert_eq!(spec.source.repo_url, "");
            assert!(!spec.automated);
            assert_eq!(spec.source_json, json!({}));
        }
        let disabled = AppSpec::from_object(&json!({"spec": {"syncPolicy": {"automated": {"enabled": false}}}}));
        assert!(!disabled.automated);
    }
}
