//! `createNewServiceAccount: true`: the writer installs an identity of the service's
//! own on the tenant's cluster, with the credentials the tenant supplied, and stores
//! that identity's token instead of those credentials, as the original service did.
//! The objects carry the original's names, suffixed with the environment's UID so
//! that two environments on one cluster never share one:
//!
//! - ServiceAccount `argocd-manager-<uid>`, in the first listed namespace (or
//!   `kube-system` when the environment lists none, which needs `clusterResources`);
//! - without `clusterResources`: in every listed namespace a Role
//!   `argocd-manager-role-<uid>` allowing everything there, and a RoleBinding of the
//!   same name to the ServiceAccount;
//! - with `clusterResources`: a ClusterRole `argocd-manager-cluster-role-<uid>` with
//!   the original's rules (every verb on every resource of every group, and every
//!   non-resource URL) and a ClusterRoleBinding `argocd-manager-cluster-role-binding-<uid>`.
//!
//! Everything is server-side applied (idempotent; a tenant's edits are overwritten),
//! so every reconcile repairs what was changed on the cluster. The token comes from
//! TokenRequest with the home identity's lifetime and is requested again when less
//! than the home identity's `renew_before` is left ([`renew_loop`] queues those
//! environments) or when the spec changed; each new token is a rotation of the
//! stored credentials. Requesting one needs the tenant's Secret again: when it cannot
//! be read, the environment's condition says the token cannot be renewed and the
//! stored token is kept until it expires.
//!
//! The writer contacts the tenant's cluster for this only when its egress policy
//! (`--egress-allow` / `--egress-deny`) allows `apiURL`; otherwise the environment is
//! refused with the policy's reason and nothing is installed. The client is the
//! connection check's: built from the validated credentials alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gitops_shared::db::credential::ClusterCredentials;
use gitops_shared::db::managed_environment::{StoredToken, managed_environment_tokens_near_expiry};
use gitops_shared::db::pooled;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::connection::{ConnectionPolicy, Denial};
use crate::controller::{Controllers, ReconcileError};
use crate::work_queue::{Key, Kind};

/// The ServiceAccount could not be installed, its token requested or it removed.
pub const REASON_SERVICE_ACCOUNT_FAILED: &str = "ServiceAccountFailed";
/// The writer may not contact `apiURL` (its egress policy), so it installs nothing.
pub const REASON_SERVICE_ACCOUNT_NOT_ALLOWED: &str = "ServiceAccountNotAllowed";
/// The tenant's Secret could not be read or used to renew the token.
pub const REASON_TOKEN_RENEWAL_FAILED: &str = "TokenRenewalFailed";

/// How long the removal on delete may keep the finalizer; after that the
/// environment goes and the objects stay on the tenant's cluster.
pub const CLEANUP_LIMIT: Duration = Duration::from_secs(600);

const FIELD_MANAGER: &str = "gitops-writer";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const MANAGED_BY_VALUE: &str = "gitops-writer";
/// On every installed object: the UID of the environment it serves.
pub const ENVIRONMENT_LABEL: &str = "managed-gitops.redhat.com/managed-environment-uid";
/// Where the ServiceAccount lives when the environment lists no namespace.
const CLUSTER_ACCOUNT_NAMESPACE: &str = "kube-system";
/// How each request to the tenant's cluster may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The names of an environment's objects on the tenant's cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub uid: Uuid,
    pub account: String,
    pub account_namespace: String,
    /// Role and RoleBinding name, one of each per namespace (without cluster resources).
    pub role: String,
    pub namespaces: Vec<String>,
    /// ClusterRole and ClusterRoleBinding names (with cluster resources).
    pub cluster_role: Option<(String, String)>,
}

impl Installed {
    /// The objects for environment `uid` with these (sorted) namespaces.
    pub fn new(uid: Uuid, namespaces: &[String], cluster_resources: bool) -> Installed {
        Installed {
            uid,
            account: format!("argocd-manager-{uid}"),
            account_namespace: namespaces.first().cloned().unwrap_or_else(|| CLUSTER_ACCOUNT_NAMESPACE.to_owned()),
            role: format!("argocd-manager-role-{uid}"),
            namespaces: if cluster_resources { Vec::new() } else { namespaces.to_vec() },
            cluster_role: cluster_resources.then(|| {
                (format!("argocd-manager-cluster-role-{uid}"), format!("argocd-manager-cluster-role-binding-{uid}"))
            }),
        }
    }

    fn meta(&self, name: &str, namespace: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_owned()),
            namespace: namespace.map(str::to_owned),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned()),
                (ENVIRONMENT_LABEL.to_owned(), self.uid.to_string()),
            ])),
            ..ObjectMeta::default()
        }
    }

    fn subject(&self) -> Vec<Subject> {
        vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: self.account.clone(),
            namespace: Some(self.account_namespace.clone()),
            ..Subject::default()
        }]
    }

    /// Everything in a namespace (Roles) or on the cluster (the ClusterRole adds
    /// every non-resource URL), as the original granted.
    fn rules(cluster: bool) -> Vec<PolicyRule> {
        let all = || Some(vec!["*".to_owned()]);
        let mut rules = vec![PolicyRule {
            api_groups: all(),
            resources: all(),
            verbs: vec!["*".to_owned()],
            ..PolicyRule::default()
        }];
        if cluster {
            rules.push(PolicyRule { non_resource_urls: all(), verbs: vec!["*".to_owned()], ..PolicyRule::default() });
        }
        rules
    }

    pub fn service_account(&self) -> ServiceAccount {
        ServiceAccount { metadata: self.meta(&self.account, Some(&self.account_namespace)), ..Default::default() }
    }

    pub fn roles(&self) -> Vec<(Role, RoleBinding)> {
        self.namespaces
            .iter()
            .map(|namespace| {
                let role = Role { metadata: self.meta(&self.role, Some(namespace)), rules: Some(Self::rules(false)) };
                let binding = RoleBinding {
                    metadata: self.meta(&self.role, Some(namespace)),
                    role_ref: RoleRef {
                        api_group: "rbac.authorization.k8s.io".to_owned(),
                        kind: "Role".to_owned(),
                        name: self.role.clone(),
                    },
                    subjects: Some(self.subject()),
                };
                (role, binding)
            })
            .collect()
    }

    pub fn cluster_role(&self) -> Option<(ClusterRole, ClusterRoleBinding)> {
        let (role, binding) = self.cluster_role.as_ref()?;
        Some((
            ClusterRole { metadata: self.meta(role, None), rules: Some(Self::rules(true)), ..Default::default() },
            ClusterRoleBinding {
                metadata: self.meta(binding, None),
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".to_owned(),
                    kind: "ClusterRole".to_owned(),
                    name: role.clone(),
                },
                subjects: Some(self.subject()),
            },
        ))
    }
}

/// Why the identity could not be installed, renewed or removed: the tenant's message
/// (fixed text, an HTTP status at most) and the chain for the operator's log.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub detail: String,
}

impl Failure {
    fn kube(action: &str, error: &kube::Error) -> Failure {
        let message = match error {
            kube::Error::Api(status) => {
                format!("the cluster answered HTTP {} when the writer tried to {action}", status.code)
            }
            _ => format!("the writer could not reach the cluster to {action}"),
        };
        Failure { message, detail: gitops_shared::telemetry::error_chain(error) }
    }

    fn timeout(action: &str) -> Failure {
        Failure {
            message: format!(
                "the cluster did not answer within {} seconds when the writer tried to {action}",
                REQUEST_TIMEOUT.as_secs()
            ),
            detail: String::new(),
        }
    }
}

/// Whether the policy lets the writer contact `api_url` for this; the tenant's
/// message when not.
pub fn allowed(policy: Option<&ConnectionPolicy>, api_url: &str) -> Result<(), String> {
    let Some(policy) = policy else {
        return Err("createNewServiceAccount needs the writer to contact apiURL, and the writer's egress policy \
                    allows no destination"
            .to_owned());
    };
    policy.decide(api_url).map_err(|denial: Denial| {
        format!("createNewServiceAccount needs the writer to contact apiURL: {}", denial.message())
    })
}

async fn bounded<T>(action: &str, call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, Failure> {
    match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
        Err(_) => Err(Failure::timeout(action)),
        Ok(result) => result.map_err(|error| Failure::kube(action, &error)),
    }
}

/// An object as an apply body (with apiVersion and kind, which the typed structs omit).
fn typed<T: serde::Serialize>(object: T, api_version: &str, kind: &str) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".to_owned(), api_version.into());
        map.insert("kind".to_owned(), kind.into());
    }
    value
}

const RBAC: &str = "rbac.authorization.k8s.io/v1";

/// Applies the ServiceAccount, Roles and bindings (or the ClusterRole and its binding).
pub async fn install(client: &kube::Client, objects: &Installed) -> Result<(), Failure> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &objects.account_namespace);
    let account = typed(objects.service_account(), "v1", "ServiceAccount");
    bounded("create the ServiceAccount", accounts.patch(&objects.account, &params, &Patch::Apply(&account))).await?;
    for (role, binding) in objects.roles() {
        let namespace = role.metadata.namespace.clone().unwrap_or_default();
        let roles: Api<Role> = Api::namespaced(client.clone(), &namespace);
        let role = typed(role, RBAC, "Role");
        bounded("create a Role", roles.patch(&objects.role, &params, &Patch::Apply(&role))).await?;
        let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), &namespace);
        let binding = typed(binding, RBAC, "RoleBinding");
        bounded("create a RoleBinding", bindings.patch(&objects.role, &params, &Patch::Apply(&binding))).await?;
    }
    if let Some((role, binding)) = objects.cluster_role() {
        let name = role.metadata.name.clone().unwrap_or_default();
        let roles: Api<ClusterRole> = Api::all(client.clone());
        let role = typed(role, RBAC, "ClusterRole");
        bounded("create the ClusterRole", roles.patch(&name, &params, &Patch::Apply(&role))).await?;
        let name = binding.metadata.name.clone().unwrap_or_default();
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        let binding = typed(binding, RBAC, "ClusterRoleBinding");
        bounded("create the ClusterRoleBinding", bindings.patch(&name, &params, &Patch::Apply(&binding))).await?;
    }
    Ok(())
}

/// A token of the installed ServiceAccount, valid for `lifetime` (at least 10 min),
/// and when it expires.
pub async fn request_token(
    client: &kube::Client,
    objects: &Installed,
    lifetime: Duration,
) -> Result<(String, SystemTime), Failure> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &objects.account_namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(lifetime.as_secs().max(600) as i64), ..Default::default() },
        ..Default::default()
    };
    let answer = bounded(
        "request a token of the ServiceAccount",
        accounts.create_token_request(&objects.account, &PostParams::default(), &request),
    )
    .await?;
    let status = answer.status.ok_or_else(|| Failure {
        message: "the cluster answered the token request without a token".to_owned(),
        detail: String::new(),
    })?;
    let seconds = status.expiration_timestamp.0.as_second();
    let expires_at = UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or_default());
    Ok((status.token, expires_at))
}

/// The stored credentials: the token, with the tenant's CA and TLS server name
/// (the cluster is the same), never the tenant's own token or client certificate.
pub fn token_credentials(tenant: &ClusterCredentials, token: String) -> ClusterCredentials {
    ClusterCredentials {
        bearer_token: Some(token),
        certificate_authority_data: tenant.certificate_authority_data.clone(),
        tls_server_name: tenant.tls_server_name.clone(),
        ..Default::default()
    }
}

/// Deletes the objects (the ServiceAccount too when `account`); NotFound counts as deleted.
pub async fn remove(client: &kube::Client, objects: &Installed, account: bool) -> Result<(), Failure> {
    async fn gone(action: &str, call: impl Future<Output = Result<(), kube::Error>>) -> Result<(), Failure> {
        match tokio::time::timeout(REQUEST_TIMEOUT, call).await {
            Err(_) => Err(Failure::timeout(action)),
            Ok(Ok(())) => Ok(()),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => Ok(()),
            Ok(Err(error)) => Err(Failure::kube(action, &error)),
        }
    }
    let params = DeleteParams::default();
    if let Some((role, binding)) = &objects.cluster_role {
        let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
        gone("remove the ClusterRoleBinding", async { bindings.delete(binding, &params).await.map(drop) }).await?;
        let roles: Api<ClusterRole> = Api::all(client.clone());
        gone("remove the ClusterRole", async { roles.delete(role, &params).await.map(drop) }).await?;
    }
    for namespace in &objects.namespaces {
        let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), namespace);
        gone("remove a RoleBinding", async { bindings.delete(&objects.role, &params).await.map(drop) }).await?;
        let roles: Api<Role> = Api::namespaced(client.clone(), namespace);
        gone("remove a Role", async { roles.delete(&objects.role, &params).await.map(drop) }).await?;
    }
    if !account {
        return Ok(());
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &objects.account_namespace);
    gone("remove the ServiceAccount", async { accounts.delete(&objects.account, &params).await.map(drop) }).await
}

/// Whether a stored token must be replaced: none stored, the spec changed since, or
/// less than `renew_before` left.
pub fn token_due(stored: Option<&StoredToken>, generation: i64, renew_before: Duration) -> bool {
    match stored {
        Some(StoredToken { generation: stored_generation, expires_at: Some(expires_at), .. })
            if *stored_generation >= generation =>
        {
            expires_at.checked_sub(renew_before).is_none_or(|renew_at| renew_at <= SystemTime::now())
        }
        _ => true,
    }
}

/// What was installed for the stored state of environment `uid`, when its stored
/// credentials are an installed ServiceAccount's token.
pub fn installed_for(uid: Uuid, stored: Option<&StoredToken>) -> Option<Installed> {
    let stored = stored.filter(|s| s.expires_at.is_some())?;
    Some(Installed::new(uid, &stored.namespaces, stored.cluster_resources))
}

/// The objects of `old` that `new` (None: no ServiceAccount any more) no longer has,
/// and whether `old`'s ServiceAccount is one of them; None when nothing is left over.
pub fn leftovers(old: &Installed, new: Option<&Installed>) -> Option<(Installed, bool)> {
    let keep_namespaces = new.map(|n| n.namespaces.as_slice()).unwrap_or_default();
    let namespaces: Vec<String> = old.namespaces.iter().filter(|ns| !keep_namespaces.contains(ns)).cloned().collect();
    let cluster_role = old.cluster_role.clone().filter(|_| new.is_none_or(|n| n.cluster_role.is_none()));
    let account = new.is_none_or(|n| n.account_namespace != old.account_namespace);
    if namespaces.is_empty() && cluster_role.is_none() && !account {
        return None;
    }
    Some((Installed { namespaces, cluster_role, ..old.clone() }, account))
}

/// How much longer the removal on delete may hold the finalizer, given when the
/// deletion began (Unix seconds; None: unknown, nothing is held); None once
/// [`CLEANUP_LIMIT`] has passed.
pub fn cleanup_time_left(deleting_since: Option<i64>, now: SystemTime) -> Option<Duration> {
    let since = UNIX_EPOCH + Duration::from_secs(u64::try_from(deleting_since?).ok()?);
    let deadline = since + CLEANUP_LIMIT;
    deadline.duration_since(now).ok().filter(|left| !left.is_zero())
}

/// Queues, every `renew_every` of the home settings, the environments of the owned
/// shards whose token is due, until `cancel`; their reconcile requests a new one.
pub(in crate::controller) async fn renew_loop(ctl: Arc<Controllers>, cancel: CancellationToken) {
    let every = ctl.ctx.home.renew_every.max(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(error) = queue_due(&ctl).await {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "looking for environment tokens to renew failed; retrying");
        }
    }
}

async fn queue_due(ctl: &Arc<Controllers>) -> Result<(), ReconcileError> {
    let shards = ctl.shards.borrow().clone();
    if shards.is_empty() {
        return Ok(());
    }
    let horizon = SystemTime::now() + ctl.ctx.home.renew_before;
    let due = {
        let client = pooled(&ctl.ctx.pool).await?;
        managed_environment_tokens_near_expiry(&client, &shards, horizon).await?
    };
    for (namespace, name) in due {
        ctl.offer(Key { kind: Kind::Environment, namespace, name });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_environments_get_a_role_per_namespace_and_no_cluster_role() {
        let uid = Uuid::nil();
        let objects = Installed::new(uid, &["apps".to_owned(), "web".to_owned()], false);
        assert_eq!(objects.account, format!("argocd-manager-{uid}"));
        assert_eq!(objects.account_namespace, "apps");
        assert!(objects.cluster_role().is_none());
        let roles = objects.roles();
        assert_eq!(roles.len(), 2);
        for ((role, binding), namespace) in roles.iter().zip(["apps", "web"]) {
            assert_eq!(role.metadata.namespace.as_deref(), Some(namespace));
            let rules = role.rules.as_ref().expect("rules");
            assert_eq!(rules.len(), 1, "no non-resource URLs in a Role");
            assert_eq!(rules[0].verbs, ["*"]);
            assert_eq!(binding.role_ref.kind, "Role");
            let subjects = binding.subjects.as_ref().expect("subjects");
            assert_eq!(subjects[0].namespace.as_deref(), Some("apps"));
        }
        assert!(objects.account.len() <= 63 && objects.role.len() <= 63);
    }

    #[test]
    fn cluster_resources_get_the_originals_cluster_role() {
        let objects = Installed::new(Uuid::nil(), &[], true);
        assert_eq!(objects.account_namespace, "kube-system");
        assert!(objects.roles().is_empty());
        let (role, binding) = objects.cluster_role().expect("a ClusterRole");
        let rules = role.rules.expect("rules");
        assert_eq!(rules[0].api_groups.as_deref(), Some(&["*".to_owned()][..]));
        assert_eq!(rules[1].non_resource_urls.as_deref(), Some(&["*".to_owned()][..]));
        assert_eq!(binding.role_ref.name, role.metadata.name.expect("name"));
    }

    fn stored(generation: i64, expires_at: Option<SystemTime>) -> StoredToken {
        StoredToken { generation, namespaces: vec!["a".into()], cluster_resources: false, expires_at }
    }

    #[test]
    fn tokens_are_due_when_missing_old_or_near_expiry() {
        let hour = Duration::from_secs(3600);
        let later = SystemTime::now() + 2 * hour;
        assert!(token_due(None, 1, hour));
        assert!(token_due(Some(&stored(1, None)), 1, hour), "the tenant's own credentials are replaced");
        assert!(token_due(Some(&stored(1, Some(later))), 2, hour), "a changed spec gets a new token");
        assert!(!token_due(Some(&stored(2, Some(later))), 2, hour));
        assert!(token_due(Some(&stored(2, Some(SystemTime::now() + hour / 2))), 2, hour));
        assert_eq!(installed_for(Uuid::nil(), Some(&stored(1, None))), None, "nothing installed");
        assert!(installed_for(Uuid::nil(), Some(&stored(1, Some(later)))).is_some());
    }

    #[test]
    fn leftovers_are_what_the_new_spec_no_longer_has() {
        let uid = Uuid::nil();
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        let old = Installed::new(uid, &names(&["a", "b", "c"]), false);
        let same_account = Installed::new(uid, &names(&["a", "c"]), false);
        let (left, account) = leftovers(&old, Some(&same_account)).expect("b is left over");
        assert_eq!((left.namespaces, account), (names(&["b"]), false));
        assert_eq!(leftovers(&old, Some(&old)), None);
        let moved = Installed::new(uid, &names(&["b"]), false);
        let (left, account) = leftovers(&old, Some(&moved)).expect("the account moved");
        assert_eq!((left.namespaces, account, left.account_namespace.as_str()), (names(&["a", "c"]), true, "a"));
        let cluster = Installed::new(uid, &names(&["a"]), true);
        let (left, account) = leftovers(&cluster, Some(&same_account)).expect("the ClusterRole goes");
        assert!(left.cluster_role.is_some() && left.namespaces.is_empty() && !account);
        let (left, account) = leftovers(&old, None).expect("everything goes");
        assert_eq!((left, account), (old.clone(), true));
    }

    #[test]
    fn cleanup_holds_the_finalizer_at_most_ten_minutes() {
        let start = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let since = Some(1_000_000);
        assert_eq!(cleanup_time_left(since, start), Some(CLEANUP_LIMIT));
        assert_eq!(cleanup_time_left(since, start + Duration::from_secs(540)), Some(Duration::from_secs(60)));
        assert_eq!(cleanup_time_left(since, start + CLEANUP_LIMIT), None);
        assert_eq!(cleanup_time_left(since, start + Duration::from_secs(3600)), None);
        assert_eq!(cleanup_time_left(None, start), None, "without a deletion time nothing is held");
    }

    #[test]
    fn no_policy_refuses() {
        assert!(allowed(None, "https://cluster.example.invalid").is_err());
        let policy = ConnectionPolicy::new(vec!["*.example.invalid".parse().expect("pattern")], vec![]);
        assert!(allowed(Some(&policy), "https://cluster.example.invalid").is_ok());
        assert!(allowed(Some(&policy), "https://elsewhere.invalid").is_err());
    }
}
