//! What every part of a running writer shares: the database pool, the Kubernetes
//! client, the encryption keys, this writer's identity (the shard leases are held in
//! its name) and its metrics. Built once by `run` and passed around in an `Arc`.

use std::sync::Arc;

use gitops_shared::crypto::SecretBox;
use gitops_shared::db::DbPool;

use crate::controller::connection::ConnectionPolicy;
use crate::controller::{HomeSettings, HomeStatus};
use crate::metrics::WriterMetrics;
use crate::tenancy::ServedNamespaces;
use crate::work_queue::WorkQueue;

/// The shared state of one running writer.
#[derive(Clone)]
pub struct WriterContext {
    pub pool: DbPool,
    pub kube: kube::Client,
    pub secrets: SecretBox,
    /// Names this writer in `writer_shard.owner`; unique per process.
    pub writer_id: String,
    pub metrics: Arc<WriterMetrics>,
    /// How Argo CD reaches tenants' own namespaces.
    pub home: HomeSettings,
    /// The controllers' work queue; the status loop wakes deletions through it.
    pub queue: WorkQueue,
    /// Where environment connection checks may go; `None`: checks are off.
    pub connection_check: Option<ConnectionPolicy>,
    /// Repository credential validation; `None`: off.
    pub repository_check: Option<crate::controller::repository_check::RepositoryCheckSettings>,
    /// Whether environments may aim the engine at loopback, link-local or cloud
    /// metadata addresses (`--api-url-allow-private`).
    pub api_url_allow_private: bool,
    /// Which namespaces are tenants.
    pub served: Arc<ServedNamespaces>,
    /// Whether the home role and namespace exist (and the role's rules).
    pub home_status: Arc<HomeStatus>,
    /// The operator's opt-out: home deployments are accepted without an approval
    /// of the admission webhook (without knowing who asked).
    pub allow_unverified_home: bool,
    /// The AppStudio layer's username (`--appstudio-identity`): its home
    /// deployments are approved when a binding its own webhook checked owns them.
    pub appstudio_identity: Option<String>,
    /// Kubernetes Events on the tenant resources.
    pub events: Arc<crate::events::TenantEvents>,
}
