//! `createNewServiceAccount: true` end to end, against a second API server as the
//! tenant's cluster: on the emulator tier a second emulator on loopback; on the real
//! tier the same kube-apiserver, reached as another user (a ServiceAccount of the
//! test's with rights in the target namespaces only, or cluster-wide for
//! `clusterResources`). The writer installs the ServiceAccount, Roles (or ClusterRole)
//! and bindings there with the tenant's token, stores the ServiceAccount's token
//! (which works where the Roles allow and nowhere else), renews it, says when the
//! tenant's Secret cannot renew it, and removes everything on delete. Where the
//! egress policy does not allow `apiURL`, the environment is refused and nothing is
//! contacted or stored. Tests wait on conditions with deadlines.

use gitops_shared::crypto::{Sealed, SecretContext};
use gitops_shared::db::credential::{CLUSTER_CREDENTIAL_TABLE, ClusterCredentials};
use gitops_shared::model::TenantId;
use gitops_testkit::cluster::TestCluster;
use gitops_testkit::kube_emulator::{EmulatorOptions, KubeEmulator};
use gitops_writer::api::GitOpsDeploymentManagedEnvironment;
use gitops_writer::controller::connection::{ConnectionPolicy, Destination};
use gitops_writer::controller::service_account::{REASON_SERVICE_ACCOUNT_NOT_ALLOWED, REASON_TOKEN_RENEWAL_FAILED};
use gitops_writer::controller::{CONDITION, CONNECTION_CONDITION, REASON_ACCEPTED};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{eventually, short_id};

/// The tenant's cluster: its URL as the tenant names it, its CA, and an admin
/// client the test uses to look at it.
struct Target {
    url: String,
    authority: String,
    ca_data: Option<String>,
    insecure: bool,
    admin: kube::Client,
    /// The second emulator (emulator tier), served while the test runs.
    _emulator: Option<KubeEmulator>,
    /// Cluster-scoped objects and namespaces the test made on a shared real server.
    made: Vec<(&'static str, String)>,
}

/// URL, CA data and the insecure flag of a kubeconfig's first cluster.
fn read_kubeconfig(path: &std::path::Path) -> (String, Option<String>, bool) {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("a kubeconfig");
    let cluster = kubeconfig.clusters.first().and_then(|c| c.cluster.clone()).expect("a cluster");
    let url = cluster.server.clone().expect("a server").trim_end_matches('/').to_owned();
    let ca_data = cluster.certificate_authority_data.clone().or_else(|| {
        let path = cluster.certificate_authority.as_ref()?;
        let pem = std::fs::read(path).unwrap_or_else(|error| panic!("read {path}: {error}"));
        serde_json::to_value(k8s_openapi::ByteString(pem)).ok()?.as_str().map(str::to_owned)
    });
    (url, ca_data, cluster.insecure_skip_tls_verify.unwrap_or(false))
}

impl Target {
    async fn start() -> Target {
        let cluster = TestCluster::get().await;
        let (path, admin, emulator) = if cluster.is_real() {
            (cluster.kubeconfig_path().to_owned(), cluster.admin().await, None)
        } else {
            let options = EmulatorOptions { tls: true, ..EmulatorOptions::default() };
            let emulator = KubeEmulator::start(options).await.expect("a second emulator");
            let admin = emulator.client().await;
            (emulator.kubeconfig_path().to_owned(), admin, Some(emulator))
        };
        let (url, ca_data, insecure) = read_kubeconfig(&path);
        let authority = url.strip_prefix("https://").expect("https").split('/').next().unwrap_or_default().to_owned();
        Target { url, authority, ca_data, insecure, admin, _emulator: emulator, made: Vec::new() }
    }

    async fn namespace(&mut self, purpose: &str) -> String {
        let name = format!("t-{}-{purpose}", short_id());
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).expect("Namespace");
        Api::<Namespace>::all(self.admin.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
        self.made.push(("namespace", name.clone()));
        name
    }

    /// The tenant's identity on the target: a ServiceAccount in `namespaces[0]` with
    /// every right in each of `namespaces` (or cluster-wide with `cluster`); its token.
    async fn tenant_token(&mut self, namespaces: &[String], cluster: bool) -> String {
        let post = PostParams::default();
        let home = namespaces.first().cloned().unwrap_or_else(|| "default".to_owned());
        let name = format!("tenant-{}", short_id());
        let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).expect("SA");
        Api::<ServiceAccount>::namespaced(self.admin.clone(), &home).create(&post, &account).await.expect("SA");
        let subject = json!([{"kind": "ServiceAccount", "name": name, "namespace": home}]);
        let all = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]);
        if cluster {
            let rules = json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                               {"nonResourceURLs": ["*"], "verbs": ["*"]}]);
            let role: ClusterRole =
                serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).expect("ClusterRole");
            Api::<ClusterRole>::all(self.admin.clone()).create(&post, &role).await.expect("ClusterRole");
            let binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": {"name": name}, "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            }))
            .expect("ClusterRoleBinding");
            Api::<ClusterRoleBinding>::all(self.admin.clone()).create(&post, &binding).await.expect("binding");
            self.made.push(("clusterrole", name.clone()));
            self.made.push(("clusterrolebinding", name.clone()));
        }
        for namespace in namespaces {
            let role: Role = serde_json::from_value(json!({"metadata": {"name": name}, "rules": all})).expect("Role");
            Api::<Role>::namespaced(self.admin.clone(), namespace).create(&post, &role).await.expect("Role");
            let binding: RoleBinding = serde_json::from_value(json!({
                "metadata": {"name": name}, "subjects": subject,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            }))
            .expect("RoleBinding");
            Api::<RoleBinding>::namespaced(self.admin.clone(), namespace).create(&post, &binding).await.expect("RB");
        }
        let request: TokenRequest =
            serde_json::from_value(json!({"spec": {"expirationSeconds": 3600}})).expect("TokenRequest");
        Api::<ServiceAccount>::namespaced(self.admin.clone(), &home)
            .create_token_request(&name, &post, &request)
            .await
            .expect("a tenant token")
            .status
            .expect("a token")
            .token
    }

    /// A client of the target that authenticates with `token`.
    async fn client_with(&self, token: &str) -> kube::Client {
        let kubeconfig: kube::config::Kubeconfig = serde_json::from_str(&self.kubeconfig(token)).expect("a kubeconfig");
        let options = kube::config::KubeConfigOptions::default();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.expect("a client config");
        kube::Client::try_from(config).expect("a client")
    }

    fn kubeconfig(&self, token: &str) -> String {
        let mut cluster = json!({"server": self.url});
        if let Some(ca) = &self.ca_data {
            cluster["certificate-authority-data"] = json!(ca);
        }
        if self.insecure {
            cluster["insecure-skip-tls-verify"] = json!(true);
        }
        json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        })
        .to_string()
    }

    /// Removes what the test made on a shared real API server.
    async fn clean(&self) {
        for (kind, name) in &self.made {
            let params = DeleteParams::default();
            let _ = match *kind {
                "namespace" => Api::<Namespace>::all(self.admin.clone()).delete(name, &params).await.map(drop),
                "clusterrole" => Api::<ClusterRole>::all(self.admin.clone()).delete(name, &params).await.map(drop),
                _ => Api::<ClusterRoleBinding>::all(self.admin.clone()).delete(name, &params).await.map(drop),
            };
        }
    }
}

struct Env {
    base: crate::support::writer::Env,
    target: Target,
}

/// The writer environment and a target; the writer may contact the target when
/// `allow` is set (and only then), and renews tokens at every scan when `renew_always`.
async fn env(purpose: &str, allow: bool, renew_always: bool) -> Env {
    let base = crate::support::writer::env(purpose).await;
    let target = Target::start().await;
    let allowed: Vec<Destination> = if allow {
        vec![target.authority.parse().expect("pattern")]
    } else {
        vec!["*.example.invalid".parse().expect("pattern")]
    };
    base.writer_for("writer-a", vec![base.tenant.name().to_owned()], |config| {
        config.connection_check = Some(ConnectionPolicy::new(allowed, vec![]));
        config.api_url_allow_private = true;
        if renew_always {
            // Every stored token counts as due: each scan renews it.
            config.home.renew_before = config.home.token_lifetime * 2;
            config.home.renew_every = std::time::Duration::from_millis(300);
        }
    });
    Env { base, target }
}

impl Env {
    fn environments(&self) -> Api<GitOpsDeploymentManagedEnvironment> {
        Api::namespaced(self.base.kube.clone(), self.base.tenant.name())
    }

    async fn put_secret(&self, name: &str, token: &str) {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": name}, "stringData": {"kubeconfig": self.target.kubeconfig(token)},
        }))
        .expect("Secret");
        Api::<Secret>::namespaced(self.base.kube.clone(), self.base.tenant.name())
            .patch(name, &PatchParams::apply("writer-service-account-test").force(), &Patch::Apply(&secret))
            .await
            .expect("apply Secret");
    }

    async fn create(&self, name: &str, token: &str, spec: serde_json::Value) -> String {
        self.put_secret(&format!("{name}-kubeconfig"), token).await;
        let mut full = json!({"apiURL": self.target.url, "credentialsSecret": format!("{name}-kubeconfig"),
                              "createNewServiceAccount": true});
        for (key, value) in spec.as_object().expect("an object") {
            full[key] = value.clone();
        }
        let object: GitOpsDeploymentManagedEnvironment = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentManagedEnvironment",
            "metadata": {"name": name}, "spec": full,
        }))
        .expect("environment");
        let made = self.environments().create(&PostParams::default(), &object).await.expect("create environment");
        made.metadata.uid.expect("a uid")
    }

    /// The writer's condition once it has this reason (for the current generation).
    async fn reason(&self, name: &str, reason: &str) -> String {
        eventually(&format!("{name}: {reason}"), || async {
            let object = self.environments().get_opt(name).await.ok()??;
            let condition = object.status?.conditions.into_iter().find(|c| {
                c.type_ == CONDITION
                    && c.reason.as_deref() == Some(reason)
                    && c.observed_generation == object.metadata.generation
            })?;
            condition.message
        })
        .await
    }

    /// The stored credentials and their resourceVersion stand-in, unsealed.
    async fn stored(&self, name: &str) -> Option<(ClusterCredentials, String, bool)> {
        let row = self
            .base
            .client
            .query_opt(
                "SELECT c.tenant_id, c.key_id, c.ciphertext, c.secret_resource_version, c.expires_at IS NOT NULL
                   FROM cluster_credential c JOIN managed_environment e ON e.id = c.managed_environment_id
                  WHERE e.resource_name = $1 AND e.row_state = 'active'",
                &[&name],
            )
            .await
            .expect("query")?;
        let tenant: TenantId = row.get(0);
        let sealed = Sealed { key_id: row.get(1), ciphertext: row.get(2) };
        let plain =
            self.base.secrets.open(SecretContext { table: CLUSTER_CREDENTIAL_TABLE, tenant }, &sealed).expect("unseal");
        Some((serde_json::from_slice(&plain).expect("credentials"), row.get(3), row.get(4)))
    }
}

async fn can_list_config_maps(client: &kube::Client, namespace: &str) -> Result<(), u16> {
    match Api::<ConfigMap>::namespaced(client.clone(), namespace).list_metadata(&ListParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.code),
        Err(error) => panic!("list ConfigMaps in {namespace}: {error}"),
    }
}

#[tokio::test]
async fn writer_service_account_is_installed_per_namespace_its_token_stored_renewed_and_removed() {
    let mut env = env("wsa-ns", true, true).await;
    let (a, b, other) =
        (env.target.namespace("a").await, env.target.namespace("b").await, env.target.namespace("c").await);
    let tenant_token = env.target.tenant_token(&[a.clone(), b.clone()], false).await;
    let uid = env.create("apps", &tenant_token, json!({"namespaces": [b, a]})).await;
    env.reason("apps", REASON_ACCEPTED).await;
    let connection = eventually("the connection condition", || async {
        let object = env.environments().get_opt("apps").await.ok()??;
        object.status?.conditions.into_iter().find(|c| c.type_ == CONNECTION_CONDITION && c.status == "True")
    })
    .await;
    assert!(!connection.message.unwrap_or_default().contains(&tenant_token));

    // The original's names, suffixed with the environment's UID; the account in the
    // first namespace, a Role and RoleBinding in each.
    let account = format!("argocd-manager-{uid}");
    let role = format!("argocd-manager-role-{uid}");
    let first = std::cmp::min(&a, &b).clone();
    Api::<ServiceAccount>::namespaced(env.target.admin.clone(), &first)
        .get(&account)
        .await
        .expect("the ServiceAccount");
    for namespace in [&a, &b] {
        let made = Api::<Role>::namespaced(env.target.admin.clone(), namespace).get(&role).await.expect("a Role");
        assert_eq!(made.rules.expect("rules")[0].verbs, ["*"]);
        let binding =
            Api::<RoleBinding>::namespaced(env.target.admin.clone(), namespace).get(&role).await.expect("a binding");
        let subject = &binding.subjects.expect("subjects")[0];
        assert_eq!((subject.name.as_str(), subject.namespace.as_deref()), (account.as_str(), Some(first.as_str())));
    }
    let cluster_roles = Api::<ClusterRole>::all(env.target.admin.clone());
    let cluster_role = cluster_roles.get_opt(&format!("argocd-manager-cluster-role-{uid}")).await.expect("read");
    assert!(cluster_role.is_none(), "no ClusterRole without clusterResources");

    // The stored token is the ServiceAccount's, not the tenant's: it works in the
    // listed namespaces and nowhere else.
    let (stored, first_version, expires) = env.stored("apps").await.expect("stored credentials");
    assert!(expires, "the token's expiry is recorded");
    let token = stored.bearer_token.clone().expect("a token");
    assert_ne!(token, tenant_token);
    assert!(stored.client_certificate_data.is_none() && stored.client_key_data.is_none());
    let as_account = env.target.client_with(&token).await;
    can_list_config_maps(&as_account, &a).await.expect("the token works in a listed namespace");
    can_list_config_maps(&as_account, &b).await.expect("and in the other");
    assert_eq!(can_list_config_maps(&as_account, &other).await, Err(403), "not in an unlisted namespace");

    // Renewal: every scan finds the token due here and stores a new one.
    eventually("a renewed token", || async {
        let (renewed, version, _) = env.stored("apps").await?;
        (version != first_version && renewed.bearer_token != stored.bearer_token).then_some(())
    })
    .await;

    // A namespace no longer listed loses its Role and binding; the token keeps working
    // where it is still listed.
    let dropped = std::cmp::max(&a, &b).clone();
    let patch = json!({"spec": {"namespaces": [first]}});
    env.environments().patch("apps", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    env.reason("apps", REASON_ACCEPTED).await;
    let dropped_roles = Api::<Role>::namespaced(env.target.admin.clone(), &dropped);
    eventually("the Role of the dropped namespace removed", || async {
        dropped_roles.get_opt(&role).await.ok()?.is_none().then_some(())
    })
    .await;
    let (current, _, _) = env.stored("apps").await.expect("stored");
    let as_account = env.target.client_with(&current.bearer_token.expect("token")).await;
    can_list_config_maps(&as_account, &first).await.expect("still listed");
    assert_eq!(can_list_config_maps(&as_account, &dropped).await, Err(403), "no longer listed");

    // Renewal needs the tenant's Secret: without it, the condition says so and the
    // stored token stays.
    Api::<Secret>::namespaced(env.base.kube.clone(), env.base.tenant.name())
        .delete("apps-kubeconfig", &DeleteParams::default())
        .await
        .expect("delete the Secret");
    let message = env.reason("apps", REASON_TOKEN_RENEWAL_FAILED).await;
    assert!(message.contains("cannot be renewed"), "{message}");
    assert!(env.stored("apps").await.is_some(), "the stored token stays");
    env.put_secret("apps-kubeconfig", &tenant_token).await;
    env.reason("apps", REASON_ACCEPTED).await;

    // Delete: the objects go from the target, then the environment.
    env.environments().delete("apps", &DeleteParams::default()).await.expect("delete");
    eventually("the environment gone", || async {
        env.environments().get_opt("apps").await.ok()?.is_none().then_some(())
    })
    .await;
    let accounts = Api::<ServiceAccount>::namespaced(env.target.admin.clone(), &first);
    assert!(accounts.get_opt(&account).await.expect("read").is_none(), "the ServiceAccount is removed");
    let roles = Api::<Role>::namespaced(env.target.admin.clone(), &first);
    assert!(roles.get_opt(&role).await.expect("read").is_none(), "the Role is removed");
    let bindings = Api::<RoleBinding>::namespaced(env.target.admin.clone(), &first);
    assert!(bindings.get_opt(&role).await.expect("read").is_none(), "the binding is removed");
    env.target.clean().await;
}

#[tokio::test]
async fn writer_service_account_with_cluster_resources_gets_the_cluster_role() {
    let mut env = env("wsa-cluster", true, false).await;
    let apps = env.target.namespace("apps").await;
    // The account of an environment without namespaces lives in kube-system.
    let system: Namespace = serde_json::from_value(json!({"metadata": {"name": "kube-system"}})).expect("ns");
    let _ = Api::<Namespace>::all(env.target.admin.clone()).create(&PostParams::default(), &system).await;
    let tenant_token = env.target.tenant_token(std::slice::from_ref(&apps), true).await;
    let uid = env.create("cluster", &tenant_token, json!({"clusterResources": true})).await;
    env.reason("cluster", REASON_ACCEPTED).await;
    let (role, binding) =
        (format!("argocd-manager-cluster-role-{uid}"), format!("argocd-manager-cluster-role-binding-{uid}"));
    let made = Api::<ClusterRole>::all(env.target.admin.clone()).get(&role).await.expect("the ClusterRole");
    let rules = made.rules.expect("rules");
    assert!(rules.iter().any(|r| r.non_resource_urls.as_deref() == Some(&["*".to_owned()][..])), "{rules:?}");
    Api::<ClusterRoleBinding>::all(env.target.admin.clone()).get(&binding).await.expect("the binding");
    let account = format!("argocd-manager-{uid}");
    Api::<ServiceAccount>::namespaced(env.target.admin.clone(), "kube-system")
        .get(&account)
        .await
        .expect("the account");
    let (stored, _, _) = env.stored("cluster").await.expect("stored");
    let as_account = env.target.client_with(&stored.bearer_token.expect("token")).await;
    Api::<Namespace>::all(as_account).list_metadata(&ListParams::default()).await.expect("cluster-wide access");

    // Turned off: the installed objects go and the tenant's own credentials are stored.
    let patch = json!({"spec": {"createNewServiceAccount": false}});
    env.environments().patch("cluster", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    env.reason("cluster", REASON_ACCEPTED).await;
    let (own, _, expires) = env.stored("cluster").await.expect("stored");
    assert_eq!(own.bearer_token.as_deref(), Some(tenant_token.as_str()));
    assert!(!expires, "no token expiry for the tenant's own credentials");
    assert!(
        Api::<ClusterRole>::all(env.target.admin.clone()).get_opt(&role).await.expect("read").is_none(),
        "the ClusterRole is removed when turned off"
    );
    let patch = json!({"spec": {"createNewServiceAccount": true}});
    env.environments().patch("cluster", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    eventually("the ClusterRole installed again", || async {
        Api::<ClusterRole>::all(env.target.admin.clone()).get_opt(&role).await.ok()?
    })
    .await;

    env.environments().delete("cluster", &DeleteParams::default()).await.expect("delete");
    eventually("the environment gone", || async {
        env.environments().get_opt("cluster").await.ok()?.is_none().then_some(())
    })
    .await;
    let roles = Api::<ClusterRole>::all(env.target.admin.clone());
    assert!(roles.get_opt(&role).await.expect("read").is_none(), "the ClusterRole is removed");
    let bindings = Api::<ClusterRoleBinding>::all(env.target.admin.clone());
    assert!(bindings.get_opt(&binding).await.expect("read").is_none(), "the ClusterRoleBinding is removed");
    let accounts = Api::<ServiceAccount>::namespaced(env.target.admin.clone(), "kube-system");
    assert!(accounts.get_opt(&account).await.expect("read").is_none(), "the ServiceAccount is removed");
    env.target.clean().await;
}

#[tokio::test]
async fn writer_service_account_is_refused_where_the_egress_policy_denies_and_without_namespaces() {
    let mut env = env("wsa-denied", false, false).await;
    let apps = env.target.namespace("apps").await;
    let tenant_token = env.target.tenant_token(std::slice::from_ref(&apps), false).await;
    let uid = env.create("denied", &tenant_token, json!({"namespaces": [apps]})).await;
    let message = env.reason("denied", REASON_SERVICE_ACCOUNT_NOT_ALLOWED).await;
    assert!(message.contains("allow list"), "{message}");
    assert!(!message.contains(&tenant_token));
    env.create("no-namespaces", &tenant_token, json!({})).await;
    let message = env.reason("no-namespaces", "FieldRequired").await;
    assert!(message.contains("spec.namespaces"), "{message}");
    for name in ["denied", "no-namespaces"] {
        assert!(env.stored(name).await.is_none(), "{name}: nothing stored");
    }
    let accounts = Api::<ServiceAccount>::namespaced(env.target.admin.clone(), &apps);
    assert!(accounts.get_opt(&format!("argocd-manager-{uid}")).await.expect("read").is_none(), "nothing installed");
    env.target.clean().await;
}
