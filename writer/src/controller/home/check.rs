//! Whether the writer can make home identities as configured: the ClusterRole it
//! binds exists, and so does the namespace of the home ServiceAccounts. Without
//! them it binds nothing, says so in `/readyz`, and home deployments wait with a
//! condition. It also keeps the role's rules: the admission webhook checks
//! requesters against them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::HomeSettings;

/// What the last check found.
#[derive(Debug, Default)]
pub struct HomeStatus {
    checked: AtomicBool,
    problem: Mutex<Option<String>>,
    role: Mutex<Option<ClusterRole>>,
}

impl HomeStatus {
    pub fn new() -> Arc<HomeStatus> {
        Arc::new(HomeStatus::default())
    }

    /// Why home identities cannot be made now (None: they can). Before the first
    /// check: not yet known, which counts as a problem.
    pub fn problem(&self) -> Option<String> {
        if !self.checked.load(Ordering::Acquire) {
            return Some("the home role has not been checked yet".to_owned());
        }
        self.problem.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The configured ClusterRole as last read.
    pub fn role(&self) -> Option<ClusterRole> {
        self.role.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn record(&self, problem: Option<String>, role: Option<ClusterRole>) {
        *self.problem.lock().unwrap_or_else(PoisonError::into_inner) = problem;
        *self.role.lock().unwrap_or_else(PoisonError::into_inner) = role;
        self.checked.store(true, Ordering::Release);
    }
}

/// One check, recorded in `status` (logged when what it found changed).
pub async fn check_once(kube: &kube::Client, settings: &HomeSettings, status: &HomeStatus) {
    let roles: Api<ClusterRole> = Api::all(kube.clone());
    let namespaces: Api<Namespace> = Api::all(kube.clone());
    let (role, problem) = match roles.get_opt(&settings.cluster_role).await {
        Ok(Some(role)) => match namespaces.get_opt(&settings.namespace).await {
            Ok(Some(_)) => (Some(role), None),
            Ok(None) => (Some(role), Some(format!("the home namespace {:?} does not exist", settings.namespace))),
            Err(error) => {
                (Some(role), Some(format!("could not read the home namespace {:?}: {error}", settings.namespace)))
            }
        },
        Ok(None) => (None, Some(format!("the home ClusterRole {:?} does not exist", settings.cluster_role))),
        Err(error) => (None, Some(format!("could not read the home ClusterRole {:?}: {error}", settings.cluster_role))),
    };
    let before = status.problem.lock().unwrap_or_else(PoisonError::into_inner).clone();
    if before != problem || !status.checked.load(Ordering::Acquire) {
        match &problem {
            Some(problem) => tracing::error!(%problem, "home identities cannot be made; home deployments wait"),
            None => {
                tracing::info!(role = %settings.cluster_role, namespace = %settings.namespace, "home role and namespace present")
            }
        }
    }
    status.record(problem, role);
}

/// Checks every `every` (after the first check, which `run` makes before the
/// controllers start) until `cancel`.
pub async fn check_loop(
    kube: kube::Client,
    settings: HomeSettings,
    status: Arc<HomeStatus>,
    every: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        check_once(&kube, &settings, &status).await;
    }
}
