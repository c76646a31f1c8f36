//! Validating admission webhooks, the decisions kube-apiserver v1.20's
//! `ValidatingAdmissionWebhook` plugin makes around the call: which webhooks of the
//! stored ValidatingWebhookConfigurations a write goes to (rules with `*` and `*/*`,
//! operations, scope; `namespaceSelector` on the labels of the object's namespace —
//! cluster-scoped objects always match —; `objectSelector` on the new or old object's
//! labels), the `admission.k8s.io/v1` AdmissionReview each is sent, and what its answer
//! makes of the write: a denial with the webhook's status, a call failure that fails
//! closed (500, `failurePolicy: Fail`, the default) or open (`Ignore`).
//!
//! Only CREATE and UPDATE (create, update, patch, apply, and their subresources) are
//! sent; DELETE is not. Writes of webhook configurations are never sent (as on the
//! real server). The call itself is `webhook_client.rs`; the write pipeline calls
//! webhooks on the fully formed object, without holding the store lock (`router.rs`).

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::auth::Identity;
use super::errors::ApiError;
use super::meta;
use super::resources::{ADMISSION_GROUP, ResourceInfo};
use super::store::State;
use super::write::{Prepared, present};

/// Where ValidatingWebhookConfigurations are stored.
const CONFIGURATIONS: &str = "admissionregistration.k8s.io/validatingwebhookconfigurations";

/// The webhooks a prepared write goes to (none, cheaply, when no configuration exists).
pub fn plan_write(
    state: &State,
    prepared: &Prepared,
    who: &Identity,
    field_manager: Option<&str>,
    dry_run: bool,
) -> Vec<Call> {
    let configurations = state.values(CONFIGURATIONS, None);
    if configurations.is_empty() {
        return Vec::new();
    }
    let info = &prepared.target.info;
    let namespace = prepared.target.namespace.as_str();
    let labels = state.get("/namespaces", "", namespace).and_then(|ns| meta::labels(&ns).cloned());
    let object = present(info, &std::sync::Arc::new(prepared.object.clone()));
    let old = prepared.old.as_ref().map(|old| present(info, old));
    let attrs = Attributes {
        info,
        subresource: prepared.target.subresource.as_deref(),
        namespace,
        name: &prepared.name,
        operation: if prepared.old.is_some() { Operation::Update } else { Operation::Create },
        object: &object,
        old: old.as_deref(),
        who,
        field_manager,
        dry_run,
    };
    plan(&configurations, labels.as_ref(), &attrs)
}

/// The admission operations the emulator sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

/// A write about to be stored, as admission sees it.
pub struct Attributes<'a> {
    pub info: &'a ResourceInfo,
    pub subresource: Option<&'a str>,
    /// "" for cluster-scoped objects.
    pub namespace: &'a str,
    pub name: &'a str,
    pub operation: Operation,
    /// As the client's version presents them.
    pub object: &'a Value,
    pub old: Option<&'a Value>,
    pub who: &'a Identity,
    /// `fieldManager` given on the request, if any.
    pub field_manager: Option<&'a str>,
    /// A dry run: webhooks are told (`request.dryRun`), as every webhook the
    /// emulator accepts declares `sideEffects: None` or `NoneOnDryRun`.
    pub dry_run: bool,
}

/// One webhook to call for a write.
#[derive(Debug, Clone)]
pub struct Call {
    pub webhook: String,
    /// `clientConfig.url`; None when the webhook names a service (a call failure here).
    pub url: Option<String>,
    /// `clientConfig.caBundle` (base64 of PEM), if any.
    pub ca_bundle: Option<String>,
    pub timeout: Duration,
    /// `failurePolicy: Ignore`.
    pub fail_open: bool,
    pub review: Value,
}

/// Why a call produced no usable answer (kube-apiserver's `ErrCallingWebhook`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CallFailure(pub String);

/// The webhooks of `configurations` that `attrs` goes to, each with its review.
/// `namespace_labels` are the labels of the object's namespace (None when it has none
/// or does not exist).
pub fn plan(configurations: &[Value], namespace_labels: Option<&Map<String, Value>>, attrs: &Attributes) -> Vec<Call> {
    if attrs.info.group == ADMISSION_GROUP
        && matches!(attrs.info.plural.as_str(), "validatingwebhookconfigurations" | "mutatingwebhookconfigurations")
    {
        return Vec::new();
    }
    let mut calls = Vec::new();
    for configuration in configurations {
        for webhook in configuration.get("webhooks").and_then(Value::as_array).into_iter().flatten() {
            if !webhook_applies(webhook, namespace_labels, attrs) {
                continue;
            }
            let client = webhook.get("clientConfig").unwrap_or(&Value::Null);
            let seconds = webhook.get("timeoutSeconds").and_then(Value::as_u64).unwrap_or(10);
            calls.push(Call {
                webhook: text(webhook, "name").to_owned(),
                url: client.get("url").and_then(Value::as_str).map(str::to_owned),
                ca_bundle: client.get("caBundle").and_then(Value::as_str).filter(|b| !b.is_empty()).map(str::to_owned),
                timeout: Duration::from_secs(seconds),
                fail_open: text(webhook, "failurePolicy") == "Ignore",
                review: review(attrs),
            });
        }
    }
    calls
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

fn strings<'a>(value: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    value.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
}

fn webhook_applies(webhook: &Value, namespace_labels: Option<&Map<String, Value>>, attrs: &Attributes) -> bool {
    let rules = webhook.get("rules").and_then(Value::as_array).into_iter().flatten();
    if !rules.into_iter().any(|rule| rule_matches(rule, attrs)) {
        return false;
    }
    let is_namespace = attrs.info.group.is_empty() && attrs.info.plural == "namespaces";
    let namespace_ok = match webhook.get("namespaceSelector").filter(|s| !s.is_null()) {
        None => true,
        Some(_) if attrs.namespace.is_empty() && !is_namespace => true,
        Some(selector) if is_namespace && attrs.subresource.is_none() => {
            selector_matches(selector, meta::labels(attrs.object).unwrap_or(&Map::new()))
        }
        Some(selector) => selector_matches(selector, namespace_labels.unwrap_or(&Map::new())),
    };
    let object_ok = match webhook.get("objectSelector").filter(|s| !s.is_null()) {
        None => true,
        Some(selector) if selector_is_empty(selector) => true,
        Some(selector) => [Some(attrs.object), attrs.old]
            .into_iter()
            .flatten()
            .any(|object| selector_matches(selector, meta::labels(object).unwrap_or(&Map::new()))),
    };
    namespace_ok && object_ok
}

/// Whether one of a webhook's `rules` (a RuleWithOperations) covers the write.
pub fn rule_matches(rule: &Value, attrs: &Attributes) -> bool {
    let any = |key: &str, wanted: &str| strings(rule, key).any(|value| value == "*" || value == wanted);
    let operation = any("operations", attrs.operation.as_str());
    let group = any("apiGroups", &attrs.info.group);
    let version = any("apiVersions", &attrs.info.version);
    let subresource = attrs.subresource.unwrap_or("");
    let resource = strings(rule, "resources").any(|pattern| {
        if pattern == "*/*" {
            return true;
        }
        let (res, sub) = pattern.split_once('/').unwrap_or((pattern, ""));
        (res == "*" || res == attrs.info.plural) && (sub == "*" || sub == subresource)
    });
    let is_namespace = attrs.info.group.is_empty() && attrs.info.plural == "namespaces";
    let scope = match text(rule, "scope") {
        "Namespaced" => !is_namespace && !attrs.namespace.is_empty(),
        "Cluster" => is_namespace || attrs.namespace.is_empty(),
        _ => true,
    };
    operation && group && version && resource && scope
}

fn selector_is_empty(selector: &Value) -> bool {
    let empty = |key: &str| {
        selector.get(key).is_none_or(|v| {
            v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty) || v.is_null()
        })
    };
    empty("matchLabels") && empty("matchExpressions")
}

/// A metav1 LabelSelector (`matchLabels`, `matchExpressions` with In, NotIn, Exists,
/// DoesNotExist) against `labels`; the empty selector matches everything.
pub fn selector_matches(selector: &Value, labels: &Map<String, Value>) -> bool {
    let label = |key: &str| labels.get(key).and_then(Value::as_str);
    let match_labels = selector.get("matchLabels").and_then(Value::as_object);
    if !match_labels.into_iter().flatten().all(|(key, value)| label(key) == value.as_str()) {
        return false;
    }
    selector.get("matchExpressions").and_then(Value::as_array).into_iter().flatten().all(|expression| {
        let key = text(expression, "key");
        let mut values = strings(expression, "values");
        match text(expression, "operator") {
            "In" => label(key).is_some_and(|have| values.any(|v| v == have)),
            "NotIn" => label(key).is_none_or(|have| !values.any(|v| v == have)),
            "Exists" => label(key).is_some(),
            "DoesNotExist" => label(key).is_none(),
            _ => false,
        }
    })
}

/// The AdmissionReview (`admission.k8s.io/v1`) for `attrs`, with a fresh uid.
pub fn review(attrs: &Attributes) -> Value {
    let info = attrs.info;
    let kind = json!({"group": info.group, "version": info.version, "kind": info.kind});
    let resource = json!({"group": info.group, "version": info.version, "resource": info.plural});
    let mut user = json!({"username": attrs.who.user, "groups": attrs.who.groups});
    if !attrs.who.uid.is_empty() {
        user["uid"] = json!(attrs.who.uid);
    }
    let options_kind = match attrs.operation {
        Operation::Create => "CreateOptions",
        Operation::Update => "UpdateOptions",
    };
    let mut options = json!({"kind": options_kind, "apiVersion": "meta.k8s.io/v1"});
    if let Some(manager) = attrs.field_manager.filter(|m| !m.is_empty()) {
        options["fieldManager"] = json!(manager);
    }
    let mut request = json!({
        "uid": uuid::Uuid::new_v4().to_string(),
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "operation": attrs.operation.as_str(),
        "userInfo": user,
        "object": attrs.object,
        "oldObject": attrs.old.cloned().unwrap_or(Value::Null),
        "dryRun": attrs.dry_run,
        "options": options,
    });
    if let Some(sub) = attrs.subresource.filter(|s| !s.is_empty()) {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    if !attrs.name.is_empty() {
        request["name"] = json!(attrs.name);
    }
    if !attrs.namespace.is_empty() {
        request["namespace"] = json!(attrs.namespace);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// The webhook's answer (a parsed body) checked as kube-apiserver checks it: Ok(None)
/// allows, Ok(Some(error)) is the denial to return; Err is a malformed answer (a call
/// failure).
pub fn judge(call: &Call, answer: &Value) -> Result<Option<ApiError>, CallFailure> {
    let (api_version, kind) = (text(answer, "apiVersion"), text(answer, "kind"));
    if (api_version, kind) != ("admission.k8s.io/v1", "AdmissionReview") {
        return Err(CallFailure(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {api_version}, Kind={kind}"
        )));
    }
    let Some(response) = answer.get("response").filter(|r| r.is_object()) else {
        return Err(CallFailure("webhook response was absent".to_owned()));
    };
    let sent = call.review.pointer("/request/uid").and_then(Value::as_str).unwrap_or("");
    let got = text(response, "uid");
    if got != sent {
        return Err(CallFailure(format!("expected response.uid={sent:?}, got {got:?}")));
    }
    if response.get("allowed").and_then(Value::as_bool) == Some(true) {
        return Ok(None);
    }
    Ok(Some(denial(&call.webhook, response.get("status").unwrap_or(&Value::Null))))
}

/// kube-apiserver's `ToStatusErr`: the webhook's status, code at least 400, message
/// prefixed with who denied.
fn denial(webhook: &str, status: &Value) -> ApiError {
    let denied_by = format!("admission webhook {webhook:?} denied the request");
    let code = status.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok()).unwrap_or(0);
    let code = if code < 400 { 400 } else { code };
    let message = match (text(status, "message"), text(status, "reason")) {
        (message, _) if !message.is_empty() => format!("{denied_by}: {message}"),
        (_, reason) if !reason.is_empty() => format!("{denied_by}: {reason}"),
        _ => format!("{denied_by} without explanation"),
    };
    let error = ApiError::with_reason(code, text(status, "reason").to_owned(), message);
    match status.get("details").filter(|d| d.is_object()) {
        Some(details) => error.with_details(details.clone()),
        None => error,
    }
}

/// What a failed call makes of the write: nothing with `Ignore`, else a 500.
pub fn call_failed(call: &Call, failure: &CallFailure) -> Option<ApiError> {
    if call.fail_open {
        return None;
    }
    let detail = format!("failed calling webhook {:?}: {failure}", call.webhook);
    Some(
        ApiError::internal(format!("Internal error occurred: {detail}"))
            .with_details(json!({"causes": [{"message": detail}]})),
    )
}

#[cfg(test)]
mod tests {
    use super::super::resources::builtins;
    use super::*;

    fn info(plural: &str) -> ResourceInfo {
        builtins().into_iter().find(|i| i.plural == plural).expect("builtin")
    }

    fn who() -> Identity {
        Identity { user: "alice".into(), uid: "u-1".into(), groups: vec!["dev".into()] }
    }

    fn attrs<'a>(info: &'a ResourceInfo, namespace: &'a str, object: &'a Value, who: &'a Identity) -> Attributes<'a> {
        Attributes {
            info,
            subresource: None,
            namespace,
            name: "x",
            operation: Operation::Create,
            object,
            old: None,
            who,
            field_manager: None,
            dry_run: false,
        }
    }

    #[test]
    fn rules_match_like_kube_apiserver() {
        let (configmaps, namespaces, who, object) = (info("configmaps"), info("namespaces"), who(), json!({}));
        let cm = attrs(&configmaps, "ns", &object, &who);
        let rule = |resources: Value, ops: Value| json!({"operations": ops, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources});
        assert!(rule_matches(&rule(json!(["configmaps"]), json!(["CREATE"])), &cm));
        assert!(rule_matches(&rule(json!(["*"]), json!(["*"])), &cm));
        assert!(!rule_matches(&rule(json!(["configmaps"]), json!(["UPDATE"])), &cm));
        assert!(!rule_matches(&rule(json!(["secrets"]), json!(["*"])), &cm));
        let status = Attributes { subresource: Some("status"), ..attrs(&configmaps, "ns", &object, &who) };
        // `*` and `x` are main resources only; `x/*`, `*/status` and `*/*` reach subresources.
        assert!(!rule_matches(&rule(json!(["*"]), json!(["*"])), &status));
        assert!(!rule_matches(&rule(json!(["configmaps"]), json!(["*"])), &status));
        assert!(rule_matches(&rule(json!(["configmaps/*"]), json!(["*"])), &status));
        assert!(rule_matches(&rule(json!(["configmaps/*"]), json!(["*"])), &cm));
        assert!(rule_matches(&rule(json!(["*/status"]), json!(["*"])), &status));
        assert!(rule_matches(&rule(json!(["*/*"]), json!(["*"])), &status));
        let mut scoped = rule(json!(["*"]), json!(["*"]));
        scoped["scope"] = json!("Cluster");
        assert!(!rule_matches(&scoped, &cm));
        assert!(rule_matches(&scoped, &attrs(&namespaces, "", &object, &who)));
        scoped["scope"] = json!("Namespaced");
        assert!(rule_matches(&scoped, &cm));
        let mut apps = rule(json!(["*"]), json!(["*"]));
        apps["apiGroups"] = json!(["apps"]);
        assert!(!rule_matches(&apps, &cm));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: Map<String, Value> = serde_json::from_value(json!({"team": "a", "tier": "web"})).unwrap();
        assert!(selector_matches(&json!({}), &labels));
        assert!(selector_matches(&json!({"matchLabels": {"team": "a"}}), &labels));
        assert!(!selector_matches(&json!({"matchLabels": {"team": "b"}}), &labels));
        let expression =
            |op: &str, values: Value| json!({"matchExpressions": [{"key": "tier", "operator": op, "values": values}]});
        assert!(selector_matches(&expression("In", json!(["web", "db"])), &labels));
        assert!(!selector_matches(&expression("NotIn", json!(["web"])), &labels));
        assert!(selector_matches(&expression("Exists", json!([])), &labels));
        assert!(!selector_matches(&expression("DoesNotExist", json!([])), &labels));
        assert!(selector_matches(
            &json!({"matchExpressions": [{"key": "x", "operator": "NotIn", "values": ["y"]}]}),
            &labels
        ));
    }

    #[test]
    fn plans_follow_rules_and_namespace_selectors_and_reviews_carry_the_request() {
        let (configmaps, who) = (info("configmaps"), who());
        let object = json!({"metadata": {"name": "x", "namespace": "ns"}});
        let configuration = json!({"webhooks": [{
            "name": "deny.example.com",
            "clientConfig": {"url": "https://127.0.0.1:1/v", "caBundle": "Q0E="},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"hooked": "yes"}},
            "failurePolicy": "Ignore", "timeoutSeconds": 3}]});
        let labels: Map<String, Value> = serde_json::from_value(json!({"hooked": "yes"})).unwrap();
        let request = attrs(&configmaps, "ns", &object, &who);
        let calls = plan(std::slice::from_ref(&configuration), Some(&labels), &request);
        assert_eq!(calls.len(), 1);
        let call = &calls[0];
        assert_eq!(
            (call.url.as_deref(), call.ca_bundle.as_deref(), call.timeout, call.fail_open),
            (Some("https://127.0.0.1:1/v"), Some("Q0E="), Duration::from_secs(3), true)
        );
        let sent = &call.review["request"];
        assert_eq!(sent["operation"], "CREATE");
        assert_eq!(sent["namespace"], "ns");
        assert_eq!(sent["userInfo"], json!({"username": "alice", "uid": "u-1", "groups": ["dev"]}));
        assert_eq!(sent["resource"], json!({"group": "", "version": "v1", "resource": "configmaps"}));
        assert_eq!(sent["kind"], json!({"group": "", "version": "v1", "kind": "ConfigMap"}));
        assert_eq!(sent["options"]["kind"], "CreateOptions");
        assert!(plan(std::slice::from_ref(&configuration), None, &request).is_empty());
        // Webhook configurations themselves are never sent.
        let hooks = info("validatingwebhookconfigurations");
        let everything = json!({"webhooks": [{"name": "all.example.com", "clientConfig": {"url": "https://127.0.0.1:1"},
            "rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*/*"]}]}]});
        assert!(plan(std::slice::from_ref(&everything), None, &attrs(&hooks, "", &object, &who)).is_empty());
        assert_eq!(plan(&[everything], None, &request).len(), 1);
    }

    #[test]
    fn answers_become_denials_or_call_failures() {
        let (configmaps, who, object) = (info("configmaps"), who(), json!({}));
        let call = Call {
            webhook: "deny.example.com".into(),
            url: None,
            ca_bundle: None,
            timeout: Duration::from_secs(1),
            fail_open: false,
            review: review(&attrs(&configmaps, "ns", &object, &who)),
        };
        let uid = call.review["request"]["uid"].clone();
        let answer = |response: Value| json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response});
        assert!(matches!(judge(&call, &answer(json!({"uid": uid, "allowed": true}))), Ok(None)));
        let denied = judge(
            &call,
            &answer(
                json!({"uid": uid, "allowed": false, "status": {"code": 403, "reason": "Forbidden", "message": "no"}}),
            ),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (denied.code, denied.reason.as_ref(), denied.message.as_str()),
            (403, "Forbidden", "admission webhook \"deny.example.com\" denied the request: no")
        );
        let bare = judge(&call, &answer(json!({"uid": uid, "allowed": false}))).unwrap().unwrap();
        assert_eq!(
            (bare.code, bare.message.as_str()),
            (400, "admission webhook \"deny.example.com\" denied the request without explanation")
        );
        assert!(judge(&call, &answer(json!({"uid": "other", "allowed": true}))).is_err());
        assert!(judge(&call, &json!({"response": {"uid": uid, "allowed": true}})).is_err());
        let failure = CallFailure("Post \"https://x\": connection refused".into());
        let error = call_failed(&call, &failure).unwrap();
        assert_eq!(
            (error.code, error.message.as_str()),
            (
                500,
                "Internal error occurred: failed calling webhook \"deny.example.com\": Post \"https://x\": connection refused"
            )
        );
        assert!(call_failed(&Call { fail_open: true, ..call }, &failure).is_none());
    }
}
