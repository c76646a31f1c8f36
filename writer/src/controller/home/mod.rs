//! The tenant's own namespace as a destination. A GitOpsDeployment that names no
//! environment deploys into its own namespace on the home cluster, and Argo CD
//! reaches it with credentials that work there and nowhere else: a ServiceAccount
//! in the service's home namespace bound, in the tenant namespace only, to the
//! ClusterRole the operator chose (see `identity`), its token from TokenRequest.
//! The writer stores them as the tenant's *home* managed environment
//! (`managed_environment.home`, keyed by the namespace's UID), so the agent treats
//! them like any environment: a cluster Secret and one project destination.
//!
//! Tokens expire (`token_lifetime`); the writer requests a new one when less than
//! `renew_before` is left — on the next reconcile of one of the tenant's deployments,
//! or from [`renew_loop`], which looks for home credentials near expiry in the
//! shards this writer owns. A new token is a rotation: the environment's operation
//! carries it to Argo CD's cluster Secret.

mod check;
mod identity;

pub use check::{HomeStatus, check_loop, check_once};
pub use identity::{HOME_IDENTITY, TENANT_NAMESPACE_LABEL, home_account_name, home_binding};
pub(crate) use identity::{remove_identity, watch_identity};

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use gitops_shared::db::credential::{ClusterCredentials, ManagedEnvironmentIntent, managed_environment_upsert_in_txn};
use gitops_shared::db::managed_environment::{
    managed_environment_home, managed_environment_home_near_expiry, managed_environment_live_in_txn,
    managed_environment_set_home_in_txn,
};
use gitops_shared::db::pooled;
use gitops_shared::model::{ManagedEnvironmentId, ResourceType};
use gitops_shared::queue::operation_enqueue_in_txn;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::tenant::{Placed, credential_error};
use super::{Controllers, ReconcileError};

/// The ClusterRole bound in tenant namespaces unless the operator chooses another.
pub const DEFAULT_HOME_CLUSTER_ROLE: &str = "admin";
/// The namespace of the home ServiceAccounts unless the operator chooses another.
pub const DEFAULT_HOME_NAMESPACE: &str = "gitops-service-home";

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
    /// The ClusterRole Argo CD acts with in a tenant's own namespace.
    pub cluster_role: String,
    /// The service-owned namespace of the home ServiceAccounts.
    pub namespace: String,
}

impl Default for HomeSettings {
    fn default() -> Self {
        HomeSettings {
            api_url: "https://kubernetes.default.svc".to_owned(),
            ca_data: None,
            token_lifetime: Duration::from_secs(3600),
            renew_before: Duration::from_secs(1200),
            renew_every: Duration::from_secs(60),
            cluster_role: DEFAULT_HOME_CLUSTER_ROLE.to_owned(),
            namespace: DEFAULT_HOME_NAMESPACE.to_owned(),
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

/// The home environment of a namespace, or why there is none yet.
pub(super) enum Home {
    Ready(ManagedEnvironmentId),
    NotOwner,
    NoEngine(gitops_shared::db::placement::Unplaced),
    Gone,
    /// The home role or namespace is missing: no binding is made.
    Unavailable(String),
    /// The namespace is not (or no longer) served: no identity is made there.
    NotServed,
}

/// The id of the tenant's home environment, with a token that has more than
/// `renew_before` left; makes the identity and requests a token when needed.
pub(super) async fn home_environment(
    ctl: &Arc<Controllers>,
    namespace: &str,
    namespace_uid: Uuid,
) -> Result<Home, ReconcileError> {
    // Without the configured role (or its namespace) home identities act with
    // nothing: say so rather than report a deployment that cannot be applied.
    if let Some(problem) = ctl.ctx.home_status.problem() {
        return Ok(Home::Unavailable(problem));
    }
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
    let stored = {
        let client = pooled(&ctl.ctx.pool).await?;
        managed_environment_home(&client, namespace_uid).await?
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
    if ctl.serves(namespace).is_err() {
        return Ok(Home::NotServed);
    }
    identity::ensure_identity(&ctl.ctx.kube, &ctl.ctx.home, namespace, namespace_uid).await?;
    let (token, expires_at) = identity::request_token(&ctl.ctx.kube, &ctl.ctx.home, namespace_uid).await?;
    let settings = &ctl.ctx.home;
    let intent = ManagedEnvironmentIntent {
        resource_uid: namespace_uid,
        resource_name: namespace.to_owned(),
        generation: 1,
        api_url: settings.api_url.clone(),
        allow_insecure_skip_tls_verify: false,
        namespaces: vec![namespace.to_owned()],
        cluster_resources: false,
        secret_name: home_account_name(namespace_uid),
        // Every token is a rotation of the stored credentials (two requested within
        // one second share an expiry, so that cannot tell them apart).
        secret_resource_version: Some(Uuid::new_v4().to_string()),
        credentials: ClusterCredentials {
            bearer_token: Some(token),
            certificate_authority_data: settings.ca_data.clone(),
            ..Default::default()
        },
    };
    let sealer = ctl.ctx.secrets.clone();
    let placed = ctl
        .in_tenant_txn(namespace, namespace_uid, move |txn, tenant, instance| {
            let (intent, sealer) = (intent.clone(), sealer.clone());
            Box::pin(async move {
                let changed =
                    managed_environment_upsert_in_txn(txn, &sealer, tenant, &intent).await.map_err(credential_error)?;
                let Some(id) = managed_environment_live_in_txn(txn, namespace_uid, tenant).await? else {
                    return Ok(Home::Gone);
                };
                managed_environment_set_home_in_txn(txn, id, expires_at).await?;
                if changed.is_some() {
                    operation_enqueue_in_txn(txn, instance, tenant, ResourceType::ManagedEnvironment, id.0).await?;
                }
                Ok(Home::Ready(id))
            })
        })
        .await?;
    let home = match placed {
        Placed::Stored(home) => home,
        Placed::NotOwner => Home::NotOwner,
        Placed::NoEngine(why) => Home::NoEngine(why),
        Placed::Gone => Home::Gone,
    };
    if let Home::Ready(id) = home
        && let Some(renew_at) = expires_at.checked_sub(ctl.ctx.home.renew_before)
    {
        ctl.home_cache().insert(namespace_uid, (id, renew_at));
        tracing::debug!(tenant.ns = %namespace, environment = %id, "home credentials issued");
    }
    Ok(home)
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
            ctl.ctx.metrics.home_token_renewal_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
    let due = {
        let client = pooled(&ctl.ctx.pool).await?;
        managed_environment_home_near_expiry(&client, &shards, horizon).await?
    };
    let mut renewed = 0;
    for (namespace, namespace_uid) in due {
        // Tenants of namespaces no longer served keep what they had; nothing new is
        // bound there.
        if !ctl.owns(&namespace) || ctl.serves(&namespace).is_err() {
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
