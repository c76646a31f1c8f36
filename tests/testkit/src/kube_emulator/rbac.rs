//! RBAC authorization as kube-apiserver's RBAC authorizer decides it, so that a tenant's
//! ServiceAccount is refused by the emulator exactly where a real cluster refuses it:
//! the rules of every ClusterRoleBinding, then of every RoleBinding in the request's
//! namespace, that names the caller (User, Group, or ServiceAccount — a ServiceAccount
//! subject without namespace meaning the binding's namespace); a RoleBinding may grant a
//! ClusterRole's rules, only in its namespace. A rule matches on verbs (`*`), apiGroups
//! (`*`), resources (`*`, `resource/subresource`, `*/subresource`), resourceNames (only
//! requests that name an object: a list, watch or create never matches a rule with
//! names) and, for requests outside the API, nonResourceURLs (`*`, or a prefix ending in
//! `*`; only ClusterRoleBindings grant these). `system:masters` may do anything.
//!
//! Also the bootstrap roles and bindings kube-apiserver v1.20 creates (the ones listed in
//! [`bootstrap_cluster_roles`], with the real rules). ClusterRole aggregation is not run:
//! the aggregated roles (admin, edit, view) carry their v1.20 rules directly, and a
//! ClusterRole created with an `aggregationRule` gets only the rules it was given.

use serde_json::{Value, json};

use super::auth::Identity;

/// What a request asks, as kube-apiserver's `authorizer.Attributes`.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub api_group: &'a str,
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    /// Set for requests outside the API (`/version`, `/healthz`…): then only the verb
    /// and this path count.
    pub non_resource_path: Option<&'a str>,
}

/// The RBAC objects of the cluster, as JSON.
pub trait RbacObjects {
    fn cluster_roles(&self) -> Vec<Value>;
    fn cluster_role_bindings(&self) -> Vec<Value>;
    fn roles(&self, namespace: &str) -> Vec<Value>;
    fn role_bindings(&self, namespace: &str) -> Vec<Value>;
}

/// An authorization decision with kube-apiserver's reason: which binding allowed, or
/// for a denial `RBAC: role… not found` when a binding that names the caller points at
/// a missing role (empty when there is none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// Whether `who` may do what `attrs` asks. `system:masters` always may. (The server
/// calls [`decide`] for the reason of a denial; this is the verdict alone.)
#[cfg(test)]
pub fn authorize(objects: &dyn RbacObjects, who: &Identity, attrs: &Attributes) -> bool {
    decide(objects, who, attrs).allowed
}

/// [`authorize`], with kube-apiserver's reason: for an allow, the binding that
/// allowed (`RBAC: allowed by RoleBinding "b/ns" of ClusterRole "edit" to
/// ServiceAccount "sa/ns"`); for a denial, the roles bindings point at that are missing.
pub fn decide(objects: &dyn RbacObjects, who: &Identity, attrs: &Attributes) -> Decision {
    if who.is_master() {
        return Decision { allowed: true, reason: String::new() };
    }
    let mut errors: Vec<String> = Vec::new();
    let cluster_roles = objects.cluster_roles();
    for binding in objects.cluster_role_bindings() {
        let Some(subject) = applicable_subject(&binding, who, "") else { continue };
        match role_rules(&binding, &cluster_roles, &[], "") {
            Ok(rules) if rules.iter().any(|rule| rule_allows(rule, attrs)) => {
                return allowed_by(&binding, subject, "");
            }
            Ok(_) => {}
            Err(error) => errors.push(error),
        }
    }
    if let Some(namespace) = attrs.namespace.filter(|ns| !ns.is_empty() && attrs.non_resource_path.is_none()) {
        let roles = objects.roles(namespace);
        for binding in objects.role_bindings(namespace) {
            let Some(subject) = applicable_subject(&binding, who, namespace) else { continue };
            match role_rules(&binding, &cluster_roles, &roles, namespace) {
                Ok(rules) if rules.iter().any(|rule| rule_allows(rule, attrs)) => {
                    return allowed_by(&binding, subject, namespace);
                }
                Ok(_) => {}
                Err(error) => errors.push(error),
            }
        }
    }
    Decision { allowed: false, reason: aggregate_reason(errors) }
}

/// The allow reason of kube-apiserver's RBAC authorizer (its binding "describers").
fn allowed_by(binding: &Value, subject: &Value, namespace: &str) -> Decision {
    let name = binding.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let role_ref = binding.get("roleRef").unwrap_or(&Value::Null);
    let (kind, role) = (text(role_ref, "kind"), text(role_ref, "name"));
    let who = match text(subject, "kind") {
        "ServiceAccount" => {
            let sa_namespace = match text(subject, "namespace") {
                "" => namespace,
                given => given,
            };
            format!("ServiceAccount {}", quote(&format!("{}/{sa_namespace}", text(subject, "name"))))
        }
        other => format!("{other} {}", quote(text(subject, "name"))),
    };
    let source = match namespace {
        "" => format!("ClusterRoleBinding {} of {kind} {} to {who}", quote(name), quote(role)),
        ns => format!("RoleBinding {} of {kind} {} to {who}", quote(&format!("{name}/{ns}")), quote(role)),
    };
    Decision { allowed: true, reason: format!("RBAC: allowed by {source}") }
}

/// `RBAC: <error>`, or `RBAC: [<e1>, <e2>]` for several distinct errors.
fn aggregate_reason(mut errors: Vec<String>) -> String {
    let mut seen = std::collections::HashSet::new();
    errors.retain(|error| seen.insert(error.clone()));
    match errors.as_slice() {
        [] => String::new(),
        [one] => format!("RBAC: {one}"),
        many => format!("RBAC: [{}]", many.join(", ")),
    }
}

fn strings<'a>(value: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    value.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str)
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The first subject of `binding` that names `who`.
fn applicable_subject<'a>(binding: &'a Value, who: &Identity, namespace: &str) -> Option<&'a Value> {
    let mut subjects = binding.get("subjects").and_then(Value::as_array).into_iter().flatten();
    subjects.find(|subject| subject_applies(subject, who, namespace))
}

fn subject_applies(subject: &Value, who: &Identity, namespace: &str) -> bool {
    let name = text(subject, "name");
    match text(subject, "kind") {
        "User" => who.user == name,
        "Group" => who.groups.iter().any(|group| group == name),
        "ServiceAccount" => {
            let sa_namespace = match text(subject, "namespace") {
                "" => namespace,
                given => given,
            };
            !sa_namespace.is_empty() && who.user == format!("system:serviceaccount:{sa_namespace}:{name}")
        }
        _ => false,
    }
}

/// The rules a binding grants, or kube-apiserver's error for a role it cannot find.
fn role_rules<'a>(
    binding: &Value,
    cluster_roles: &'a [Value],
    roles: &'a [Value],
    namespace: &str,
) -> Result<Vec<&'a Value>, String> {
    let role_ref = binding.get("roleRef").unwrap_or(&Value::Null);
    let name = text(role_ref, "name");
    let named = |objects: &'a [Value]| {
        objects.iter().find(|object| object.pointer("/metadata/name").and_then(Value::as_str) == Some(name))
    };
    let role = match text(role_ref, "kind") {
        "ClusterRole" => {
            named(cluster_roles).ok_or_else(|| format!("clusterrole.rbac.authorization.k8s.io {name:?} not found"))?
        }
        "Role" if namespace.is_empty() => return Err(format!("role.rbac.authorization.k8s.io {name:?} not found")),
        "Role" => named(roles).ok_or_else(|| format!("role.rbac.authorization.k8s.io {name:?} not found"))?,
        other => return Err(format!("unsupported role reference kind: {other:?}")),
    };
    Ok(role.get("rules").and_then(Value::as_array).into_iter().flatten().collect())
}

/// kube-apiserver's `RuleAllows`.
fn rule_allows(rule: &Value, attrs: &Attributes) -> bool {
    let verb_matches = strings(rule, "verbs").any(|verb| verb == "*" || verb == attrs.verb);
    if !verb_matches {
        return false;
    }
    if let Some(path) = attrs.non_resource_path {
        return strings(rule, "nonResourceURLs").any(|url| {
            url == "*" || url == path || url.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
        });
    }
    let group_matches = strings(rule, "apiGroups").any(|group| group == "*" || group == attrs.api_group);
    let subresource = attrs.subresource.filter(|sub| !sub.is_empty());
    let combined = match subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.to_owned(),
    };
    let resource_matches = strings(rule, "resources").any(|resource| {
        resource == "*"
            || resource == combined
            || subresource.is_some_and(|sub| resource.strip_prefix("*/") == Some(sub))
    });
    let mut names = strings(rule, "resourceNames").peekable();
    let name_matches = names.peek().is_none() || names.any(|name| Some(name) == attrs.name.filter(|n| !n.is_empty()));
    group_matches && resource_matches && name_matches
}

/// The Forbidden message kube-apiserver writes, e.g. `namespaces is forbidden: User "system:anonymous" cannot list resource "namespaces" in API group "" at the cluster scope`, `secrets "x" is forbidden: User "u" cannot get resource "secrets" in API group "" in the namespace "ns"`.
pub fn forbidden_message(who: &Identity, attrs: &Attributes) -> String {
    let user = quote(&who.user);
    let verb = attrs.verb;
    let detail = match attrs.non_resource_path {
        Some(path) => format!("User {user} cannot {verb} path {}", quote(path)),
        None => {
            let resource = match attrs.subresource.filter(|sub| !sub.is_empty()) {
                Some(sub) => format!("{}/{sub}", attrs.resource),
                None => attrs.resource.to_owned(),
            };
            let scope = match attrs.namespace.filter(|ns| !ns.is_empty()) {
                Some(namespace) => format!("in the namespace {}", quote(namespace)),
                None => "at the cluster scope".to_owned(),
            };
            format!(
                "User {user} cannot {verb} resource {} in API group {} {scope}",
                quote(&resource),
                quote(attrs.api_group)
            )
        }
    };
    let detail = detail.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    if attrs.non_resource_path.is_some() || attrs.resource.is_empty() {
        return format!("forbidden: {detail}");
    }
    let qualified = match attrs.api_group {
        "" => attrs.resource.to_owned(),
        group => format!("{}.{group}", attrs.resource),
    };
    match attrs.name.filter(|name| !name.is_empty()) {
        Some(name) => format!("{qualified} {} is forbidden: {detail}", quote(name)),
        None => format!("{qualified} is forbidden: {detail}"),
    }
}

/// [`forbidden_message`] with the authorizer's reason appended (`…: RBAC: …`), as the
/// real server writes it when a binding points at a missing role.
pub fn forbidden_message_with_reason(who: &Identity, attrs: &Attributes, reason: &str) -> String {
    match reason {
        "" => forbidden_message(who, attrs),
        reason => format!("{}: {reason}", forbidden_message(who, attrs)),
    }
}

/// Go's `%q` for the plain strings Kubernetes names are.
pub fn quote(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

const READ: [&str; 3] = ["get", "list", "watch"];
const WRITE: [&str; 5] = ["create", "delete", "deletecollection", "patch", "update"];

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn url_rule(urls: &[&str], verbs: &[&str]) -> Value {
    json!({"nonResourceURLs": urls, "verbs": verbs})
}

fn bootstrap_meta(name: &str, extra_labels: &[(&str, &str)]) -> Value {
    let mut labels = serde_json::Map::new();
    labels.insert("kubernetes.io/bootstrapping".to_owned(), json!("rbac-defaults"));
    for (key, value) in extra_labels {
        labels.insert((*key).to_owned(), json!(value));
    }
    json!({"name": name, "labels": labels, "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
}

fn cluster_role(name: &str, extra_labels: &[(&str, &str)], aggregate_to: Option<&str>, rules: Vec<Value>) -> Value {
    let mut role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": bootstrap_meta(name, extra_labels),
        "rules": rules,
    });
    if let Some(target) = aggregate_to {
        let label = format!("rbac.authorization.k8s.io/aggregate-to-{target}");
        role["aggregationRule"] = json!({"clusterRoleSelectors": [{"matchLabels": {label: "true"}}]});
    }
    role
}

/// The rules of `view` in v1.20.
#[rustfmt::skip]
fn view_rules() -> Vec<Value> {
    vec![
        rule(&[""], &["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
            "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services", "services/status"], &READ),
        rule(&[""], &["bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
            "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"], &READ),
        rule(&[""], &["namespaces"], &READ),
        rule(&["apps"], &["controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale",
            "deployments/status", "replicasets", "replicasets/scale", "replicasets/status", "statefulsets",
            "statefulsets/scale", "statefulsets/status"], &READ),
        rule(&["autoscaling"], &["horizontalpodautoscalers", "horizontalpodautoscalers/status"], &READ),
        rule(&["batch"], &["cronjobs", "cronjobs/status", "jobs", "jobs/status"], &READ),
        rule(&["extensions"], &["daemonsets", "daemonsets/status", "deployments", "deployments/scale", "deployments/status",
            "ingresses", "ingresses/status", "networkpolicies", "replicasets", "replicasets/scale", "replicasets/status",
            "replicationcontrollers/scale"], &READ),
        rule(&["policy"], &["poddisruptionbudgets", "poddisruptionbudgets/status"], &READ),
        rule(&["networking.k8s.io"], &["ingresses", "ingresses/status", "networkpolicies"], &READ),
    ]
}

/// The rules of `edit` in v1.20: its own, then `view`'s.
#[rustfmt::skip]
fn edit_rules() -> Vec<Value> {
    let mut rules = vec![
        rule(&[""], &["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"], &READ),
        rule(&[""], &["serviceaccounts"], &["impersonate"]),
        rule(&[""], &["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"], &WRITE),
        rule(&[""], &["configmaps", "endpoints", "persistentvolumeclaims", "replicationcontrollers",
            "replicationcontrollers/scale", "secrets", "serviceaccounts", "services", "services/proxy"], &WRITE),
        rule(&["apps"], &["daemonsets", "deployments", "deployments/rollback", "deployments/scale", "replicasets",
            "replicasets/scale", "statefulsets", "statefulsets/scale"], &WRITE),
        rule(&["autoscaling"], &["horizontalpodautoscalers"], &WRITE),
        rule(&["batch"], &["cronjobs", "jobs"], &WRITE),
        rule(&["extensions"], &["daemonsets", "deployments", "deployments/rollback", "deployments/scale", "ingresses",
            "networkpolicies", "replicasets", "replicasets/scale", "replicationcontrollers/scale"], &WRITE),
        rule(&["policy"], &["poddisruptionbudgets"], &WRITE),
        rule(&["networking.k8s.io"], &["ingresses", "networkpolicies"], &WRITE),
    ];
    rules.extend(view_rules());
    rules
}

/// ClusterRoles cluster-admin, admin, edit, view, system:discovery, system:public-info-viewer, system:basic-user, as kube-apiserver 1.20 bootstraps them
/// (every rule, labels and annotations of the real objects; admin, edit and view with
/// their aggregated rules filled in).
pub fn bootstrap_cluster_roles() -> Vec<Value> {
    let mut admin_rules = edit_rules();
    admin_rules.push(rule(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]));
    admin_rules.push(rule(
        &["rbac.authorization.k8s.io"],
        &["rolebindings", "roles"],
        &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
    ));
    let health = ["/healthz", "/livez", "/readyz", "/version", "/version/"];
    let discovery = [
        "/api",
        "/api/*",
        "/apis",
        "/apis/*",
        "/healthz",
        "/livez",
        "/openapi",
        "/openapi/*",
        "/readyz",
        "/version",
        "/version/",
    ];
    vec![
        cluster_role("cluster-admin", &[], None, vec![rule(&["*"], &["*"], &["*"]), url_rule(&["*"], &["*"])]),
        cluster_role("admin", &[], Some("admin"), admin_rules),
        cluster_role("edit", &[("rbac.authorization.k8s.io/aggregate-to-admin", "true")], Some("edit"), edit_rules()),
        cluster_role("view", &[("rbac.authorization.k8s.io/aggregate-to-edit", "true")], Some("view"), view_rules()),
        cluster_role("system:discovery", &[], None, vec![url_rule(&discovery, &["get"])]),
        cluster_role("system:public-info-viewer", &[], None, vec![url_rule(&health, &["get"])]),
        cluster_role(
            "system:basic-user",
            &[],
            None,
            vec![rule(
                &["authorization.k8s.io"],
                &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                &["create"],
            )],
        ),
    ]
}

/// cluster-admin → group system:masters; system:discovery, system:basic-user → system:authenticated; system:public-info-viewer → system:authenticated + system:unauthenticated.
pub fn bootstrap_cluster_role_bindings() -> Vec<Value> {
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<Value> = groups
            .iter()
            .map(|group| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}))
            .collect();
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": bootstrap_meta(name, &[]),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        })
    };
    vec![
        binding("cluster-admin", &["system:masters"]),
        binding("system:discovery", &["system:authenticated"]),
        binding("system:basic-user", &["system:authenticated"]),
        binding("system:public-info-viewer", &["system:authenticated", "system:unauthenticated"]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Objects {
        cluster_roles: Vec<Value>,
        cluster_role_bindings: Vec<Value>,
        roles: Vec<Value>,
        role_bindings: Vec<Value>,
    }

    fn in_namespace(objects: &[Value], namespace: &str) -> Vec<Value> {
        objects.iter().filter(|o| o["metadata"]["namespace"] == namespace).cloned().collect()
    }

    impl RbacObjects for Objects {
        fn cluster_roles(&self) -> Vec<Value> {
            self.cluster_roles.clone()
        }
        fn cluster_role_bindings(&self) -> Vec<Value> {
            self.cluster_role_bindings.clone()
        }
        fn roles(&self, namespace: &str) -> Vec<Value> {
            in_namespace(&self.roles, namespace)
        }
        fn role_bindings(&self, namespace: &str) -> Vec<Value> {
            in_namespace(&self.role_bindings, namespace)
        }
    }

    fn bootstrapped() -> Objects {
        Objects {
            cluster_roles: bootstrap_cluster_roles(),
            cluster_role_bindings: bootstrap_cluster_role_bindings(),
            ..Objects::default()
        }
    }

    fn role(namespace: &str, name: &str, rules: Value) -> Value {
        json!({"kind": "Role", "metadata": {"name": name, "namespace": namespace}, "rules": rules})
    }

    fn role_binding(namespace: &str, kind: &str, role: &str, subjects: Value) -> Value {
        json!({"kind": "RoleBinding", "metadata": {"name": format!("rb-{role}"), "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}, "subjects": subjects})
    }

    fn sa(namespace: &str, name: &str) -> Identity {
        Identity {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            uid: "u".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    fn user(name: &str, groups: &[&str]) -> Identity {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".into());
        Identity { user: name.into(), uid: String::new(), groups }
    }

    fn ask<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        namespace: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes { verb, api_group: group, resource, subresource: None, namespace, name, non_resource_path: None }
    }

    fn path(verb: &'static str, path: &'static str) -> Attributes<'static> {
        Attributes { non_resource_path: Some(path), ..ask(verb, "", "", None, None) }
    }

    #[test]
    fn masters_may_do_anything_and_strangers_nothing() {
        let objects = Objects::default();
        let admin = user("admin", &["system:masters"]);
        assert!(authorize(&objects, &admin, &ask("delete", "", "namespaces", None, Some("x"))));
        assert!(!authorize(&objects, &user("u", &[]), &ask("get", "", "secrets", Some("ns"), Some("x"))));
    }

    #[test]
    fn bootstrap_bindings_open_discovery_and_health_as_the_real_server() {
        let objects = bootstrapped();
        let anonymous = Identity::anonymous();
        assert!(authorize(&objects, &anonymous, &path("get", "/version")));
        assert!(authorize(&objects, &anonymous, &path("get", "/healthz")));
        assert!(!authorize(&objects, &anonymous, &path("get", "/api")));
        assert!(!authorize(&objects, &anonymous, &ask("list", "", "namespaces", None, None)));
        let someone = user("someone", &[]);
        assert!(authorize(&objects, &someone, &path("get", "/api")));
        assert!(authorize(&objects, &someone, &path("get", "/apis/argoproj.io/v1alpha1")));
        assert!(authorize(&objects, &someone, &path("get", "/openapi/v2")));
        assert!(!authorize(&objects, &someone, &path("post", "/api")));
        assert!(!authorize(&objects, &someone, &path("get", "/metrics")));
        assert!(authorize(
            &objects,
            &someone,
            &ask("create", "authorization.k8s.io", "selfsubjectaccessreviews", None, None)
        ));
        assert!(!authorize(&objects, &someone, &ask("list", "", "namespaces", None, None)));
        let names: Vec<String> = bootstrap_cluster_roles().iter().map(|r| r["metadata"]["name"].to_string()).collect();
        let expected = [
            "cluster-admin",
            "admin",
            "edit",
            "view",
            "system:discovery",
            "system:public-info-viewer",
            "system:basic-user",
        ];
        assert_eq!(names, expected.map(|name| format!("{name:?}")));
    }

    #[test]
    fn a_role_binding_grants_in_its_namespace_only() {
        let mut objects = bootstrapped();
        objects.roles.push(role(
            "team",
            "reader",
            json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]),
        ));
        // A ServiceAccount subject without namespace means the binding's namespace.
        objects.role_bindings.push(role_binding(
            "team",
            "Role",
            "reader",
            json!([{"kind": "ServiceAccount", "name": "bot"}]),
        ));
        let bot = sa("team", "bot");
        assert!(authorize(&objects, &bot, &ask("get", "", "secrets", Some("team"), Some("s"))));
        assert!(authorize(&objects, &bot, &ask("list", "", "secrets", Some("team"), None)));
        assert!(!authorize(&objects, &bot, &ask("delete", "", "secrets", Some("team"), Some("s"))));
        assert!(!authorize(&objects, &bot, &ask("get", "", "secrets", Some("other"), Some("s"))));
        assert!(!authorize(&objects, &bot, &ask("list", "", "secrets", None, None)));
        assert!(!authorize(&objects, &bot, &ask("get", "", "configmaps", Some("team"), Some("s"))));
        // The same name in another namespace is another ServiceAccount.
        assert!(!authorize(&objects, &sa("other", "bot"), &ask("get", "", "secrets", Some("team"), Some("s"))));
    }

    #[test]
    fn a_role_binding_may_grant_a_cluster_role_in_its_namespace() {
        let mut objects = bootstrapped();
        objects.role_bindings.push(role_binding(
            "team",
            "ClusterRole",
            "edit",
            json!([{"kind": "User", "name": "alice"}]),
        ));
        let alice = user("alice", &[]);
        assert!(authorize(&objects, &alice, &ask("create", "", "secrets", Some("team"), None)));
        assert!(authorize(&objects, &alice, &ask("patch", "apps", "deployments", Some("team"), Some("d"))));
        assert!(!authorize(&objects, &alice, &ask("create", "rbac.authorization.k8s.io", "roles", Some("team"), None)));
        assert!(!authorize(&objects, &alice, &ask("create", "", "secrets", Some("other"), None)));
        assert!(!authorize(&objects, &alice, &ask("list", "", "namespaces", None, None)));
        // view reads but does not see secrets; admin manages roles.
        objects.role_bindings.push(role_binding(
            "team",
            "ClusterRole",
            "view",
            json!([{"kind": "Group", "name": "auditors"}]),
        ));
        objects.role_bindings.push(role_binding(
            "team",
            "ClusterRole",
            "admin",
            json!([{"kind": "User", "name": "boss"}]),
        ));
        let auditor = user("carl", &["auditors"]);
        assert!(authorize(&objects, &auditor, &ask("list", "", "configmaps", Some("team"), None)));
        assert!(!authorize(&objects, &auditor, &ask("get", "", "secrets", Some("team"), Some("s"))));
        assert!(authorize(
            &objects,
            &user("boss", &[]),
            &ask("create", "rbac.authorization.k8s.io", "rolebindings", Some("team"), None)
        ));
    }

    #[test]
    fn cluster_role_bindings_grant_everywhere_and_need_a_namespace_for_service_accounts() {
        let mut objects = bootstrapped();
        objects.cluster_roles.push(json!({"kind": "ClusterRole", "metadata": {"name": "ns-reader"},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]}));
        objects.cluster_role_bindings.push(json!({"kind": "ClusterRoleBinding", "metadata": {"name": "b"},
            "roleRef": {"kind": "ClusterRole", "name": "ns-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "team"}, {"kind": "ServiceAccount", "name": "nobody"}]}));
        assert!(authorize(&objects, &sa("team", "bot"), &ask("watch", "", "namespaces", None, None)));
        assert!(authorize(&objects, &sa("team", "bot"), &ask("get", "", "namespaces", None, Some("x"))));
        assert!(!authorize(&objects, &sa("team", "nobody"), &ask("list", "", "namespaces", None, None)));
    }

    #[test]
    fn wildcards_and_subresources_match_as_in_kubernetes() {
        let grant = |rules: Value| {
            let mut objects = Objects::default();
            objects.roles.push(role("ns", "r", rules));
            objects.role_bindings.push(role_binding("ns", "Role", "r", json!([{"kind": "User", "name": "u"}])));
            objects
        };
        let u = user("u", &[]);
        let with_sub = |verb: &'static str, group: &'static str, resource: &'static str, sub: &'static str| {
            Attributes { subresource: Some(sub), ..ask(verb, group, resource, Some("ns"), Some("x")) }
        };
        let all = grant(json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]));
        assert!(authorize(&all, &u, &ask("deletecollection", "argoproj.io", "applications", Some("ns"), None)));
        assert!(authorize(&all, &u, &with_sub("update", "argoproj.io", "applications", "status")));
        let status = grant(json!([{"apiGroups": ["argoproj.io"], "resources": ["*/status"], "verbs": ["update"]}]));
        assert!(authorize(&status, &u, &with_sub("update", "argoproj.io", "applications", "status")));
        assert!(!authorize(&status, &u, &ask("update", "argoproj.io", "applications", Some("ns"), Some("x"))));
        assert!(!authorize(&status, &u, &with_sub("update", "argoproj.io", "applications", "scale")));
        assert!(!authorize(&status, &u, &with_sub("update", "", "pods", "status")));
        let main_only =
            grant(json!([{"apiGroups": ["apps"], "resources": ["deployments", "pods/*"], "verbs": ["get"]}]));
        assert!(authorize(&main_only, &u, &ask("get", "apps", "deployments", Some("ns"), Some("x"))));
        assert!(!authorize(&main_only, &u, &with_sub("get", "apps", "deployments", "status")));
        // "pods/*" is not a pattern.
        assert!(!authorize(&main_only, &u, &with_sub("get", "apps", "pods", "log")));
        let token = grant(json!([{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}]));
        assert!(authorize(&token, &u, &with_sub("create", "", "serviceaccounts", "token")));
        assert!(!authorize(&token, &u, &ask("create", "", "serviceaccounts", Some("ns"), None)));
    }

    #[test]
    fn resource_names_limit_requests_that_name_an_object() {
        let mut objects = Objects::default();
        objects.roles.push(role(
            "ns",
            "one",
            json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["*"]}]),
        ));
        objects.role_bindings.push(role_binding("ns", "Role", "one", json!([{"kind": "User", "name": "u"}])));
        let u = user("u", &[]);
        for verb in ["get", "update", "patch", "delete"] {
            assert!(authorize(&objects, &u, &ask(verb, "", "configmaps", Some("ns"), Some("cfg"))), "{verb}");
            assert!(!authorize(&objects, &u, &ask(verb, "", "configmaps", Some("ns"), Some("other"))), "{verb}");
        }
        for verb in ["list", "watch", "create", "deletecollection"] {
            assert!(!authorize(&objects, &u, &ask(verb, "", "configmaps", Some("ns"), None)), "{verb}");
        }
        // A list or watch of one named object (fieldSelector metadata.name) carries the name.
        assert!(authorize(&objects, &u, &ask("watch", "", "configmaps", Some("ns"), Some("cfg"))));
    }

    #[test]
    fn non_resource_urls_are_granted_by_cluster_role_bindings_only() {
        let mut objects = Objects::default();
        objects.cluster_roles.push(json!({"metadata": {"name": "metrics"}, "rules": [{"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]}]}));
        objects.role_bindings.push(role_binding(
            "ns",
            "ClusterRole",
            "metrics",
            json!([{"kind": "User", "name": "u"}]),
        ));
        let u = user("u", &[]);
        assert!(!authorize(&objects, &u, &path("get", "/metrics")));
        objects.cluster_role_bindings.push(json!({"metadata": {"name": "m"}, "roleRef": {"kind": "ClusterRole", "name": "metrics"}, "subjects": [{"kind": "User", "name": "u"}]}));
        assert!(authorize(&objects, &u, &path("get", "/metrics")));
        assert!(authorize(&objects, &u, &path("get", "/logs/kube.log")));
        assert!(!authorize(&objects, &u, &path("get", "/metrics/extra")));
        assert!(!authorize(&objects, &u, &path("put", "/metrics")));
    }

    #[test]
    fn a_binding_to_a_missing_role_denies_with_the_reason() {
        let mut objects = bootstrapped();
        objects.role_bindings.push(role_binding(
            "ns",
            "Role",
            "missing",
            json!([{"kind": "ServiceAccount", "name": "sa1"}]),
        ));
        let who = sa("ns", "sa1");
        let attrs = ask("list", "", "secrets", Some("ns"), None);
        let decision = decide(&objects, &who, &attrs);
        assert_eq!(
            decision,
            Decision { allowed: false, reason: "RBAC: role.rbac.authorization.k8s.io \"missing\" not found".into() }
        );
        assert_eq!(
            forbidden_message_with_reason(&who, &attrs, &decision.reason),
            "secrets is forbidden: User \"system:serviceaccount:ns:sa1\" cannot list resource \"secrets\" in API group \"\" in the namespace \"ns\": RBAC: role.rbac.authorization.k8s.io \"missing\" not found"
        );
        objects.role_bindings.push(role_binding(
            "ns",
            "ClusterRole",
            "gone",
            json!([{"kind": "ServiceAccount", "name": "sa1"}]),
        ));
        assert_eq!(
            decide(&objects, &who, &attrs).reason,
            "RBAC: [role.rbac.authorization.k8s.io \"missing\" not found, clusterrole.rbac.authorization.k8s.io \"gone\" not found]"
        );
        // Bindings for someone else are not looked at.
        assert_eq!(decide(&objects, &sa("ns", "other"), &attrs).reason, "");
    }

    #[test]
    fn forbidden_messages_read_like_kube_apiserver() {
        let anonymous = Identity::anonymous();
        assert_eq!(
            forbidden_message(&anonymous, &ask("list", "", "namespaces", None, None)),
            "namespaces is forbidden: User \"system:anonymous\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope"
        );
        assert_eq!(
            forbidden_message(&user("u", &[]), &ask("get", "", "secrets", Some("ns"), Some("x"))),
            "secrets \"x\" is forbidden: User \"u\" cannot get resource \"secrets\" in API group \"\" in the namespace \"ns\""
        );
        let bot = sa("ssa-probe", "sa1");
        let token = Attributes {
            subresource: Some("token"),
            ..ask("create", "", "serviceaccounts", Some("ssa-probe"), Some("sa1"))
        };
        assert_eq!(
            forbidden_message(&bot, &token),
            "serviceaccounts \"sa1\" is forbidden: User \"system:serviceaccount:ssa-probe:sa1\" cannot create resource \"serviceaccounts/token\" in API group \"\" in the namespace \"ssa-probe\""
        );
        assert_eq!(
            forbidden_message(&bot, &ask("get", "rbac.authorization.k8s.io", "clusterroles", None, Some("admin"))),
            "clusterroles.rbac.authorization.k8s.io \"admin\" is forbidden: User \"system:serviceaccount:ssa-probe:sa1\" cannot get resource \"clusterroles\" in API group \"rbac.authorization.k8s.io\" at the cluster scope"
        );
        assert_eq!(
            forbidden_message(&anonymous, &path("get", "/foo/bar")),
            "forbidden: User \"system:anonymous\" cannot get path \"/foo/bar\""
        );
        assert_eq!(
            forbidden_message(&anonymous, &path("get", "/a<b>")),
            "forbidden: User \"system:anonymous\" cannot get path \"/a&lt;b&gt;\""
        );
    }
}
