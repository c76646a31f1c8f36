//! The Argo CD stand-in: a plain kube controller that behaves like Argo CD's
//! application controller for what the service reads and writes, so the agent can
//! be tested (and the quickstart run) against any API server — the emulator or a
//! real cluster — without Argo CD. Library: [`run`]; binary: `argocd-standin`.
//!
//! # What it does, per Application in its namespace
//! - **Project checks.** `spec.project` (empty: `default`) must name an AppProject
//!   in the same namespace that permits the source (`sourceRepos`) and the
//!   destination (`destinations` server/name + namespace); `*`/`?` globs and `!`
//!   deny patterns as in Argo CD (see `project`). Otherwise condition
//!   `InvalidSpecError` with Argo CD's message, sync and health `Unknown`.
//! - **Status** (on the main resource — Argo CD's CRD has no status subresource —
//!   as one JSON merge patch, only when something changed): `sync` (`status`,
//!   `revision`: a fake 40-hex commit from repoURL + path + revision, see
//!   [`fake_revision`], or the branch's head when a test set one, see below;
//!   `comparedTo`), `health`, `resources` (one Deployment named
//!   after the last path segment), `reconciledAt`, `sourceType: Directory`,
//!   `controllerNamespace`, `conditions`, `history` after each successful sync. A
//!   valid manual Application is `OutOfSync` and `Healthy` until its first
//!   successful sync, then `Synced` at the last synced revision.
//! - **Cluster-scoped resources.** An Application whose path's last segment begins
//!   with `cluster-` deploys a `rbac.authorization.k8s.io` ClusterRole instead of a
//!   Deployment. Its syncs fail as Argo CD's do unless its project's
//!   `clusterResourceWhitelist` (less `clusterResourceBlacklist`) permits that kind:
//!   `Failed`, "one or more synchronization tasks are not valid", the resource's
//!   result saying `resource rbac.authorization.k8s.io:ClusterRole is not permitted
//!   in project …` (retried under a retry strategy like any failed attempt).
//! - **Repository credentials.** A repository named by a repository Secret of the
//!   namespace counts as private; an Application of it reads it only through a
//!   Secret whose `project` is the Application's (or that has none). Otherwise the
//!   comparison fails: condition `ComparisonError` (`Failed to load target state: …
//!   authentication required …`), sync `Unknown` (see `repository`).
//! - **Destination.** A destination whose API URL is on loopback is probed (a TCP
//!   connect, cached per server for a few seconds); one that does not answer makes
//!   the comparison fail as in Argo CD: condition `ComparisonError` (`Failed to load
//!   live state: …`), sync and health `Unknown`, running syncs fail, and it is looked
//!   at again until it answers. Other hosts are never contacted: they answer unless
//!   the `destination` knob says otherwise.
//! - **Operations.** `.operation.sync` → `status.operationState` `Running` (with
//!   `startedAt`, `operation` copied, `info[]` included), then `Succeeded`
//!   (`finishedAt`, `syncResult.revision`, message `successfully synced (all tasks
//!   run)`) with `.operation` cleared in the same write. A client setting
//!   `status.operationState.phase: Terminating` gets `Failed`, "Operation
//!   terminated". Automated Applications (`spec.syncPolicy.automated`) get an
//!   operation initiated by the controller (`initiatedBy.automated: true`, with the
//!   Application's `spec.syncPolicy.retry`) once per target revision, and stay
//!   `OutOfSync` until it succeeded. A failed attempt of an operation with a retry
//!   strategy stays `Running` (`retryCount`, a message saying when) and is tried
//!   again after its backoff, until its limit; without one a failure is final.
//! - **Refresh.** `argocd.argoproj.io/refresh` is removed and `reconciledAt`
//!   updated; `reconciledAt` is also refreshed every `resync` (Argo CD: 180 s).
//! - **Deletion.** With `deletionTimestamp`, `resources-finalizer.argocd.argoproj.io`
//!   (or its `/background`, `/foreground` forms) is removed after "pruning"
//!   (nothing is deployed); other finalizers stay.
//! - Conflicts (409) re-read the object and retry; NotFound is ignored; odd
//!   objects are read leniently and never panic; logs are structured `tracing`.
//!
//! # Test knobs (annotations on the Application)
//! | annotation | value | effect |
//! | --- | --- | --- |
//! | `standin.gitops.test/health` | `Healthy`, `Progressing`, `Degraded`, `Suspended`, `Missing`, `Unknown` | `status.health.status` (and the resource's health); a message is made up for `Degraded`/`Progressing` |
//! | `standin.gitops.test/health-message` | text | `status.health.message` |
//! | `standin.gitops.test/comparison-error` | text | condition `ComparisonError` with that message, sync `Unknown`; running syncs fail |
//! | `standin.gitops.test/sync` | `fail` | sync `OutOfSync`; every sync operation ends `Failed` (automated: one attempt per revision, then condition `SyncError`) |
//! | `standin.gitops.test/sync` | `hold` | sync operations stay `Running` until the value changes (e.g. to `release`) or the annotation goes; `Terminating` still ends them |
//! | `standin.gitops.test/sync-message` | text | message of a failed sync |
//! | `standin.gitops.test/destination` | `unreachable` | a destination off loopback does not answer (as above); `reachable` (default) |
//! | `standin.gitops.test/finalizer` | `hang` | the resources finalizer is never removed; condition `DeletionError` says why; removing the annotation releases it |
//!
//! Unknown knob values are ignored with a warning.
//!
//! # Branch heads (a ConfigMap in the stand-in's namespace)
//! A test playing whoever pushes to a repository moves a branch with a ConfigMap
//! labelled [`HEAD_LABEL`] (`standin.gitops.test/head`, any value) whose data says
//! `url` (the repository, compared as project rules compare it: case, a trailing
//! `/` and `.git` do not matter), `branch` (matched with the Application's
//! `targetRevision` as written; empty or absent: `HEAD`) and `commit` (40 hex
//! digits). Every Application of that repository and branch, whatever its path,
//! resolves the branch to `commit` (`status.sync.revision`, the revision of its
//! syncs). Changing `commit` is a push: automated Applications are `OutOfSync` at
//! the new commit while the controller's sync runs, then `Synced` there; manual
//! ones are `OutOfSync` at it until a sync. [`push_head`] applies the ConfigMap
//! (named by [`head_name`]); deleting it returns the branch to its made-up commit.
//! Of two ConfigMaps for one branch the first by name wins; one that does not say a
//! head is ignored with a warning; a ConfigMap whose `url` is changed to another
//! repository leaves the first repository's Applications alone until they are
//! looked at again (delete it and make another instead). Without such a ConfigMap
//! nothing changes. A ConfigMap rather than an annotation: a head belongs to a
//! repository, not to one Application, and it works the same on any API server
//! (the stand-in lists and watches ConfigMaps of its namespace by that label).

mod application;
mod controller;
mod crds;
mod destination;
mod heads;
mod install;
mod knobs;
pub mod live;
mod loop_guard;
mod operation;
pub mod operator;
mod project;
mod project_index;
mod repository;
mod retry;
mod revision;
mod status;

#[cfg(test)]
pub(crate) mod live_tests;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use tokio_util::sync::CancellationToken;

pub use application::str_at;
pub use controller::{FIELD_MANAGER, RESOURCES_FINALIZER, ReconcileError, app_project_resource, application_resource};
pub use crds::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, app_project_crd, application_crd};
pub use heads::{HEAD_LABEL, head_name, push as push_head};
pub use install::{CrdOutcome, ForeignCrds, install_crds};
pub use knobs::{
    COMPARISON_ERROR as COMPARISON_ERROR_KNOB, DESTINATION as DESTINATION_KNOB, FINALIZER as FINALIZER_KNOB,
    HEALTH as HEALTH_KNOB,
};
pub use knobs::{HEALTH_MESSAGE as HEALTH_MESSAGE_KNOB, SYNC as SYNC_KNOB, SYNC_MESSAGE as SYNC_MESSAGE_KNOB};
pub use operation::{SUCCEEDED_MESSAGE, TERMINATED_MESSAGE};
pub use project::{INVALID_SPEC_ERROR, NOT_VALID_MESSAGE, glob_match};
pub use revision::fake_revision;
pub use status::CLUSTER_SCOPED_PATH_PREFIX;
pub use status::{COMPARISON_ERROR, DELETION_ERROR, REFRESH_ANNOTATION, SYNC_ERROR};

/// Tuning of the stand-in; the defaults are Argo CD's.
#[derive(Debug, Clone)]
pub struct StandinOptions {
    /// Argo CD's `timeout.reconciliation`: an unchanged Application is
    /// re-reconciled (and `reconciledAt` refreshed) this often. Zero: never.
    pub resync: Duration,
    /// Applications reconciled at once (0: unbounded).
    pub concurrency: u16,
    /// Model what Applications deploy (see [`live`]): a tracked object per synced
    /// Application in its destination namespace, pruned only under the resources
    /// finalizer. Off by default (it costs a write per Application).
    pub live_resources: bool,
    /// The Argo CD version the stand-in plays, published as Argo CD's is: the image
    /// tag of the `argocd-application-controller` StatefulSet in its namespace.
    pub version: String,
    /// A knob for the whole instance: every Application reports this health (as the
    /// `standin.gitops.test/health` annotation would, which wins), so an instance
    /// whose Argo CD breaks what it adopts can be played (annotations do not survive
    /// a move to another instance; this does not move with them).
    pub health: Option<String>,
}

/// The version a stand-in plays unless told otherwise.
pub const DEFAULT_VERSION: &str = "v2.14.2";

impl Default for StandinOptions {
    fn default() -> Self {
        StandinOptions {
            resync: Duration::from_secs(180),
            concurrency: 8,
            live_resources: false,
            version: DEFAULT_VERSION.to_owned(),
            health: None,
        }
    }
}

/// Errors of the stand-in's setup; per-Application failures are logged and retried.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    #[error("list {kind}s in namespace {namespace} (are the argoproj.io CRDs installed? try --install-crds)")]
    NotServed {
        kind: &'static str,
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action} CustomResourceDefinition {name}")]
    Crd {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("wait for CustomResourceDefinition {name} to be established")]
    CrdWait {
        name: String,
        #[source]
        source: kube::runtime::wait::Error,
    },
    #[error("CustomResourceDefinition {name} not established within {timeout:?}")]
    CrdNotEstablished { name: String, timeout: Duration },
    #[error("read kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("build a Kubernetes client from kubeconfig {path}")]
    Client {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
}

/// Runs the stand-in over the Applications of `namespace` until `cancel` fires.
/// Fails at once when the Application or AppProject CRD is not served there.
pub async fn run(
    client: Client,
    namespace: &str,
    options: StandinOptions,
    cancel: CancellationToken,
) -> Result<(), StandinError> {
    controller::run_controller(client, namespace, options, cancel).await
}

/// A client for the current context of the kubeconfig at `path`.
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client, StandinError> {
    let kubeconfig =
        Kubeconfig::read_from(path).map_err(|source| StandinError::Kubeconfig { path: path.to_owned(), source })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| StandinError::Kubeconfig { path: path.to_owned(), source })?;
    Client::try_from(config).map_err(|source| StandinError::Client { path: path.to_owned(), source })
}
