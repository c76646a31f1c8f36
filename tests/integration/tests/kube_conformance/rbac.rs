//! Authentication and RBAC: a ServiceAccount token from TokenRequest is allowed what
//! its Roles grant and nothing else (other verbs, resources, namespaces, names); a
//! request without credentials is the anonymous user and gets 403; an unknown token
//! gets 401, as does the token of a ServiceAccount that was deleted.

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchParams};
use serde_json::json;

use super::{Env, GADGET, names, refused_with};
use crate::support::eventually;

async fn create<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + k8s_openapi::serde::Serialize
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("a valid object");
    api.create(&PostParams::default(), &object).await.expect("create")
}

/// A bound token for ServiceAccount `name` in `namespace`.
async fn token_for(client: &Client, namespace: &str, name: &str) -> String {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), namespace);
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}})).expect("a TokenRequest");
    let issued = accounts.create_token_request(name, &PostParams::default(), &request).await.expect("TokenRequest");
    let status = issued.status.expect("an issued token");
    assert!(!status.token.is_empty());
    status.token
}

#[tokio::test]
async fn a_service_account_token_is_allowed_exactly_what_its_roles_grant() {
    let env = Env::new("rbac").await;
    let other = env.cluster.namespace("rbac-other").await;
    let ns = env.ns();

    create(&env.namespaced::<ServiceAccount>(), json!({"metadata": {"name": "reader"}})).await;
    let roles = env.namespaced::<Role>();
    create(
        &roles,
        json!({"metadata": {"name": "read-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
    )
    .await;
    create(
        &roles,
        json!({"metadata": {"name": "one-secret"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["allowed"], "verbs": ["get"]}]}),
    )
    .await;
    for role in ["read-configmaps", "one-secret"] {
        create(
            &env.namespaced::<RoleBinding>(),
            json!({"metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]}),
        )
        .await;
    }
    for namespace in [ns, other.name()] {
        let config_maps = Api::<ConfigMap>::namespaced(env.client.clone(), namespace);
        create(&config_maps, json!({"metadata": {"name": "cm"}, "data": {"a": "1"}})).await;
    }
    for secret in ["allowed", "denied"] {
        create(&env.namespaced::<Secret>(), json!({"metadata": {"name": secret}, "stringData": {"k": "v"}})).await;
    }
    refused_with(
        Api::<ServiceAccount>::namespaced(env.client.clone(), ns)
            .create_token_request("absent", &PostParams::default(), &TokenRequest::default())
            .await,
        404,
        "NotFound",
    );

    let token = token_for(&env.client, ns, "reader").await;
    let reader = env.cluster.client_with_token(&token).await;
    let config_maps = Api::<ConfigMap>::namespaced(reader.clone(), ns);
    let secrets = Api::<Secret>::namespaced(reader.clone(), ns);
    let user = format!("system:serviceaccount:{ns}:reader");

    // Allowed: get and list of configmaps here, get of the one named secret. (A real
    // API server applies new Roles within moments: wait for the first.)
    eventually("the Role to apply", || async { config_maps.list(&ListParams::default()).await.ok() }).await;
    assert_eq!(config_maps.get("cm").await.unwrap().data.unwrap()["a"], "1");
    assert_eq!(secrets.get("allowed").await.unwrap().metadata.name.as_deref(), Some("allowed"));

    // Other verbs.
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "new"}})).unwrap();
    let status = refused_with(config_maps.create(&PostParams::default(), &cm).await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "configmaps is forbidden: User \"{user}\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    assert_eq!(status.details.expect("details").kind, "configmaps");
    let status = refused_with(config_maps.delete("cm", &DeleteParams::default()).await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "configmaps \"cm\" is forbidden: User \"{user}\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    refused_with(config_maps.watch(&WatchParams::default(), "0").await.map(|_| ()), 403, "Forbidden");

    // Other resources, other names, other namespaces, cluster-wide.
    refused_with(secrets.list(&ListParams::default()).await, 403, "Forbidden");
    let status = refused_with(secrets.get("denied").await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "secrets \"denied\" is forbidden: User \"{user}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    let status = refused_with(GADGET.api(&reader, ns).list(&ListParams::default()).await, 403, "Forbidden");
    assert!(
        status.message.contains(&format!("cannot list resource \"gadgets\" in API group \"{}\"", super::GROUP)),
        "{status:?}"
    );
    let elsewhere = Api::<ConfigMap>::namespaced(reader.clone(), other.name());
    let status = refused_with(elsewhere.get("cm").await, 403, "Forbidden");
    assert!(status.message.ends_with(&format!("in the namespace \"{}\"", other.name())), "{status:?}");
    let status =
        refused_with(Api::<ConfigMap>::all(reader.clone()).list(&ListParams::default()).await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "configmaps is forbidden: User \"{user}\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope"
        )
    );

    // The admin still sees everything, including what the reader may not.
    let all = Api::<ConfigMap>::all(env.client.clone())
        .list(&ListParams::default().fields("metadata.name=cm"))
        .await
        .unwrap();
    assert!(all.items.iter().filter(|c| c.metadata.namespace.as_deref() == Some(other.name())).count() == 1);

    // A token is bound to its ServiceAccount: deleting the account revokes it.
    env.namespaced::<ServiceAccount>().delete("reader", &DeleteParams::default()).await.unwrap();
    eventually("the deleted account's token to be refused", || async {
        match config_maps.list(&ListParams::default()).await {
            Err(kube::Error::Api(status)) if status.code == 401 => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn anonymous_requests_are_forbidden_and_unknown_tokens_unauthorized() {
    let env = Env::new("authn").await;
    let ns = env.ns();
    create(&env.namespaced::<ConfigMap>(), json!({"metadata": {"name": "cm"}})).await;

    let anonymous = Api::<ConfigMap>::namespaced(env.cluster.anonymous().await, ns);
    let status = refused_with(anonymous.list(&ListParams::default()).await, 403, "Forbidden");
    assert_eq!(
        status.message,
        format!(
            "configmaps is forbidden: User \"system:anonymous\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"{ns}\""
        )
    );
    refused_with(anonymous.get("cm").await, 403, "Forbidden");

    let bad = env.cluster.client_with_token("not-a-token-the-server-knows").await;
    for result in [
        Api::<ConfigMap>::namespaced(bad.clone(), ns).list(&ListParams::default()).await.map(|l| names_of(&l.items)),
        Api::<ConfigMap>::namespaced(bad.clone(), ns).get("cm").await.map(|c| names_of(&[c])),
    ] {
        let status = refused_with(result, 401, "Unauthorized");
        assert_eq!(status.message, "Unauthorized");
    }
    let status = refused_with(
        GADGET.api(&bad, ns).list(&ListParams::default()).await.map(|l| names(&l.items)),
        401,
        "Unauthorized",
    );
    assert_eq!(status.message, "Unauthorized");
}

fn names_of(config_maps: &[ConfigMap]) -> Vec<String> {
    config_maps.iter().filter_map(|c| c.metadata.name.clone()).collect()
}
