//! The Kubernetes objects of a tenant's home identity, and the watch that keeps them
//! as made. The ServiceAccount lives in the service's own home namespace (one
//! namespace for every tenant, named per tenant by its namespace UID), out of reach
//! of anyone in the tenant namespace: they can neither read a token Secret of it nor
//! impersonate it, and no Pod of theirs can run as it. The tenant namespace holds only
//! a RoleBinding of the operator's chosen ClusterRole (default `admin`) to it.
//!
//! Earlier versions kept the ServiceAccount and a hand-made `*/*` Role in the tenant
//! namespace; the watch finds those (by the writer's label) and removes them, and
//! bindings whose `roleRef` is not the configured role are deleted and made again
//! (`roleRef` is immutable), so existing tenants converge.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::HomeSettings;
use crate::controller::{Controllers, ReconcileError, next_or_cancelled};

/// The RoleBinding the writer keeps in a tenant namespace (and, in earlier versions,
/// the ServiceAccount and Role of that name there).
pub const HOME_IDENTITY: &str = "gitops-service-argocd";
/// Field manager of the writer's server-side applies.
const FIELD_MANAGER: &str = "gitops-writer";
const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
const MANAGED_BY_VALUE: &str = "gitops-writer";
/// On a home ServiceAccount: the tenant namespace it acts in.
pub const TENANT_NAMESPACE_LABEL: &str = "managed-gitops.redhat.com/tenant-namespace";

/// The name of a tenant's home ServiceAccount (in the home namespace).
pub fn home_account_name(namespace_uid: Uuid) -> String {
    format!("home-{namespace_uid}")
}

fn meta(name: &str, namespace: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    let mut all = BTreeMap::from([(MANAGED_BY_LABEL.to_owned(), MANAGED_BY_VALUE.to_owned())]);
    all.extend(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(all),
        ..Default::default()
    }
}

/// The RoleBinding in the tenant namespace: the configured ClusterRole, in that
/// namespace only, to the tenant's home ServiceAccount.
pub fn home_binding(settings: &HomeSettings, namespace: &str, namespace_uid: Uuid) -> RoleBinding {
    RoleBinding {
        metadata: meta(HOME_IDENTITY, namespace, &[]),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_owned(),
            kind: "ClusterRole".to_owned(),
            name: settings.cluster_role.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: home_account_name(namespace_uid),
            namespace: Some(settings.namespace.clone()),
            ..Default::default()
        }]),
    }
}

fn kube_error(action: &'static str) -> impl FnOnce(kube::Error) -> ReconcileError {
    move |source| ReconcileError::Kube { action, source }
}

/// NotFound is what a delete wants.
fn deleted(result: Result<(), kube::Error>, action: &'static str) -> Result<(), ReconcileError> {
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::Kube { action, source }),
    }
}

/// Applies the ServiceAccount and the RoleBinding (server-side apply: idempotent, and
/// others' edits are overwritten); a binding to another role is deleted first, and
/// the objects of earlier versions in the tenant namespace are removed.
pub(super) async fn ensure_identity(
    kube: &kube::Client,
    settings: &HomeSettings,
    namespace: &str,
    namespace_uid: Uuid,
) -> Result<(), ReconcileError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let account_name = home_account_name(namespace_uid);
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), &settings.namespace);
    let account = ServiceAccount {
        metadata: meta(&account_name, &settings.namespace, &[(TENANT_NAMESPACE_LABEL, namespace)]),
        ..Default::default()
    };
    accounts
        .patch(&account_name, &params, &Patch::Apply(&typed(account, "v1", "ServiceAccount")))
        .await
        .map_err(kube_error("apply the home ServiceAccount"))?;
    let wanted = home_binding(settings, namespace, namespace_uid);
    let bindings: Api<RoleBinding> = Api::namespaced(kube.clone(), namespace);
    let existing = bindings.get_opt(HOME_IDENTITY).await.map_err(kube_error("read the home RoleBinding"))?;
    if existing.is_some_and(|b| b.role_ref != wanted.role_ref) {
        deleted(
            bindings.delete(HOME_IDENTITY, &DeleteParams::default()).await.map(drop),
            "replace the home RoleBinding",
        )?;
    }
    bindings
        .patch(HOME_IDENTITY, &params, &Patch::Apply(&typed(wanted, "rbac.authorization.k8s.io/v1", "RoleBinding")))
        .await
        .map_err(kube_error("apply the home RoleBinding"))?;
    remove_legacy(kube, namespace).await.map(drop)
}

/// Removes the ServiceAccount and `*/*` Role earlier versions made in the tenant
/// namespace: only objects of that name that carry the writer's label (a tenant's own
/// objects of that name are left alone), each deleted with its UID as precondition.
/// Returns whether anything was removed.
async fn remove_legacy(kube: &kube::Client, namespace: &str) -> Result<bool, ReconcileError> {
    let roles: Api<Role> = Api::namespaced(kube.clone(), namespace);
    let role = roles.get_opt(HOME_IDENTITY).await.map_err(kube_error("read an old home Role"))?;
    let mut removed = false;
    if let Some(role) = role.filter(|r| ours(&r.metadata)) {
        deleted(roles.delete(HOME_IDENTITY, &exactly(&role.metadata)).await.map(drop), "remove an old home Role")?;
        removed = true;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), namespace);
    let account = accounts.get_opt(HOME_IDENTITY).await.map_err(kube_error("read an old home ServiceAccount"))?;
    if let Some(account) = account.filter(|a| ours(&a.metadata)) {
        deleted(
            accounts.delete(HOME_IDENTITY, &exactly(&account.metadata)).await.map(drop),
            "remove an old home ServiceAccount",
        )?;
        removed = true;
    }
    Ok(removed)
}

/// Whether an object carries the writer's label.
fn ours(meta: &ObjectMeta) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).is_some_and(|v| v == MANAGED_BY_VALUE)
}

/// Delete this object and no other of its name.
fn exactly(meta: &ObjectMeta) -> DeleteParams {
    DeleteParams {
        preconditions: meta.uid.clone().map(|uid| kube::api::Preconditions { uid: Some(uid), resource_version: None }),
        ..Default::default()
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

/// A token of the tenant's home ServiceAccount and when it expires.
pub(super) async fn request_token(
    kube: &kube::Client,
    settings: &HomeSettings,
    namespace_uid: Uuid,
) -> Result<(String, SystemTime), ReconcileError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), &settings.namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(settings.token_lifetime.as_secs().max(600) as i64),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer: TokenRequest = accounts
        .create_subresource(
            "token",
            &home_account_name(namespace_uid),
            &PostParams::default(),
            &typed(request, "authentication.k8s.io/v1", "TokenRequest"),
        )
        .await
        .map_err(kube_error("request a home token"))?;
    let status = answer.status.ok_or(ReconcileError::Unexpected("the TokenRequest answer has no status"))?;
    let seconds = status.expiration_timestamp.0.as_second();
    let expires_at = UNIX_EPOCH + Duration::from_secs(u64::try_from(seconds).unwrap_or_default());
    Ok((status.token, expires_at))
}

/// Removes the identity of a tenant that was cleaned up: its ServiceAccounts in the
/// home namespace and, while the namespace still holds them, the binding there.
pub(crate) async fn remove_identity(
    kube: &kube::Client,
    settings: &HomeSettings,
    namespace: &str,
    namespace_uids: &[Uuid],
    in_namespace: bool,
) -> Result<(), ReconcileError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(kube.clone(), &settings.namespace);
    for uid in namespace_uids {
        deleted(
            accounts.delete(&home_account_name(*uid), &DeleteParams::default()).await.map(drop),
            "remove a home ServiceAccount",
        )?;
    }
    if in_namespace {
        let bindings: Api<RoleBinding> = Api::namespaced(kube.clone(), namespace);
        deleted(
            bindings.delete(HOME_IDENTITY, &DeleteParams::default()).await.map(drop),
            "remove the home RoleBinding",
        )?;
        remove_legacy(kube, namespace).await?;
    }
    Ok(())
}

/// Watches the writer's ServiceAccounts, Roles and RoleBindings (by their
/// managed-by label), listings included, so a restart with a new configuration
/// converges: objects of earlier versions are removed; a binding that is gone,
/// changed, or refers to another role than the configured one, and a home
/// ServiceAccount that was deleted, are made again (with a new token: the old one
/// stops working with its ServiceAccount). A binding in a reserved namespace is
/// removed, never made again.
pub(crate) async fn watch_identity(ctl: Arc<Controllers>, scope: Option<String>, cancel: CancellationToken) {
    let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}");
    let config = watcher::Config::default().labels(&selector);
    let kube = ctl.ctx.kube.clone();
    let home_namespace = ctl.ctx.home.namespace.clone();
    // Home ServiceAccounts live in the home namespace, whatever the scope.
    let accounts: Api<ServiceAccount> = match &scope {
        Some(_) => Api::namespaced(kube.clone(), &home_namespace),
        None => Api::all(kube.clone()),
    };
    let (roles, bindings): (Api<Role>, Api<RoleBinding>) = match &scope {
        Some(namespace) => (Api::namespaced(kube.clone(), namespace), Api::namespaced(kube.clone(), namespace)),
        None => (Api::all(kube.clone()), Api::all(kube.clone())),
    };
    let accounts =
        watcher::watcher(accounts, config.clone()).default_backoff().map_ok(|e| (0, wrap(e, Identity::Account)));
    let roles = watcher::watcher(roles, config.clone()).default_backoff().map_ok(|e| (1, wrap(e, Identity::Role)));
    let bindings = watcher::watcher(bindings, config).default_backoff().map_ok(|e| (2, wrap(e, Identity::Binding)));
    let mut events = futures_util::stream::select_all([accounts.boxed(), roles.boxed(), bindings.boxed()]);
    let mut known: [Known; 3] = Default::default();
    while let Some(event) = next_or_cancelled(&mut events, &cancel).await {
        let (kind, event) = match event {
            Ok(change) => change,
            Err(error) => {
                tracing::warn!(%error, "home identity watch failed; retrying");
                continue;
            }
        };
        if matches!(event, watcher::Event::Init) && known[kind].listed {
            ctl.ctx.metrics.home_identity_relists.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for (object, deleted) in known[kind].seen(event) {
            if let Err(error) = look_at(&ctl, &object, deleted).await {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not repair a home identity; retrying at the next event or reconcile");
            }
        }
    }
}

/// A watch event of one kind as an event of the identity's objects.
fn wrap<K>(event: watcher::Event<K>, identity: fn(K) -> Identity) -> watcher::Event<Identity> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(identity(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(identity(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(identity(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// The objects of one kind a watch has shown, so that a re-list (after the watch
/// fell out of the API server's history, `410 Gone`) reports the objects deleted
/// during the gap, which no event of the new listing names.
#[derive(Default)]
struct Known {
    objects: std::collections::HashMap<(String, String), Identity>,
    /// While a listing runs: the objects it has shown so far.
    listing: Option<std::collections::HashSet<(String, String)>>,
    /// Whether a listing has completed (the next one is a re-list).
    listed: bool,
}

impl Known {
    /// What an event means: objects present (`false`) or deleted (`true`). The end
    /// of a listing reports every object known before it and absent from it as deleted.
    fn seen(&mut self, event: watcher::Event<Identity>) -> Vec<(Identity, bool)> {
        match event {
            watcher::Event::Init => {
                self.listing = Some(std::collections::HashSet::new());
                Vec::new()
            }
            watcher::Event::InitApply(object) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(object.key());
                }
                self.objects.insert(object.key(), object.remembered());
                vec![(object, false)]
            }
            watcher::Event::InitDone => {
                self.listed = true;
                let Some(listing) = self.listing.take() else { return Vec::new() };
                let gone: Vec<(String, String)> =
                    self.objects.keys().filter(|key| !listing.contains(*key)).cloned().collect();
                gone.into_iter().filter_map(|key| self.objects.remove(&key)).map(|object| (object, true)).collect()
            }
            watcher::Event::Apply(object) => {
                self.objects.insert(object.key(), object.remembered());
                vec![(object, false)]
            }
            watcher::Event::Delete(object) => {
                self.objects.remove(&object.key());
                vec![(object, true)]
            }
        }
    }
}

async fn look_at(ctl: &Arc<Controllers>, object: &Identity, deleted: bool) -> Result<(), ReconcileError> {
    let settings = &ctl.ctx.home;
    let namespace = object.namespace();
    match object {
        Identity::Account(account) if namespace == settings.namespace => {
            let tenant = account
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(TENANT_NAMESPACE_LABEL))
                .cloned()
                .unwrap_or_default();
            if deleted && !tenant.is_empty() {
                tracing::info!(tenant.ns = %tenant, "home ServiceAccount deleted under the writer; making it again");
                ctl.home_damaged(&tenant);
            }
        }
        Identity::Account(_) | Identity::Role(_) => {
            // Objects of earlier versions in a tenant namespace.
            // Every writer may: the removal is idempotent, and shards may not be owned yet.
            if !deleted && object.name() == HOME_IDENTITY && remove_legacy(&ctl.ctx.kube, namespace).await? {
                tracing::info!(tenant.ns = %namespace, "removed a home identity object of an earlier version");
                ctl.home_damaged(namespace);
            }
        }
        Identity::Binding(binding) => {
            if object.name() != HOME_IDENTITY {
                return Ok(());
            }
            if !deleted && ctl.reserved(namespace) {
                tracing::warn!(tenant.ns = %namespace, "removing the home RoleBinding of a reserved namespace");
                let bindings: Api<RoleBinding> = Api::namespaced(ctl.ctx.kube.clone(), namespace);
                return deleted_ok(bindings.delete(HOME_IDENTITY, &DeleteParams::default()).await.map(drop));
            }
            let as_made = binding.role_ref.kind == "ClusterRole"
                && binding.role_ref.name == settings.cluster_role
                && binding.subjects.as_ref().is_some_and(|s| {
                    s.len() == 1
                        && s[0].kind == "ServiceAccount"
                        && s[0].namespace.as_deref() == Some(settings.namespace.as_str())
                        && match ctl.namespace_uid_cached(namespace) {
                            Some(uid) => s[0].name == home_account_name(uid),
                            None => s[0].name.starts_with("home-"),
                        }
                });
            if deleted || !as_made {
                tracing::info!(tenant.ns = %namespace, deleted, "home RoleBinding gone or changed; making it again");
                ctl.home_damaged(namespace);
            }
        }
    }
    Ok(())
}

fn deleted_ok(result: Result<(), kube::Error>) -> Result<(), ReconcileError> {
    deleted(result, "remove a home RoleBinding")
}

/// One object of a home identity, as its watcher saw it.
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

    fn key(&self) -> (String, String) {
        (self.namespace().to_owned(), self.name().to_owned())
    }

    /// The copy kept to report a deletion noticed at a re-list: what [`look_at`]
    /// reads of a deleted object (name, namespace, labels), nothing more.
    fn remembered(&self) -> Identity {
        let meta = ObjectMeta {
            name: self.meta().name.clone(),
            namespace: self.meta().namespace.clone(),
            labels: self.meta().labels.clone(),
            ..ObjectMeta::default()
        };
        match self {
            Identity::Account(_) => Identity::Account(ServiceAccount { metadata: meta, ..ServiceAccount::default() }),
            Identity::Role(_) => Identity::Role(Role { metadata: meta, ..Role::default() }),
            Identity::Binding(binding) => {
                Identity::Binding(RoleBinding { metadata: meta, role_ref: binding.role_ref.clone(), subjects: None })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(namespace: &str) -> Identity {
        let mut binding = RoleBinding::default();
        binding.metadata.name = Some(HOME_IDENTITY.into());
        binding.metadata.namespace = Some(namespace.into());
        binding.metadata.resource_version = Some("7".into());
        Identity::Binding(binding)
    }

    fn account(tenant: &str) -> Identity {
        let mut account = ServiceAccount::default();
        account.metadata.name = Some(format!("home-{tenant}"));
        account.metadata.namespace = Some("gitops-home".into());
        account.metadata.labels = Some(BTreeMap::from([(TENANT_NAMESPACE_LABEL.to_owned(), tenant.to_owned())]));
        Identity::Account(account)
    }

    fn names(changes: &[(Identity, bool)]) -> Vec<(String, bool)> {
        changes.iter().map(|(object, deleted)| (object.namespace().to_owned(), *deleted)).collect()
    }

    #[test]
    fn a_relist_reports_the_objects_deleted_while_the_watch_was_away() {
        let mut known = Known::default();
        assert!(known.seen(watcher::Event::Init).is_empty());
        assert_eq!(names(&known.seen(watcher::Event::InitApply(binding("team-a")))), [("team-a".into(), false)]);
        known.seen(watcher::Event::InitApply(binding("team-b")));
        known.seen(watcher::Event::InitApply(binding("team-c")));
        assert!(known.seen(watcher::Event::InitDone).is_empty(), "the first listing deletes nothing");
        assert!(known.listed, "the next listing is a re-list");
        assert_eq!(names(&known.seen(watcher::Event::Delete(binding("team-c")))), [("team-c".into(), true)]);
        known.seen(watcher::Event::Apply(binding("team-d")));

        // The watch fell out of the history: team-b's binding was deleted in the gap.
        known.seen(watcher::Event::Init);
        known.seen(watcher::Event::InitApply(binding("team-a")));
        known.seen(watcher::Event::InitApply(binding("team-d")));
        assert_eq!(names(&known.seen(watcher::Event::InitDone)), [("team-b".into(), true)]);
        // And it is reported once.
        known.seen(watcher::Event::Init);
        known.seen(watcher::Event::InitApply(binding("team-a")));
        known.seen(watcher::Event::InitApply(binding("team-d")));
        assert!(known.seen(watcher::Event::InitDone).is_empty());
    }

    #[test]
    fn a_deleted_account_noticed_at_a_relist_still_names_its_tenant() {
        let mut known = Known::default();
        known.seen(watcher::Event::Init);
        known.seen(watcher::Event::InitApply(account("team-a")));
        known.seen(watcher::Event::InitDone);
        known.seen(watcher::Event::Init);
        let gone = known.seen(watcher::Event::InitDone);
        let [(Identity::Account(account), true)] = gone.as_slice() else { panic!("one deleted account") };
        let labels = account.metadata.labels.as_ref().expect("labels kept");
        assert_eq!(labels.get(TENANT_NAMESPACE_LABEL).map(String::as_str), Some("team-a"));
        assert_eq!(account.metadata.resource_version, None, "only what a deletion needs is kept");
    }

    #[test]
    fn the_binding_grants_the_configured_cluster_role_to_an_account_outside_the_tenant_namespace() {
        let settings =
            HomeSettings { cluster_role: "edit".into(), namespace: "gitops-home".into(), ..Default::default() };
        let uid = Uuid::nil();
        let binding = home_binding(&settings, "team-a", uid);
        assert_eq!(binding.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!((binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()), ("ClusterRole", "edit"));
        let subjects = binding.subjects.expect("subjects");
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].namespace.as_deref(), Some("gitops-home"));
        assert_eq!(subjects[0].name, home_account_name(uid));
        assert!(home_account_name(uid).len() <= 63);
    }
}
