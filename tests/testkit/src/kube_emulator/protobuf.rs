//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), what kubectl
//! sends for built-in kinds (`kubectl create namespace|secret|configmap|
//! serviceaccount|role|rolebinding|clusterrole|clusterrolebinding|token`, and the
//! `DeleteOptions` of `kubectl delete`). kube-apiserver's envelope is the magic
//! `k8s\0` followed by a `runtime.Unknown` whose `raw` bytes are the object; both
//! are decoded with the `k8s-pb` types (kube-rs's bindings generated from
//! Kubernetes' `.proto` files), and the object is turned into the JSON the rest
//! of the emulator reads. Responses stay JSON, which kubectl accepts.
//!
//! Only the kinds above are understood; any other protobuf body gets 415 as
//! before, naming the kind.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_pb::api::authentication::v1 as authentication;
use k8s_pb::api::core::v1 as core;
use k8s_pb::api::rbac::v1 as rbac;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use serde_json::{Map, Value, json};

use super::errors::ApiError;

/// The content type kubectl sends protobuf bodies with.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The first bytes of every Kubernetes protobuf message.
const MAGIC: &[u8] = b"k8s\0";

/// Whether a request's content type is Kubernetes protobuf.
pub fn is_protobuf(content_type: &str) -> bool {
    content_type.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case(CONTENT_TYPE))
}

/// The JSON of a protobuf request body.
pub fn to_json(body: &[u8]) -> Result<Vec<u8>, ApiError> {
    let envelope =
        body.strip_prefix(MAGIC).ok_or_else(|| bad("the body does not start with the k8s protobuf magic"))?;
    let unknown = Unknown::decode(envelope).map_err(|e| bad(&format!("runtime.Unknown: {e}")))?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = unknown.raw.unwrap_or_default();
    let decode_error = |e: prost::DecodeError| bad(&format!("{api_version}/{kind}: {e}"));
    let mut object = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => namespace(core::Namespace::decode(&raw[..]).map_err(decode_error)?),
        ("v1", "Secret") => secret(core::Secret::decode(&raw[..]).map_err(decode_error)?),
        ("v1", "ConfigMap") => config_map(core::ConfigMap::decode(&raw[..]).map_err(decode_error)?),
        ("v1", "ServiceAccount") => service_account(core::ServiceAccount::decode(&raw[..]).map_err(decode_error)?),
        ("rbac.authorization.k8s.io/v1", "Role") => {
            let role = rbac::Role::decode(&raw[..]).map_err(decode_error)?;
            fields([("metadata", object_meta(role.metadata)), ("rules", rules(role.rules))])
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            let role = rbac::ClusterRole::decode(&raw[..]).map_err(decode_error)?;
            let aggregation = role.aggregation_rule.map(|rule| {
                json!({"clusterRoleSelectors": rule.cluster_role_selectors.into_iter().map(label_selector).collect::<Vec<_>>()})
            });
            fields([
                ("metadata", object_meta(role.metadata)),
                ("rules", rules(role.rules)),
                ("aggregationRule", aggregation),
            ])
        }
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
            let binding = rbac::RoleBinding::decode(&raw[..]).map_err(decode_error)?;
            binding_json(binding.metadata, binding.subjects, binding.role_ref)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            let binding = rbac::ClusterRoleBinding::decode(&raw[..]).map_err(decode_error)?;
            binding_json(binding.metadata, binding.subjects, binding.role_ref)
        }
        ("authentication.k8s.io/v1", "TokenRequest") => {
            let request = authentication::TokenRequest::decode(&raw[..]).map_err(decode_error)?;
            token_request(request)
        }
        ("meta.k8s.io/v1" | "v1", "DeleteOptions") => {
            delete_options(meta::DeleteOptions::decode(&raw[..]).map_err(decode_error)?)
        }
        _ => {
            return Err(ApiError {
                code: 415,
                reason: "UnsupportedMediaType".into(),
                message: format!(
                    "the emulator does not decode {kind} ({api_version}) from protobuf; send it as application/json"
                ),
                details: None,
            });
        }
    };
    object.insert("apiVersion".into(), json!(api_version));
    object.insert("kind".into(), json!(kind));
    serde_json::to_vec(&Value::Object(object)).map_err(|e| bad(&e.to_string()))
}

fn bad(detail: &str) -> ApiError {
    ApiError::bad_request(format!("could not decode the protobuf body: {detail}"))
}

/// An object of the fields that are present (`None`, empty strings, lists and maps
/// left out).
fn fields<const N: usize>(pairs: [(&str, Option<Value>); N]) -> Map<String, Value> {
    pairs
        .into_iter()
        .filter_map(|(key, value)| {
            let value = value?;
            // Go's protobuf writes empty strings; its JSON would leave them out.
            let empty = match &value {
                Value::String(text) => text.is_empty(),
                Value::Array(items) => items.is_empty(),
                Value::Object(map) => map.is_empty(),
                _ => false,
            };
            (!empty).then(|| (key.to_owned(), value))
        })
        .collect()
}

fn some_object(map: Map<String, Value>) -> Option<Value> {
    (!map.is_empty()).then_some(Value::Object(map))
}

fn strings(items: Vec<String>) -> Option<Value> {
    Some(json!(items))
}

fn string_map(map: BTreeMap<String, String>) -> Option<Value> {
    Some(json!(map))
}

fn bytes_map(map: BTreeMap<String, Vec<u8>>) -> Option<Value> {
    let engine = base64::engine::general_purpose::STANDARD;
    Some(Value::Object(map.into_iter().map(|(key, bytes)| (key, json!(engine.encode(bytes)))).collect()))
}

fn object_meta(metadata: Option<meta::ObjectMeta>) -> Option<Value> {
    let m = metadata.unwrap_or_default();
    let owners = m
        .owner_references
        .into_iter()
        .map(|o| {
            Value::Object(fields([
                ("apiVersion", o.api_version.map(Value::from)),
                ("kind", o.kind.map(Value::from)),
                ("name", o.name.map(Value::from)),
                ("uid", o.uid.map(Value::from)),
                ("controller", o.controller.map(Value::from)),
                ("blockOwnerDeletion", o.block_owner_deletion.map(Value::from)),
            ]))
        })
        .collect::<Vec<_>>();
    some_object(fields([
        ("name", m.name.map(Value::from)),
        ("generateName", m.generate_name.map(Value::from)),
        ("namespace", m.namespace.map(Value::from)),
        ("uid", m.uid.map(Value::from)),
        ("resourceVersion", m.resource_version.map(Value::from)),
        ("labels", string_map(m.labels)),
        ("annotations", string_map(m.annotations)),
        ("ownerReferences", Some(Value::Array(owners))),
        ("finalizers", strings(m.finalizers)),
    ]))
}

fn namespace(namespace: core::Namespace) -> Map<String, Value> {
    let spec = namespace.spec.map(|spec| Value::Object(fields([("finalizers", strings(spec.finalizers))])));
    fields([("metadata", object_meta(namespace.metadata)), ("spec", spec)])
}

fn secret(secret: core::Secret) -> Map<String, Value> {
    fields([
        ("metadata", object_meta(secret.metadata)),
        ("immutable", secret.immutable.map(Value::from)),
        ("data", bytes_map(secret.data)),
        ("stringData", string_map(secret.string_data)),
        ("type", secret.r#type.map(Value::from)),
    ])
}

fn config_map(config_map: core::ConfigMap) -> Map<String, Value> {
    fields([
        ("metadata", object_meta(config_map.metadata)),
        ("immutable", config_map.immutable.map(Value::from)),
        ("data", string_map(config_map.data)),
        ("binaryData", bytes_map(config_map.binary_data)),
    ])
}

fn service_account(account: core::ServiceAccount) -> Map<String, Value> {
    let secrets = account
        .secrets
        .into_iter()
        .map(|r| {
            Value::Object(fields([
                ("kind", r.kind.map(Value::from)),
                ("namespace", r.namespace.map(Value::from)),
                ("name", r.name.map(Value::from)),
                ("uid", r.uid.map(Value::from)),
                ("apiVersion", r.api_version.map(Value::from)),
            ]))
        })
        .collect::<Vec<_>>();
    let pull =
        account.image_pull_secrets.into_iter().map(|r| Value::Object(fields([("name", r.name.map(Value::from))])));
    fields([
        ("metadata", object_meta(account.metadata)),
        ("secrets", Some(Value::Array(secrets))),
        ("imagePullSecrets", Some(Value::Array(pull.collect()))),
        ("automountServiceAccountToken", account.automount_service_account_token.map(Value::from)),
    ])
}

fn rules(rules: Vec<rbac::PolicyRule>) -> Option<Value> {
    Some(Value::Array(
        rules
            .into_iter()
            .map(|rule| {
                Value::Object(fields([
                    ("verbs", Some(json!(rule.verbs))),
                    ("apiGroups", strings(rule.api_groups)),
                    ("resources", strings(rule.resources)),
                    ("resourceNames", strings(rule.resource_names)),
                    ("nonResourceURLs", strings(rule.non_resource_ur_ls)),
                ]))
            })
            .collect(),
    ))
}

fn label_selector(selector: meta::LabelSelector) -> Value {
    let expressions = selector.match_expressions.into_iter().map(|e| {
        Value::Object(fields([
            ("key", e.key.map(Value::from)),
            ("operator", e.operator.map(Value::from)),
            ("values", strings(e.values)),
        ]))
    });
    Value::Object(fields([
        ("matchLabels", string_map(selector.match_labels)),
        ("matchExpressions", Some(Value::Array(expressions.collect()))),
    ]))
}

fn binding_json(
    metadata: Option<meta::ObjectMeta>,
    subjects: Vec<rbac::Subject>,
    role_ref: Option<rbac::RoleRef>,
) -> Map<String, Value> {
    let subjects = subjects.into_iter().map(|s| {
        Value::Object(fields([
            ("kind", s.kind.map(Value::from)),
            ("apiGroup", s.api_group.map(Value::from)),
            ("name", s.name.map(Value::from)),
            ("namespace", s.namespace.map(Value::from)),
        ]))
    });
    let role_ref = role_ref.map(|r| {
        Value::Object(fields([
            ("apiGroup", Some(json!(r.api_group.unwrap_or_default()))),
            ("kind", r.kind.map(Value::from)),
            ("name", r.name.map(Value::from)),
        ]))
    });
    fields([
        ("metadata", object_meta(metadata)),
        ("subjects", Some(Value::Array(subjects.collect()))),
        ("roleRef", role_ref),
    ])
}

fn token_request(request: authentication::TokenRequest) -> Map<String, Value> {
    let spec = request.spec.unwrap_or_default();
    let bound = spec.bound_object_ref.map(|r| {
        Value::Object(fields([
            ("kind", r.kind.map(Value::from)),
            ("apiVersion", r.api_version.map(Value::from)),
            ("name", r.name.map(Value::from)),
            ("uid", r.u_id.map(Value::from)),
        ]))
    });
    let spec = fields([
        ("audiences", strings(spec.audiences)),
        ("expirationSeconds", spec.expiration_seconds.map(Value::from)),
        ("boundObjectRef", bound),
    ]);
    fields([("metadata", object_meta(request.metadata)), ("spec", Some(Value::Object(spec)))])
}

fn delete_options(options: meta::DeleteOptions) -> Map<String, Value> {
    let preconditions = options.preconditions.map(|p| {
        Value::Object(fields([
            ("uid", p.uid.map(Value::from)),
            ("resourceVersion", p.resource_version.map(Value::from)),
        ]))
    });
    fields([
        ("gracePeriodSeconds", options.grace_period_seconds.map(Value::from)),
        ("preconditions", preconditions),
        ("orphanDependents", options.orphan_dependents.map(Value::from)),
        ("propagationPolicy", options.propagation_policy.map(Value::from)),
        ("dryRun", strings(options.dry_run)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body as kubectl frames it, encoded with the same generated types.
    fn framed(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut body = MAGIC.to_vec();
        body.extend(unknown.encode_to_vec());
        body
    }

    fn decoded(body: &[u8]) -> Value {
        serde_json::from_slice(&to_json(body).expect("decodes")).expect("JSON")
    }

    #[test]
    fn a_secret_becomes_the_json_kubectl_would_have_sent() {
        let secret = core::Secret {
            metadata: Some(meta::ObjectMeta {
                name: Some("creds".into()),
                labels: [("app".to_owned(), "web".to_owned())].into(),
                ..Default::default()
            }),
            data: [("password".to_owned(), b"s3cret".to_vec())].into(),
            r#type: Some("Opaque".into()),
            ..Default::default()
        };
        let json = decoded(&framed("v1", "Secret", secret.encode_to_vec()));
        assert_eq!(
            json,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "labels": {"app": "web"}},
                   "data": {"password": "czNjcmV0"}, "type": "Opaque"})
        );
    }

    #[test]
    fn namespaces_bindings_and_delete_options() {
        let ns = core::Namespace {
            metadata: Some(meta::ObjectMeta { name: Some("team-a".into()), ..Default::default() }),
            ..Default::default()
        };
        assert_eq!(
            decoded(&framed("v1", "Namespace", ns.encode_to_vec())),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
        );
        let binding = rbac::RoleBinding {
            metadata: Some(meta::ObjectMeta { name: Some("b".into()), ..Default::default() }),
            subjects: vec![rbac::Subject {
                kind: Some("ServiceAccount".into()),
                name: Some("sa".into()),
                namespace: Some("team-a".into()),
                ..Default::default()
            }],
            role_ref: Some(rbac::RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: Some("ClusterRole".into()),
                name: Some("edit".into()),
            }),
        };
        let json = decoded(&framed("rbac.authorization.k8s.io/v1", "RoleBinding", binding.encode_to_vec()));
        assert_eq!(json["subjects"], json!([{"kind": "ServiceAccount", "name": "sa", "namespace": "team-a"}]));
        assert_eq!(json["roleRef"]["name"], "edit");
        let options = meta::DeleteOptions {
            propagation_policy: Some("Background".into()),
            preconditions: Some(meta::Preconditions { uid: Some("u".into()), ..Default::default() }),
            ..Default::default()
        };
        let json = decoded(&framed("meta.k8s.io/v1", "DeleteOptions", options.encode_to_vec()));
        assert_eq!(json["propagationPolicy"], "Background");
        assert_eq!(json["preconditions"], json!({"uid": "u"}));
    }

    #[test]
    fn bad_bodies_and_other_kinds_are_refused_clearly() {
        assert_eq!(to_json(b"{\"kind\": \"Secret\"}").expect_err("no magic").code, 400);
        assert_eq!(to_json(b"k8s\0\xff\xff\xff").expect_err("garbage").code, 400);
        let error = to_json(&framed("apps/v1", "Deployment", Vec::new())).expect_err("not understood");
        assert_eq!(error.code, 415);
        assert!(is_protobuf("application/vnd.kubernetes.protobuf"));
        assert!(!is_protobuf("application/json"));
    }
}
