//! SubjectAccessReview and RBAC escalation prevention: a review answers with the same
//! RBAC decision (and reason) a request gets; a ServiceAccount holding `edit` (and
//! the right to write roles and bindings) cannot grant more than it holds — no Role
//! with `*` verbs, no RoleBinding to `admin` — until it may `bind` that ClusterRole.

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{Env, refused_with};
use crate::support::eventually;

const RBAC: &str = "rbac.authorization.k8s.io";

fn object<K: k8s_openapi::serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

fn binding(name: &str, kind: &str, role: &str, subject: Value) -> RoleBinding {
    object(json!({"metadata": {"name": name}, "roleRef": {"apiGroup": RBAC, "kind": kind, "name": role},
        "subjects": [subject]}))
}

fn review(spec: Value) -> SubjectAccessReview {
    object(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}))
}

/// ServiceAccount `dev` in the test's namespace: `edit` there, plus writing Roles and
/// RoleBindings (create, update, patch). Returns its client and user name.
async fn developer(env: &Env) -> (kube::Client, String) {
    let ns = env.ns();
    let rules =
        json!([{"apiGroups": [RBAC], "resources": ["roles", "rolebindings"], "verbs": ["create", "update", "patch"]}]);
    let identity = env.cluster.namespace_identity(ns, "dev", rules).await;
    let subject = json!({"kind": "ServiceAccount", "name": "dev", "namespace": ns});
    env.namespaced::<RoleBinding>()
        .create(&PostParams::default(), &binding("dev-edit", "ClusterRole", "edit", subject))
        .await
        .expect("bind dev to edit");
    (env.cluster.client_with_token(&identity.token).await, format!("system:serviceaccount:{ns}:dev"))
}

#[tokio::test]
async fn subject_access_reviews_answer_with_the_rbac_decision() {
    let env = Env::new("sar").await;
    let ns = env.ns();
    let (dev_client, dev) = developer(&env).await;
    let groups = json!(["system:serviceaccounts", format!("system:serviceaccounts:{ns}")]);
    let reviews = Api::<SubjectAccessReview>::all(env.client.clone());
    let ask = |attributes: Value| review(json!({"user": dev, "groups": groups, "resourceAttributes": attributes}));

    // (A real API server sees a new RoleBinding within moments.)
    let create_configmaps = ask(json!({"namespace": ns, "verb": "create", "resource": "configmaps"}));
    let status = eventually("the review to allow", || async {
        let answer = reviews.create(&PostParams::default(), &create_configmaps).await.expect("review");
        answer.status.filter(|status| status.allowed)
    })
    .await;
    assert_eq!(
        status.reason.as_deref(),
        Some(
            format!(
                "RBAC: allowed by RoleBinding \"dev-edit/{ns}\" of ClusterRole \"edit\" to ServiceAccount \"dev/{ns}\""
            )
            .as_str()
        )
    );
    assert_eq!(status.denied, None);

    for denied in [
        json!({"namespace": ns, "verb": "create", "group": RBAC, "resource": "clusterroles"}),
        json!({"namespace": "kube-system", "verb": "get", "resource": "secrets"}),
        json!({"verb": "list", "resource": "namespaces"}),
    ] {
        let answer = reviews.create(&PostParams::default(), &ask(denied.clone())).await.expect("review");
        let status = answer.status.expect("a status");
        assert!(!status.allowed, "{denied} is not allowed: {status:?}");
        assert_eq!(status.reason, None);
    }
    // Subresources and names count; groups are taken as given.
    let log = ask(json!({"namespace": ns, "verb": "get", "resource": "pods", "subresource": "log", "name": "p"}));
    assert!(reviews.create(&PostParams::default(), &log).await.expect("review").status.expect("status").allowed);
    let master = review(json!({"user": "someone", "groups": ["system:masters"],
        "nonResourceAttributes": {"path": "/anything", "verb": "delete"}}));
    let status = reviews.create(&PostParams::default(), &master).await.expect("review").status.expect("status");
    assert!(status.allowed && status.reason.is_none(), "{status:?}");

    // No subject at all is invalid.
    let status = refused_with(
        reviews.create(&PostParams::default(), &review(json!({"resourceAttributes": {"verb": "get"}}))).await,
        422,
        "Invalid",
    );
    assert_eq!(
        status.message,
        ".authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
    );
    // Asking needs `create` on subjectaccessreviews, which `edit` does not grant.
    let status = refused_with(
        Api::<SubjectAccessReview>::all(dev_client).create(&PostParams::default(), &create_configmaps).await,
        403,
        "Forbidden",
    );
    assert_eq!(
        status.message,
        format!(
            "subjectaccessreviews.authorization.k8s.io is forbidden: User \"{dev}\" cannot create resource \"subjectaccessreviews\" in API group \"authorization.k8s.io\" at the cluster scope"
        )
    );

    // Discovery lists the review as create-only and cluster-scoped.
    let resources = env.client.list_api_group_resources("authorization.k8s.io/v1").await.expect("discovery");
    let entry = resources.resources.iter().find(|r| r.name == "subjectaccessreviews").expect("subjectaccessreviews");
    assert_eq!(
        (entry.kind.as_str(), entry.namespaced, entry.verbs.clone()),
        ("SubjectAccessReview", false, vec!["create".to_owned()])
    );
}

#[tokio::test]
async fn rbac_writes_cannot_grant_more_than_the_writer_holds() {
    let env = Env::new("escalation").await;
    let ns = env.ns();
    let (dev_client, dev) = developer(&env).await;
    let roles = Api::<Role>::namespaced(dev_client.clone(), ns);
    let bindings = Api::<RoleBinding>::namespaced(dev_client.clone(), ns);
    let held_by = |name: &str| binding(name, "ClusterRole", "edit", json!({"kind": "User", "name": "colleague"}));

    // Within what dev holds: a RoleBinding to `edit` (once dev's bindings apply).
    eventually("dev to bind edit", || async {
        bindings.create(&PostParams::default(), &held_by("to-edit")).await.ok()
    })
    .await;
    let within: Role = object(json!({"metadata": {"name": "within"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]}]}));
    roles.create(&PostParams::default(), &within).await.expect("a Role within edit");

    let groups = format!("[\"system:serviceaccounts\" \"system:serviceaccounts:{ns}\" \"system:authenticated\"]");
    let not_held = |resource: &str, name: &str| {
        format!(
            "{resource}.rbac.authorization.k8s.io \"{name}\" is forbidden: user \"{dev}\" (groups={groups}) is attempting to grant RBAC permissions not currently held:\n"
        )
    };
    // `*` verbs are held by no one here, whatever edit grants.
    let star: Role = object(json!({"metadata": {"name": "star"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*", "get"]}]}));
    let status = refused_with(roles.create(&PostParams::default(), &star).await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!("{}{{APIGroups:[\"\"], Resources:[\"configmaps\"], Verbs:[\"*\"]}}", not_held("roles", "star"))
    );
    assert_eq!(status.details.expect("details").kind, "roles");
    // The same through server-side apply, and through an update of an allowed Role.
    let mut applied = serde_json::to_value(&star).expect("json");
    applied["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
    applied["kind"] = json!("Role");
    refused_with(
        roles.patch("star", &PatchParams::apply("conformance"), &Patch::Apply(&applied)).await,
        403,
        "Forbidden",
    );
    let widen = Patch::Merge(json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]}));
    refused_with(roles.patch("within", &PatchParams::default(), &widen).await, 403, "Forbidden");

    // A RoleBinding to admin grants what edit lacks.
    let to_admin = binding("to-admin", "ClusterRole", "admin", json!({"kind": "User", "name": "colleague"}));
    let status = refused_with(bindings.create(&PostParams::default(), &to_admin).await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "{}{}\n{}\n{}",
            not_held("rolebindings", "to-admin"),
            "{APIGroups:[\"authorization.k8s.io\"], Resources:[\"localsubjectaccessreviews\"], Verbs:[\"create\"]}",
            "{APIGroups:[\"rbac.authorization.k8s.io\"], Resources:[\"rolebindings\"], Verbs:[\"delete\" \"deletecollection\" \"get\" \"list\" \"watch\"]}",
            "{APIGroups:[\"rbac.authorization.k8s.io\"], Resources:[\"roles\"], Verbs:[\"delete\" \"deletecollection\" \"get\" \"list\" \"watch\"]}",
        )
    );
    let absent = binding("to-absent", "ClusterRole", "absent-role", json!({"kind": "User", "name": "colleague"}));
    let status = refused_with(bindings.create(&PostParams::default(), &absent).await, 404, "NotFound");
    assert_eq!(status.message, "clusterroles.rbac.authorization.k8s.io \"absent-role\" not found");

    // `bind` on clusterroles/admin (in this namespace) lets dev bind admin, and only admin.
    let may_bind: Role = object(json!({"metadata": {"name": "bind-admin"},
        "rules": [{"apiGroups": [RBAC], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["admin"]}]}));
    env.namespaced::<Role>().create(&PostParams::default(), &may_bind).await.expect("admin creates the Role");
    let subject = json!({"kind": "ServiceAccount", "name": "dev", "namespace": ns});
    env.namespaced::<RoleBinding>()
        .create(&PostParams::default(), &binding("bind-admin", "Role", "bind-admin", subject))
        .await
        .expect("admin binds it");
    eventually("dev to bind admin", || async { bindings.create(&PostParams::default(), &to_admin).await.ok() }).await;
    let to_cluster_admin =
        binding("to-cluster-admin", "ClusterRole", "cluster-admin", json!({"kind": "User", "name": "colleague"}));
    refused_with(bindings.create(&PostParams::default(), &to_cluster_admin).await, 403, "Forbidden");
}
