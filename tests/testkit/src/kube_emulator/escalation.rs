//! RBAC escalation prevention, as kube-apiserver's rbac registry applies it to writes
//! (create, update, patch, apply) of Roles, ClusterRoles, RoleBindings and
//! ClusterRoleBindings, so that a tenant holding `edit` or `admin` is refused exactly
//! where a real cluster refuses it:
//!
//! - a Role (ClusterRole) write passes when the writer already holds every permission
//!   its rules grant, in the Role's namespace (cluster-wide for a ClusterRole), or may
//!   `escalate` roles (clusterroles); a ClusterRole with an `aggregationRule` needs
//!   `*` on everything;
//! - a binding write passes when the writer may `bind` the referenced role (checked in
//!   the binding's namespace, with the role's name), or holds every permission of that
//!   role (a ClusterRole's rules in the binding's namespace for a RoleBinding);
//! - `system:masters` always passes; an update that touches only ownerReferences or
//!   finalizers (the garbage collector's fields) is not checked.
//!
//! "Holds every permission" is kube-apiserver's `Covers`: each rule is broken down into
//! one rule per (apiGroup, resource, verb, resourceName) or (nonResourceURL, verb), and
//! each piece is put to the RBAC authorizer ([`rbac::decide`]) as a request; a `*` is
//! asked literally, so only a `*` in a held rule covers it. The refusal lists the
//! missing pieces as kube-apiserver compacts and prints them.

use serde_json::{Value, json};

use super::auth::Identity;
use super::errors::ApiError;
use super::rbac::{self, Attributes, RbacObjects, quote};
use super::resources::{RBAC_GROUP, ResourceInfo};

/// kube-apiserver's `BreakdownRule`: one rule per group × resource × verb (× name),
/// then one per nonResourceURL × verb.
pub fn breakdown(rule: &Value) -> Vec<Value> {
    let list = |key: &str| -> Vec<&str> {
        rule.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect()
    };
    let (groups, resources, verbs, names, urls) =
        (list("apiGroups"), list("resources"), list("verbs"), list("resourceNames"), list("nonResourceURLs"));
    let mut pieces = Vec::new();
    for group in &groups {
        for resource in &resources {
            for verb in &verbs {
                if names.is_empty() {
                    pieces.push(json!({"apiGroups": [group], "resources": [resource], "verbs": [verb]}));
                }
                for name in &names {
                    pieces.push(json!({"apiGroups": [group], "resources": [resource], "verbs": [verb],
                        "resourceNames": [name]}));
                }
            }
        }
    }
    for url in &urls {
        for verb in &verbs {
            pieces.push(json!({"nonResourceURLs": [url], "verbs": [verb]}));
        }
    }
    pieces
}

fn first<'a>(piece: &'a Value, key: &str) -> Option<&'a str> {
    piece.get(key).and_then(Value::as_array).and_then(|list| list.first()).and_then(Value::as_str)
}

/// Whether `who` holds the broken-down rule `piece` in `namespace` (None: cluster-wide).
fn holds(objects: &dyn RbacObjects, who: &Identity, piece: &Value, namespace: Option<&str>) -> bool {
    let verb = first(piece, "verbs").unwrap_or("");
    if let Some(url) = first(piece, "nonResourceURLs") {
        let attrs = Attributes {
            verb,
            api_group: "",
            resource: "",
            subresource: None,
            namespace: None,
            name: None,
            non_resource_path: Some(url),
        };
        return rbac::decide(objects, who, &attrs).allowed;
    }
    let resource = first(piece, "resources").unwrap_or("");
    let (resource, subresource) = match resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub)),
        None => (resource, None),
    };
    let attrs = Attributes {
        verb,
        api_group: first(piece, "apiGroups").unwrap_or(""),
        resource,
        subresource,
        namespace,
        name: first(piece, "resourceNames"),
        non_resource_path: None,
    };
    rbac::decide(objects, who, &attrs).allowed
}

/// The broken-down pieces of `rules` that `who` does not hold in `namespace`.
pub fn missing(objects: &dyn RbacObjects, who: &Identity, rules: &[Value], namespace: Option<&str>) -> Vec<Value> {
    rules.iter().flat_map(breakdown).filter(|piece| !holds(objects, who, piece, namespace)).collect()
}

/// A simple rule's group, resource and name (kube-apiserver's `simpleResource`).
type SimpleKey = (String, String, Option<String>);

/// kube-apiserver's `CompactRules`: pieces with one group, one resource, at most one
/// name and nothing else are merged when they differ only by verb (verbs appended in
/// order); the others are kept as they are.
pub fn compact(pieces: Vec<Value>) -> Vec<Value> {
    let mut simple: Vec<(SimpleKey, Value)> = Vec::new();
    let mut compacted = Vec::new();
    for piece in pieces {
        let is_simple = piece.get("nonResourceURLs").is_none()
            && piece.get("resourceNames").and_then(Value::as_array).is_none_or(|names| names.len() <= 1);
        let key = (first(&piece, "apiGroups"), first(&piece, "resources"));
        let (true, (Some(group), Some(resource))) = (is_simple, key) else {
            compacted.push(piece);
            continue;
        };
        let key = (group.to_owned(), resource.to_owned(), first(&piece, "resourceNames").map(str::to_owned));
        match simple.iter_mut().find(|(existing, _)| *existing == key) {
            Some((_, rule)) => {
                let verbs = piece.get("verbs").and_then(Value::as_array).cloned().unwrap_or_default();
                if let Some(Value::Array(existing)) = rule.get_mut("verbs") {
                    existing.extend(verbs);
                }
            }
            None => simple.push((key, piece)),
        }
    }
    compacted.extend(simple.into_iter().map(|(_, rule)| rule));
    compacted
}

/// Go's `%q` of a string slice: `["a" "b"]`.
fn quoted_list(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|value| quote(value)).collect();
    format!("[{}]", quoted.join(" "))
}

/// kube-apiserver's `CompactString` of a rule: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`.
pub fn compact_string(rule: &Value) -> String {
    let mut parts = Vec::new();
    for (key, label) in [
        ("apiGroups", "APIGroups"),
        ("resources", "Resources"),
        ("nonResourceURLs", "NonResourceURLs"),
        ("resourceNames", "ResourceNames"),
        ("verbs", "Verbs"),
    ] {
        let values: Vec<&str> =
            rule.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        if !values.is_empty() {
            parts.push(format!("{label}:{}", quoted_list(&values)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

/// kube-apiserver's `ConfirmNoEscalation`: Err holds its message when `who` lacks some
/// of `rules` in `namespace` (None: cluster-wide).
pub fn confirm_no_escalation(
    objects: &dyn RbacObjects,
    who: &Identity,
    rules: &[Value],
    namespace: Option<&str>,
) -> Result<(), String> {
    let missing = missing(objects, who, rules, namespace);
    if missing.is_empty() {
        return Ok(());
    }
    let mut lines: Vec<String> = compact(missing).iter().map(compact_string).collect();
    lines.sort();
    lines.dedup();
    let groups: Vec<&str> = who.groups.iter().map(String::as_str).collect();
    Err(format!(
        "user {} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        quote(&who.user),
        quoted_list(&groups),
        lines.join("\n")
    ))
}

/// What a write of an RBAC object addresses, for the escalation check.
pub struct RbacWrite<'a> {
    pub info: &'a ResourceInfo,
    /// The namespace of the URL ("" for cluster-scoped kinds).
    pub namespace: &'a str,
    /// The name on the URL ("" for a create by POST), as the `escalate` check asks it.
    pub url_name: &'a str,
    pub old: Option<&'a Value>,
    pub new: &'a Value,
}

/// Whether a write of a Role, ClusterRole, RoleBinding or ClusterRoleBinding by `who`
/// passes escalation prevention; any other write passes. Err is the 403 the real
/// server answers.
pub fn check(objects: &dyn RbacObjects, who: &Identity, write: &RbacWrite) -> Result<(), ApiError> {
    if write.info.group != RBAC_GROUP || write.info.is_custom() || who.is_master() {
        return Ok(());
    }
    let plural = write.info.plural.as_str();
    if !matches!(plural, "roles" | "clusterroles" | "rolebindings" | "clusterrolebindings") {
        return Ok(());
    }
    if write.old.is_some_and(|old| only_gc_fields_change(old, write.new)) {
        return Ok(());
    }
    let namespace = Some(write.namespace).filter(|ns| !ns.is_empty());
    let name = write.new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let forbidden = |why: String| {
        let message = match name {
            "" => format!("{} is forbidden: {why}", write.info.qualified()),
            name => format!("{} {} is forbidden: {why}", write.info.qualified(), quote(name)),
        };
        ApiError::forbidden(message, json!({"name": name, "group": RBAC_GROUP, "kind": plural}))
    };
    let allowed = |verb: &str, resource: &str, name: &str| {
        let attrs = Attributes {
            verb,
            api_group: RBAC_GROUP,
            resource,
            subresource: None,
            namespace,
            name: Some(name).filter(|n| !n.is_empty()),
            non_resource_path: None,
        };
        rbac::decide(objects, who, &attrs).allowed
    };
    match plural {
        "roles" | "clusterroles" => {
            if allowed("escalate", plural, write.url_name) {
                return Ok(());
            }
            let rules = rules_of(write.new);
            confirm_no_escalation(objects, who, &rules, namespace).map_err(forbidden)?;
            if plural == "clusterroles" && write.new.get("aggregationRule").is_some_and(|rule| !rule.is_null()) {
                let everything = [
                    json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}),
                    json!({"verbs": ["*"], "nonResourceURLs": ["*"]}),
                ];
                confirm_no_escalation(objects, who, &everything, None).map_err(|_| {
                    forbidden("must have cluster-admin privileges to use the aggregationRule".to_owned())
                })?;
            }
            Ok(())
        }
        _ => {
            let role_ref = write.new.get("roleRef").unwrap_or(&Value::Null);
            let text = |key: &str| role_ref.get(key).and_then(Value::as_str).unwrap_or("");
            let (kind, role_group, role_name) = (text("kind"), text("apiGroup"), text("name"));
            let bind_resource = match kind {
                "ClusterRole" => Some("clusterroles"),
                "Role" => Some("roles"),
                _ => None,
            };
            if let Some(resource) = bind_resource {
                let attrs = Attributes {
                    verb: "bind",
                    api_group: role_group,
                    resource,
                    subresource: None,
                    namespace,
                    name: Some(role_name).filter(|n| !n.is_empty()),
                    non_resource_path: None,
                };
                if rbac::decide(objects, who, &attrs).allowed {
                    return Ok(());
                }
            }
            let rules = referenced_rules(objects, kind, role_name, write.namespace)?;
            confirm_no_escalation(objects, who, &rules, namespace).map_err(forbidden)
        }
    }
}

fn rules_of(role: &Value) -> Vec<Value> {
    role.get("rules").and_then(Value::as_array).cloned().unwrap_or_default()
}

/// The rules of the role a binding references, or the registry's error for a role
/// that does not exist (a 404, as v1.20 answers, not a 403).
fn referenced_rules(
    objects: &dyn RbacObjects,
    kind: &str,
    name: &str,
    namespace: &str,
) -> Result<Vec<Value>, ApiError> {
    let named = |roles: Vec<Value>| {
        roles.into_iter().find(|role| role.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
    };
    let (found, plural) = match kind {
        "ClusterRole" => (named(objects.cluster_roles()), "clusterroles"),
        "Role" => (named(objects.roles(namespace)), "roles"),
        other => {
            let message = format!("unsupported role reference kind: {}", quote(other));
            return Err(ApiError::forbidden(message, json!({"group": RBAC_GROUP})));
        }
    };
    found.map(|role| rules_of(&role)).ok_or_else(|| {
        ApiError::new(404, "NotFound", format!("{plural}.{RBAC_GROUP} {} not found", quote(name)))
            .with_details(json!({"name": name, "group": RBAC_GROUP, "kind": plural}))
    })
}

/// kube-apiserver's `IsOnlyMutatingGCFields`: equal but for ownerReferences,
/// finalizers and managedFields (and the resourceVersion a write carries).
fn only_gc_fields_change(old: &Value, new: &Value) -> bool {
    let strip = |object: &Value| {
        let mut copy = object.clone();
        if let Some(Value::Object(metadata)) = copy.get_mut("metadata") {
            for field in ["ownerReferences", "finalizers", "managedFields", "resourceVersion", "selfLink"] {
                metadata.remove(field);
            }
        }
        copy
    };
    strip(old) == strip(new)
}

#[cfg(test)]
mod tests {
    use super::super::resources::builtins;
    use super::*;

    #[derive(Default)]
    struct Objects {
        cluster_roles: Vec<Value>,
        cluster_role_bindings: Vec<Value>,
        roles: Vec<Value>,
        role_bindings: Vec<Value>,
    }

    impl RbacObjects for Objects {
        fn cluster_roles(&self) -> Vec<Value> {
            self.cluster_roles.clone()
        }
        fn cluster_role_bindings(&self) -> Vec<Value> {
            self.cluster_role_bindings.clone()
        }
        fn roles(&self, namespace: &str) -> Vec<Value> {
            self.roles.iter().filter(|r| r["metadata"]["namespace"] == namespace).cloned().collect()
        }
        fn role_bindings(&self, namespace: &str) -> Vec<Value> {
            self.role_bindings.iter().filter(|r| r["metadata"]["namespace"] == namespace).cloned().collect()
        }
    }

    fn sa() -> Identity {
        Identity {
            user: "system:serviceaccount:ns:dev".into(),
            uid: "u".into(),
            groups: vec!["system:serviceaccounts".into(), "system:serviceaccounts:ns".into()],
        }
    }

    /// The bootstrap cluster roles, and `dev` in `ns` bound to `edit` plus `extra` rules.
    fn objects(extra: Value) -> Objects {
        let subject = json!([{"kind": "ServiceAccount", "name": "dev", "namespace": "ns"}]);
        let binding = |name: &str, kind: &str, role: &str| {
            json!({"metadata": {"name": name, "namespace": "ns"}, "subjects": subject,
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": kind, "name": role}})
        };
        Objects {
            cluster_roles: rbac::bootstrap_cluster_roles(),
            roles: vec![json!({"metadata": {"name": "extra", "namespace": "ns"}, "rules": extra})],
            role_bindings: vec![binding("edit", "ClusterRole", "edit"), binding("extra", "Role", "extra")],
            ..Objects::default()
        }
    }

    fn info(plural: &str) -> ResourceInfo {
        builtins().into_iter().find(|i| i.plural == plural).expect("builtin")
    }

    fn write<'a>(info: &'a ResourceInfo, new: &'a Value) -> RbacWrite<'a> {
        RbacWrite { info, namespace: "ns", url_name: "", old: None, new }
    }

    #[test]
    fn rules_break_down_into_single_permissions() {
        let rule = json!({"apiGroups": ["", "apps"], "resources": ["pods"], "verbs": ["get", "list"],
            "resourceNames": ["a"]});
        let pieces = breakdown(&rule);
        assert_eq!(pieces.len(), 4);
        assert_eq!(
            pieces[1],
            json!({"apiGroups": [""], "resources": ["pods"], "verbs": ["list"], "resourceNames": ["a"]})
        );
        let urls = breakdown(&json!({"nonResourceURLs": ["/a", "/b*"], "verbs": ["get"]}));
        assert_eq!(
            urls,
            [
                json!({"nonResourceURLs": ["/a"], "verbs": ["get"]}),
                json!({"nonResourceURLs": ["/b*"], "verbs": ["get"]})
            ]
        );
    }

    #[test]
    fn missing_pieces_are_compacted_and_printed_like_kube_apiserver() {
        let pieces = breakdown(&json!({"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "*"]}));
        let compacted = compact(pieces);
        let printed: Vec<String> = compacted.iter().map(compact_string).collect();
        assert_eq!(
            printed,
            [
                "{APIGroups:[\"\"], Resources:[\"nodes\"], Verbs:[\"get\" \"*\"]}",
                "{APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"get\" \"*\"]}"
            ]
        );
        assert_eq!(
            compact_string(&json!({"nonResourceURLs": ["/x"], "verbs": ["get"]})),
            "{NonResourceURLs:[\"/x\"], Verbs:[\"get\"]}"
        );
    }

    #[test]
    fn a_role_within_held_permissions_passes_and_a_wider_one_is_refused() {
        let objects = objects(json!([]));
        let roles = info("roles");
        let held = json!({"metadata": {"name": "r"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "create"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]});
        assert!(check(&objects, &sa(), &write(&roles, &held)).is_ok());
        let star = json!({"metadata": {"name": "r"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]});
        let error = check(&objects, &sa(), &write(&roles, &star)).unwrap_err();
        assert_eq!(error.code, 403);
        assert_eq!(
            error.message,
            "roles.rbac.authorization.k8s.io \"r\" is forbidden: user \"system:serviceaccount:ns:dev\" \
             (groups=[\"system:serviceaccounts\" \"system:serviceaccounts:ns\"]) is attempting to grant RBAC \
             permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"configmaps\"], Verbs:[\"*\"]}"
        );
        // The same rules in a namespace where the writer holds nothing.
        let elsewhere = RbacWrite { namespace: "other", ..write(&roles, &held) };
        assert!(check(&objects, &sa(), &elsewhere).is_err());
        // escalate on roles lifts the check; so does system:masters.
        let objects =
            self::objects(json!([{"apiGroups": [RBAC_GROUP], "resources": ["roles"], "verbs": ["escalate"]}]));
        assert!(check(&objects, &sa(), &write(&roles, &star)).is_ok());
        let admin = Identity { user: "root".into(), uid: String::new(), groups: vec!["system:masters".into()] };
        assert!(check(&Objects::default(), &admin, &write(&roles, &star)).is_ok());
    }

    #[test]
    fn bindings_need_the_role_s_permissions_or_bind() {
        let objects = objects(json!([]));
        let bindings = info("rolebindings");
        let to = |role: &str| {
            json!({"metadata": {"name": "b"}, "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "User", "name": "x"}]})
        };
        assert!(check(&objects, &sa(), &write(&bindings, &to("view"))).is_ok());
        assert!(check(&objects, &sa(), &write(&bindings, &to("edit"))).is_ok());
        let error = check(&objects, &sa(), &write(&bindings, &to("admin"))).unwrap_err();
        assert!(
            error.message.starts_with("rolebindings.rbac.authorization.k8s.io \"b\" is forbidden: user "),
            "{}",
            error.message
        );
        assert!(
            error.message.contains(
                "{APIGroups:[\"rbac.authorization.k8s.io\"], Resources:[\"rolebindings\"], Verbs:[\"create\""
            ),
            "{}",
            error.message
        );
        let error = check(&objects, &sa(), &write(&bindings, &to("absent"))).unwrap_err();
        assert_eq!(
            (error.code, error.message.as_str()),
            (404, "clusterroles.rbac.authorization.k8s.io \"absent\" not found")
        );
        // bind on clusterroles/admin, in the binding's namespace.
        let objects = self::objects(json!([{"apiGroups": [RBAC_GROUP], "resources": ["clusterroles"],
            "verbs": ["bind"], "resourceNames": ["admin"]}]));
        assert!(check(&objects, &sa(), &write(&bindings, &to("admin"))).is_ok());
        assert!(check(&objects, &sa(), &write(&bindings, &to("cluster-admin"))).is_err());
    }

    #[test]
    fn gc_only_updates_and_other_kinds_are_not_checked() {
        let objects = objects(json!([]));
        let roles = info("roles");
        let old = json!({"metadata": {"name": "r", "resourceVersion": "1"}, "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = json!(["x/y"]);
        assert!(check(&objects, &sa(), &RbacWrite { old: Some(&old), ..write(&roles, &new) }).is_ok());
        new["metadata"]["labels"] = json!({"a": "b"});
        assert!(check(&objects, &sa(), &RbacWrite { old: Some(&old), ..write(&roles, &new) }).is_err());
        assert!(check(&objects, &sa(), &write(&info("configmaps"), &new)).is_ok());
    }
}
