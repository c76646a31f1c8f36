//! Access reviews (`authorization.k8s.io/v1`): SubjectAccessReview,
//! LocalSubjectAccessReview and SelfSubjectAccessReview, create only and never stored,
//! answered as kube-apiserver answers them: the review as sent, with `status.allowed`
//! and `status.reason` from the same RBAC decision every request gets
//! ([`rbac::decide`], `system:masters` allowed). The subject is `spec.user`, `spec.uid`,
//! `spec.groups` exactly as given (no `system:authenticated` added) for the first two,
//! the caller for the self review. An invalid review is 422 with v1.20's message (kind
//! empty, as the real server prints it: `.authorization.k8s.io "" is invalid: …`).

use serde_json::{Map, Value, json};

use super::access::StoreRbac;
use super::auth::Identity;
use super::errors::{ApiError, Cause};
use super::rbac::{self, Attributes};
use super::resources::{AUTHORIZATION_GROUP, ResourceInfo};
use super::store::State;

/// Which review a resource is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Review {
    Subject,
    Local,
    Own,
}

impl Review {
    fn of(info: &ResourceInfo) -> Option<Review> {
        match (info.group.as_str(), info.plural.as_str()) {
            (AUTHORIZATION_GROUP, "subjectaccessreviews") => Some(Review::Subject),
            (AUTHORIZATION_GROUP, "localsubjectaccessreviews") => Some(Review::Local),
            (AUTHORIZATION_GROUP, "selfsubjectaccessreviews") => Some(Review::Own),
            _ => None,
        }
    }
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn invalid(causes: Vec<Cause>) -> ApiError {
    ApiError::invalid("", AUTHORIZATION_GROUP, "", causes)
}

/// POST of a review to `info` (in `namespace` for the local review) by `who`.
/// `manager` and `now` make the managedFields entry the real server records.
pub fn create(
    state: &State,
    who: &Identity,
    info: &ResourceInfo,
    namespace: &str,
    body: &[u8],
    manager: &str,
    now: &str,
) -> Result<Value, ApiError> {
    let kind = Review::of(info).ok_or_else(ApiError::method_not_allowed)?;
    if kind == Review::Local && namespace.is_empty() {
        return Err(ApiError::bad_request("namespace is required on this type: "));
    }
    let mut review: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not a JSON object: {e}")))?;
    if !review.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    let expected = info.api_version();
    for (field, wanted) in [("apiVersion", expected.as_str()), ("kind", info.kind.as_str())] {
        match review.get(field).and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != wanted => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({given}) does not match the expected {field} ({wanted})"
                )));
            }
            _ => review[field] = json!(wanted),
        }
    }
    let spec = review.get("spec").cloned().unwrap_or(json!({}));
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let mut causes = Vec::new();
    if resource.is_some() && non_resource.is_some() {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.nonResourceAttributes",
            format!(
                "Invalid value: {}: cannot be specified in combination with resourceAttributes",
                go_struct(non_resource)
            ),
        ));
    }
    if resource.is_none() && non_resource.is_none() {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.resourceAttributes",
            "Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    let subject = match kind {
        Review::Own => who.clone(),
        Review::Subject | Review::Local => {
            let user = text(&spec, "/user");
            if user.is_empty() && groups.is_empty() {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    "spec.user",
                    "Invalid value: \"\": at least one of user or group must be specified",
                ));
            }
            Identity { user: user.to_owned(), uid: text(&spec, "/uid").to_owned(), groups }
        }
    };
    if kind == Review::Local {
        let metadata = review.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
        match metadata.get("namespace").and_then(Value::as_str) {
            Some(given) if !given.is_empty() && given != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        if resource.is_some_and(|attrs| text(attrs, "/namespace") != namespace) {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.resourceAttributes.namespace",
                format!(
                    "Invalid value: {}: must match metadata.namespace",
                    rbac::quote(resource.map_or("", |attrs| text(attrs, "/namespace")))
                ),
            ));
        }
        if non_resource.is_some() {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.nonResourceAttributes",
                format!("Invalid value: {}: disallowed on this kind of request", go_struct(non_resource)),
            ));
        }
    }
    if !causes.is_empty() {
        return Err(invalid(causes));
    }
    let attrs = match (resource, non_resource) {
        (Some(attrs), _) => Attributes {
            verb: text(attrs, "/verb"),
            api_group: text(attrs, "/group"),
            resource: text(attrs, "/resource"),
            subresource: Some(text(attrs, "/subresource")).filter(|s| !s.is_empty()),
            namespace: Some(text(attrs, "/namespace")).filter(|s| !s.is_empty()),
            name: Some(text(attrs, "/name")).filter(|s| !s.is_empty()),
            non_resource_path: None,
        },
        (None, attrs) => {
            let attrs = attrs.unwrap_or(&Value::Null);
            Attributes {
                verb: text(attrs, "/verb"),
                api_group: "",
                resource: "",
                subresource: None,
                namespace: None,
                name: None,
                non_resource_path: Some(text(attrs, "/path")),
            }
        }
    };
    let decision = rbac::decide(&StoreRbac(state), &subject, &attrs);
    let mut metadata = review.get("metadata").and_then(Value::as_object).cloned().unwrap_or_else(Map::new);
    metadata.insert("creationTimestamp".into(), Value::Null);
    if kind == Review::Local {
        metadata.insert("namespace".into(), json!(namespace));
    }
    review["metadata"] = Value::Object(metadata);
    review["spec"] = spec;
    super::fields::record_update(None, &mut review, manager, None, now);
    let mut status = Map::new();
    status.insert("allowed".into(), json!(decision.allowed));
    if !decision.reason.is_empty() {
        status.insert("reason".into(), json!(decision.reason));
    }
    review["status"] = Value::Object(status);
    Ok(review)
}

/// Roughly how Go prints a struct value in a validation message.
fn go_struct(value: Option<&Value>) -> String {
    let value = value.unwrap_or(&Value::Null);
    format!("{{Path:{} Verb:{}}}", text(value, "/path"), text(value, "/verb"))
}

#[cfg(test)]
mod tests {
    use super::super::resources::builtins;
    use super::*;

    fn create(state: &State, who: &Identity, info: &ResourceInfo, ns: &str, body: &[u8]) -> Result<Value, ApiError> {
        super::create(state, who, info, ns, body, "test", "2021-01-01T00:00:00Z")
    }

    fn info(plural: &str) -> ResourceInfo {
        builtins().into_iter().find(|i| i.plural == plural).expect("a review resource")
    }

    fn state() -> State {
        let mut state = State::new();
        let mut objects = rbac::bootstrap_cluster_roles();
        objects.extend(rbac::bootstrap_cluster_role_bindings());
        objects.push(json!({"kind": "RoleBinding", "metadata": {"name": "editor", "namespace": "ns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"kind": "ServiceAccount", "name": "dev", "namespace": "ns"}]}));
        super::super::builtin::bootstrap(&mut state, objects);
        state
    }

    fn review(spec: Value) -> Vec<u8> {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn reviews_answer_with_the_rbac_decision_and_its_reason() {
        let state = state();
        let admin = Identity { user: "admin".into(), uid: String::new(), groups: vec!["system:masters".into()] };
        let sar = info("subjectaccessreviews");
        let attrs = json!({"namespace": "ns", "verb": "create", "resource": "configmaps"});
        let allowed = create(
            &state,
            &admin,
            &sar,
            "",
            &review(json!({"user": "system:serviceaccount:ns:dev", "resourceAttributes": attrs})),
        )
        .unwrap();
        assert_eq!(
            allowed["status"],
            json!({"allowed": true,
                "reason": "RBAC: allowed by RoleBinding \"editor/ns\" of ClusterRole \"edit\" to ServiceAccount \"dev/ns\""})
        );
        assert_eq!(allowed["metadata"]["creationTimestamp"], Value::Null);
        // As on the real server, the review carries its writer's managedFields entry.
        assert_eq!(allowed["metadata"]["managedFields"][0]["manager"], "test");
        let attrs =
            json!({"namespace": "ns", "verb": "create", "resource": "roles", "group": "rbac.authorization.k8s.io"});
        let denied = create(
            &state,
            &admin,
            &sar,
            "",
            &review(json!({"user": "system:serviceaccount:ns:dev", "resourceAttributes": attrs})),
        )
        .unwrap();
        assert_eq!(denied["status"], json!({"allowed": false}));
        let masters = create(
            &state,
            &admin,
            &sar,
            "",
            &review(json!({"user": "x", "groups": ["system:masters"],
            "nonResourceAttributes": {"path": "/anything", "verb": "get"}})),
        )
        .unwrap();
        assert_eq!(masters["status"], json!({"allowed": true}));
        let error =
            create(&state, &admin, &sar, "", &review(json!({"resourceAttributes": {"verb": "get"}}))).unwrap_err();
        assert_eq!(
            (error.code, error.message.as_str()),
            (
                422,
                ".authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
            )
        );
    }

    #[test]
    fn the_self_review_asks_about_the_caller() {
        let state = state();
        let dev = Identity {
            user: "system:serviceaccount:ns:dev".into(),
            uid: String::new(),
            groups: vec!["system:serviceaccounts".into(), "system:authenticated".into()],
        };
        let body = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"namespace": "ns", "verb": "delete", "resource": "secrets"}}});
        let answer = create(&state, &dev, &info("selfsubjectaccessreviews"), "", body.to_string().as_bytes()).unwrap();
        assert_eq!(answer["status"]["allowed"], true);
        let body = json!({"spec": {"user": "u", "resourceAttributes": {"namespace": "other", "verb": "get"}}});
        let error =
            create(&state, &dev, &info("localsubjectaccessreviews"), "ns", body.to_string().as_bytes()).unwrap_err();
        assert_eq!(error.code, 422);
    }
}
