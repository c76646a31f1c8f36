//! The tenant's own namespace as a destination. A GitOpsDeployment that names no
//! environment deploys into its own namespace on the home cluster, and Argo CD
//! reaches it with credentials that work there and nowhere else: a ServiceAccount
//! in the tenant namespace bound to a Role of that namespace, its token from
//! TokenRequest. The writer stores them as the tenant's *home* managed environment
//! (`managed_environment.home`, keyed by the namespace's UID), so the agent treats
//! them like any environment: a cluster Secret and one project destination.
//!
//! Tokens expire (`token_lifetime`); the writer requests a new one when less than
//! `renew_before` is left — on the next reconcile of one of the tenant's deployments,
//! or from [`renew_loop`], which looks for home credentials near expiry in the
//! shards this writer owns. A new token is a rotation: the environment's operation
//! carries it to Argo CD's cluster Secret.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use gitops_shared::credential::{ClusterCredentials, ManagedEnvironmentIntent, managed_environment_upsert_in_txn};
use gitops_shared::db::{DbError, pooled};
use gitops_shared::model::{ResourceType, TenantId};
use gitops_shared::queue::operation_enqueue_in_txn;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use futures_util::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::tenant::{Tenancy, credential_error, tenant_placed_in_txn};
use super::{Controllers, ReconcileError, next_or_cancelled};
use crate::shard::shard_of;

/// The ServiceAccount, Role and RoleBinding the writer keeps in a tenant namespace.
pub const HOME_IDENTITY: &str = "gitops-service-argocd";
/// Field manager of the writer's server-side applies.
const FIELD_MANAGER: &str = "gitops-writer";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const MANAGED_BY_VALUE: &str = "gitops-writer";

/// How Argo CD reaches the home cluster and how long home tokens live.
#[derive(Debug, Clone)]
pub struct HomeSettings {
    /// The home cluster's API server as Argo CD reaches it.
    pub api_url: String,
    /// Base64 of the PEM CA bundle that verifies `api_url` (None: the system roots).
    pub ca_data: Option<String>,
    /// Lifetime asked of TokenRequest (the API server may shorten it; at least 10 min).
    pub token_lifetime: Duration,
    /// Renew a token when less than this much of it is left.
    pub renew_before: Duration,
    /// How often the writer looks for tokens to renew.
    pub renew_every: Duration,
}

impl Default for HomeSettings {
    fn default() -> Self {
        HomeSettings {
            api_url: "https://kubernetes.default.svc".to_owned(),
            ca_data: None,
            token_lifetime: Duration::from_secs(3600),
            renew_before: Duration::from_secs(1200),
            renew_every: Duration::from_secs(60),
        }
    }
}

impl HomeSettings {

    /// `ca_data` from the DER certificates of a kube client configuration.
    pub fn ca_from_der(certificates: &[Vec<u8>]) -> Option<String> {
        if certificates.is_empty() {
            return None;
        }
        let engine = base64::engine::general_purpose::STANDARD;
        let mut pem = String::new();
        for der in certificates {
            pem.push_str("-----BEGIN CERTIFICATE-----\n");
            let body = engine.encode(der);
            for line in body.as_bytes().chunks(64) {
                pem.push_str(std::str::from_utf8(line).unwrap_or_default());
                pem.push('\n');
            }
            pem.push_str("-----END CERTIFICATE-----\n");
        }
        Some(engine.encode(pem))
    }
}

const HOME: &str = "
SELECT e.id, c.expires_at FROM managed_environment e
  JOIN tenant t ON t.id = e.tenant_id
  LEFT JOIN cluster_credential c ON c.managed_environment_id = e.id
 WHERE t.namespace_uid = $1 AND e.home AND e.row_state = 'active'";

const MARK_HOME: &str = "
UPDATE managed_environment SET home = true WHERE id = $1 AND NOT home";

const SET_EXPIRY: &str = "
UPDATE cluster_credential SET expires_at = $2 WHERE managed_environment_id = $1";

const NEAR_EXPIRY: &str = "
SELECT t.namespace_name, t.namespace_uid FROM managed_environment e
  JOIN tenant t ON t.id = e.tenant_id
  JOIN cluster_credential c ON c.managed_environment_id = e.id
 WHERE e.home AND e.row_state = 'active' AND t.row_state = 'active'
   AND t.writer_shard = ANY($1) AND c.expires_at < $2
 ORDER BY c.expires_at
 LIMIT 500";

/// The home environment of a namespace, or why there is none yet.
pub(super) enum Home {
    Ready(i64),
    NotOwner,
    NoEngine,
    Gone,
}

/// The id of the tenant's home environment, with a token that has more than
/// `renew_before` left; makes the identity and requests a token when needed.
pub(super) async fn home_environment(ctl: &Arc<Controllers>, namespace: &str, namespace_uid: Uuid) -> Result<Home, ReconcileError> {
    if ctl.take_home_damaged(namespace) {
        ctl.home_cache().remove(&namespace_uid);
        return match issue(ctl, namespace, namespace_uid).await {
            Ok(home) => Ok(home),
            Err(error) => {
                // Not repaired: the next reconcile tries again.
                ctl.home_damaged(namespace);
                Err(error)
            }
        };
    }
    let now = SystemTime::now();
    if let Some(&(id, renew_at)) = ctl.home_cache().get(&namespace_uid)
        && renew_at > now
    {
        return Ok(Home::Ready(id));
    }
    let renew_before = ctl.ctx.home.renew_before;
    let stored: Option<(i64, Option<SystemTime>)> = {
        let client = pooled(&ctl.ctx.pool).await?;
        client
            .query_opt(HOME, &[&namespace_uid])
            .await
            .map_err(DbError::query("read a home environment"))?
            .map(|row| (row.get(0), row.get(1)))
    };
    if let Some((id, Some(expires_at))) = stored
        && let Some(renew_at) = expires_at.checked_sub(renew_before)
        && renew_at > now
    {
        ctl.home_cache().insert(namespace_uid, (id, renew_at));
        return Ok(Home::Ready(id));
    }
    issue(ctl, namespace, namespace_uid).await
}

/// Makes the identity, requests a token and stores it as the home environment.
async fn issue(ctl: &Arc<Controllers>, namespace: &str, namespace_uid: Uuid) -> Result<Home, ReconcileError> {
    ensure_identity(&ctl.ctx.kube, namespace).await?;
    let (token, expires_at) = request_token(&ctl.ctx.kube, namespace, ctl.ctx.home.token_lifetime).await?;
    let settings = &ctl.ctx.home;
    let intent = ManagedEnvironmentIntent {
        tenant_id: TenantId(0),
        resource_uid: namespace_uid,
        resource_name: namespace.to_owned(),
        generation: 1,
        api_url: settings.api_url.clone(),
        allow_insecure_skip_tls_verify: false,
        namespaces: vec![namespace.to_owned()],
        cluster_resources: false,
        secret_name: HOME_IDENTITY.to_owned(),
        // Every token is a rotation of the stored credentials (two requested within
        // one second share an expiry, so that cannot tell them apart).
        secret_resource_version: Some(Uuid::new_v4().to_string()),
        credentials: ClusterCredentials {
            bearer_token: Some(token),
            certificate_authority_data: settings.ca_data.clone(),
            ..Default::default()
        },
    };
    let shard = shard_of(namespace);
    let (writer_id, ns_name, sealer) = (ctl.ctx.writer_id.clone(), namespace.to_owned(), ctl.ctx.secrets.clone());
    let healthy_within = ctl.settings.healthy_within;
    let mut client = pooled(&ctl.ctx.pool).await?;
    let home = ctl.in_txn(&mut client, |txn| {
        let (intent, writer_id, ns_name, sealer) = (intent.clone(), writer_id.clone(), ns_name.clone(), sealer.clone());
        Box::pin(async move {
            let (tenant, instance) =
                match tenant_placed_in_txn(txn, namespace_uid, &ns_name, shard, &writer_id, healthy_within).await? {
                    Tenancy::Placed(tenant, instance) => (tenant, instance),
                    Tenancy::NotOwner => return Ok(Home::NotOwner),
                    Tenancy::NoEngine => return Ok(Home::NoEngine),
                    Tenancy::Gone => return Ok(Home::Gone),
                };
            let intent = ManagedEnvironmentIntent { tenant_id: tenant, ..intent };
            let changed = managed_environment_upsert_in_txn(txn, &sealer, &intent).await.map_err(credential_error)?;
            let Some(row) = txn.query_opt(HOME_ID, &[&namespace_uid, &tenant.0]).await.map_err(DbError::query("read a home environment"))?
            else {
                return Ok(Home::Gone);
            };
            let id: i64 = row.get(0);
            txn.execute(MARK_HOME, &[&id]).await.map_err(DbError::query("mark a home environment"))?;
            txn.execute(SET_EXPIRY, &[&id, &expires_at]).await.map_err(DbError::query("record a token's expiry"))?;
            if changed.is_some() {
                operation_enqueue_in_txn(txn, instance, tenant, ResourceType::ManagedEnvironment, id).await?;
            }
            Ok(Home::Ready(id))
        })
    })
    .await?;
    if let Home::Ready(id) = home
        && let Some(renew_at) = expires_at.checked_sub(ctl.ctx.home.renew_before)
    {
        ctl.home_cache().insert(namespace_uid, (id, renew_at));
        tracing::debug!(tenant.ns = %namespace, environment = id, "home credentials issued");
    }
    Ok(home)
}

const HOME_ID: &str = "
SELECT id FROM managed_environment WHERE resource_uid = $1 AND tenant_id = $2 AND row_state = 'active'";

fn meta(namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(HOME_IDENTITY.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned())])),
        ..Default::default()
    }
}

/// The Role: everything inside the tenant namespace, nothing outside it (a Role
/// cannot grant cluster-scoped or other namespaces' resources).
pub fn home_role(namespace: &str) -> Role {
    Role {
        metadata: meta(namespace),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["*".to_owned()]),
            resources: Some(vec!["*".to_owned()]),
            verbs: vec!["*".to_owned()],
            ..Default::default()
        }]),
    }
}

/// The RoleBinding: the home Role to the home ServiceAccount.
fn home_binding(namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(namespace),
        role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".to_owned(), kind: "Role".to_owned(), name: HOME_IDENTITY.to_owned() },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: HOME_IDENTITY.to_owned(),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        }]),
    }
}

/// Applies the ServiceAccount, Role and RoleBinding (server-side apply: idempotent,
/// and a tenant's edits to them are overwritten).
async fn ensure_identity(kube: &kube::Client, namespace: &str) -> Result<(), ReconcileError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), namespace);
    let account = ServiceAccount { metadata: meta(namespace), ..Default::default() };
    accounts
        .patch(HOME_IDENTITY, &params, &Patch::Apply(&typed(account, "v1", "ServiceAccount")))
        .await
        .map_err(|source| ReconcileError::Kube { action: "apply the home ServiceAccount", source })?;
    let roles: Api<Role> = Api::namespaced(kube.clone(), namespace);
    roles
        .patch(HOME_IDENTITY, &params, &Patch::Apply(&typed(home_role(namespace), "rbac.authorization.k8s.io/v1", "Role")))
        .await
        .map_err(|source| ReconcileError::Kube { action: "apply the home Role", source })?;
    let binding = home_binding(namespace);
    let bindings: Api<RoleBinding> = Api::namespaced(kube.clone(), namespace);
    bindings
        .patch(HOME_IDENTITY, &params, &Patch::Apply(&typed(binding, "rbac.authorization.k8s.io/v1", "RoleBinding")))
        .await
        .map_err(|source| ReconcileError::Kube { action: "apply the home RoleBinding", source })?;
    Ok(())
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

/// A token of the home ServiceAccount and when it expires.
async fn request_token(kube: &kube::Client, namespace: &str, lifetime: Duration) -> Result<(String, SystemTime), ReconcileError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec { expiration_seconds: Some(lifetime.as_secs().max(600) as i64), ..Default::default() },
        ..Default::default()
    };
    let answer: TokenRequest = accounts
        .create_subresource("token", HOME_IDENTITY, &PostParams::default(), &typed(request, "authentication.k8s.io/v1", "TokenRequest"))
        .await
        .map_err(|source| ReconcileError::Kube { action: "request a home token", source })?;
    let status = answer.status.ok_or(ReconcileError::Unexpected("the TokenRequest answer has no status"))?;
    let seconds = status.expiration_timestamp.0.as_second();
    let expires_at = UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or_default());
    Ok((status.token, expires_at))
}

/// Removes the identity from a namespace whose tenant is being cleaned up (the
/// namespace may be terminating or gone: those answers are fine).
pub(super) async fn remove_identity(kube: &kube::Client, namespace: &str) -> Result<(), ReconcileError> {
    let params = DeleteParams::default();
    let gone = |result: Result<(), kube::Error>, action: &'static str| match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::Kube { action, source }),
    };
    let bindings: Api<RoleBinding> = Api::namespaced(kube.clone(), namespace);
    gone(bindings.delete(HOME_IDENTITY, &params).await.map(drop), "remove the home RoleBinding")?;
    let roles: Api<Role> = Api::namespaced(kube.clone(), namespace);
    gone(roles.delete(HOME_IDENTITY, &params).await.map(drop), "remove the home Role")?;
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), namespace);
    gone(accounts.delete(HOME_IDENTITY, &params).await.map(drop), "remove the home ServiceAccount")
}

/// Watches the writer's ServiceAccounts, Roles and RoleBindings (by their
/// managed-by label): when a tenant deletes the home identity or changes the Role or
/// the binding, the namespace's next reconcile makes it again with a new token (a
/// ServiceAccount made again has a new UID: the old token no longer works).
pub(super) async fn watch_identity(ctl: Arc<Controllers>, scope: Option<String>, cancel: CancellationToken) {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
    let config = watcher::Config::default().labels(&selector);
    let api = |kube: &kube::Client| -> (Api<ServiceAccount>, Api<Role>, Api<RoleBinding>) {
        match &scope {
            Some(namespace) => {
                (Api::namespaced(kube.clone(), namespace), Api::namespaced(kube.clone(), namespace), Api::namespaced(kube.clone(), namespace))
            }
            None => (Api::all(kube.clone()), Api::all(kube.clone()), Api::all(kube.clone())),
        }
    };
    let (accounts, roles, bindings) = api(&ctl.ctx.kube);
    let accounts = watcher::watcher(accounts, config.clone()).default_backoff().map_ok(|e| changed(e, Identity::Account));
    let roles = watcher::watcher(roles, config.clone()).default_backoff().map_ok(|e| changed(e, Identity::Role));
    let bindings = watcher::watcher(bindings, config).default_backoff().map_ok(|e| changed(e, Identity::Binding));
    let mut events = futures_util::stream::select_all([accounts.boxed(), roles.boxed(), bindings.boxed()]);
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        let (object, deleted) = match event {
            Ok(Some(change)) => change,
            Ok(None) => continue,
            Err(error) => {
                tracing::warn!(%error, "home identity watch failed; retrying");
                continue;
            }
        };
        let namespace = object.namespace().to_owned();
        if object.name() == HOME_IDENTITY && (deleted || !object.as_made(&namespace)) {
            tracing::info!(tenant.ns = %namespace, deleted, "home identity changed under the writer; making it again");
            ctl.home_damaged(&namespace);
        }
    }
}

/// A change after the first listing: the object, and whether it was deleted.
fn changed<K>(event: watcher::Event<K>, wrap: fn(K) -> Identity) -> Option<(Identity, bool)> {
    match event {
        watcher::Event::Apply(object) => Some((wrap(object), false)),
        watcher::Event::Delete(object) => Some((wrap(object), true)),
        watcher::Event::Init | watcher::Event::InitApply(_) | watcher::Event::InitDone => None,
    }
}

/// One object of the home identity, as its watcher saw it.
enum Identity {
    Account(ServiceAccount),
    Role(Role),
    Binding(RoleBinding),
}

impl Identity {
    fn meta(&self) -> &ObjectMeta {
        match self {
            Identity::Account(o) => &o.metadata,
            Identity::Role(o) => &o.metadata,
            Identity::Binding(o) => &o.metadata,
        }
    }

    fn name(&self) -> &str {
        self.meta().name.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or_default()
    }

    /// Whether it still says what the writer applied (a ServiceAccount's content
    /// does not matter; its UID does, and a new one comes as delete + create).
    fn as_made(&self, namespace: &str) -> bool {
        match self {
            Identity::Account(_) => true,
            Identity::Role(role) => role.rules == home_role(namespace).rules,
            Identity::Binding(binding) => {
                let expected = home_binding(namespace);
                binding.role_ref == expected.role_ref && binding.subjects == expected.subjects
            }
        }
    }
}

/// Renews, every `renew_every`, the home tokens of the owned shards that are due, until `cancel`.
pub(super) async fn renew_loop(ctl: Arc<Controllers>, cancel: CancellationToken) {
    let every = ctl.ctx.home.renew_every.max(Duration::from_millis(100));
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(error) = renew_due(&ctl).await {
            tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "renewing home tokens failed; retrying");
        }
    }
}

async fn renew_due(ctl: &Arc<Controllers>) -> Result<usize, ReconcileError> {
    let shards = ctl.shards.borrow().clone();
    if shards.is_empty() {
        return Ok(0);
    }
    let horizon = SystemTime::now() + ctl.ctx.home.renew_before;
    let due: Vec<(String, Uuid)> = {
        let client = pooled(&ctl.ctx.pool).await?;
        client
            .query(NEAR_EXPIRY, &[&shards, &horizon])
            .await
            .map_err(DbError::query("find home tokens near expiry"))?
            .iter()
            .map(|row| (row.get(0), row.get(1)))
            .collect()
    };
    let mut renewed = 0;
    for (namespace, namespace_uid) in due {
        if !ctl.owns(&namespace) {
            continue;
        }
        ctl.home_cache().remove(&namespace_uid);
        if let Home::Ready(_) = issue(ctl, &namespace, namespace_uid).await? {
            renewed += 1;
        }
    }
    Ok(renewed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_stays_inside_its_namespace() {
        let role = home_role("team-a");
        assert_eq!(role.metadata.namespace.as_deref(), Some("team-a"));
        let rules = role.rules.expect("rules");
        assert_eq!(rules.len(), 1);
        assert!(rules[0].non_resource_urls.is_none(), "a Role cannot grant non-resource URLs");
    }

    #[test]
    fn ca_bundles_are_pem_in_base64() {
        let encoded = HomeSettings::ca_from_der(&[vec![1, 2, 3]]).expect("some");
        let pem = base64::engine::general_purpose::STANDARD.decode(encoded).expect("base64");
        let pem = String::from_utf8(pem).expect("utf8");
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\nAQID\n-----END CERTIFICATE-----"));
        assert!(HomeSettings::ca_from_der(&[]).is_none());
    }

    #[test]
    fn tokens_are_renewed_before_they_expire() {
        let settings = HomeSettings::default();
        assert!(settings.renew_before < settings.token_lifetime);
        assert!(settings.renew_every < settings.renew_before, "a scan happens before a due token expires");
    }
}
