//! Automatic scale-up (off by default): at each look of the fleet watch, when the
//! free slots of the instances open to placement fall below the threshold, the
//! writer provisions the next instance itself (`crate::provision`, as `gitopsctl
//! instance provision` does), named `<prefix>-<n>` and registered with the
//! configured host cluster, so agents started with `--host-cluster` serve it
//! without a new Deployment. At most one scale-up runs in the whole fleet: the
//! attempt is a row of `instance_scale_up` that only one writer can insert while
//! another is provisioning; its writer renews it while it waits for the operator
//! and ends it as completed or failed (with the reason), and a writer that stopped
//! midway leaves it to expire. The attempt after a failed one tries the same name
//! again (provisioning picks up the namespace it made), so a failure leaves nothing
//! behind on the cluster that a later attempt does not complete. Logs, the `gitops_writer_scale_up*` metrics and
//! `gitopsctl instance list` say what happened.
//!
//! The writer then needs, on the host cluster: create and patch namespaces, Roles
//! and RoleBindings (and the agents' rights it grants in them) and `argocds` of
//! `argoproj.io` (ops/deploy/components/scale-up).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_shared::db::engine_instance::ProvisionedBy;
use gitops_shared::db::instance_scale_up::{
    fleet_free_capacity, scale_up_begin, scale_up_finish, scale_up_renew, scale_up_retryable,
};
use gitops_shared::db::{DbError, DbPool, pooled};
use tokio::task::JoinHandle;

use crate::metrics::WriterMetrics;
use crate::provision::{ProvisionRequest, provision, provisioned_instance};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

/// How long an attempt stays a writer's without renewal (renewed every third of it).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// What the automatic scale-up makes, and when.
#[derive(Debug, Clone)]
pub struct ScaleUpSettings {
    /// Scale up when the open instances' free slots (tenants) fall below this.
    pub below_free: i64,
    /// New instances are named `<prefix>-<n>` (their namespace too).
    pub name_prefix: String,
    pub capacity: i32,
    /// The Argo CD version (None: the operator's).
    pub version: Option<String>,
    /// The host cluster the new instances are registered with.
    pub host_cluster: Option<String>,
    /// The agents' ServiceAccounts (`namespace/name`) bound in the new namespace.
    pub agents: Vec<String>,
    /// How long to wait for the operator to report an instance Available.
    pub wait: Duration,
    /// How long an attempt stays this writer's without renewal.
    pub lease: Duration,
}

/// The scale-up of one writer: its attempt in progress, if any.
pub struct ScaleUp {
    pub settings: ScaleUpSettings,
    pub kube: kube::Client,
    /// This writer's name in the attempt row.
    pub holder: String,
    pub running: Option<JoinHandle<()>>,
}

impl ScaleUp {
    /// One look: starts an attempt when the fleet needs one and none runs.
    pub async fn step(&mut self, pool: &DbPool, metrics: &Arc<WriterMetrics>) -> Result<(), DbError> {
        if self.running.as_ref().is_some_and(|task| !task.is_finished()) {
            return Ok(());
        }
        self.running = None;
        let mut client = pooled(pool).await?;
        let free = fleet_free_capacity(&client).await?;
        metrics.fleet_free_capacity.store(free.free, Ordering::Relaxed);
        if free.free >= self.settings.below_free {
            return Ok(());
        }
        let settings = &self.settings;
        let retry = self.retry_name(&client).await?;
        let (prefix, below) = (&settings.name_prefix, settings.below_free);
        let Some((id, name)) =
            scale_up_begin(&mut client, prefix, retry.as_deref(), &self.holder, below, settings.lease).await?
        else {
            tracing::debug!("the fleet was short of room; another scale-up is in progress or has just made room");
            return Ok(());
        };
        tracing::warn!(free = free.free, threshold = settings.below_free, engine.instance = %name,
            "the fleet's free capacity is below the scale-up threshold: provisioning the next instance");
        metrics.scale_up_in_progress.store(true, Ordering::Relaxed);
        let attempt = Attempt {
            pool: pool.clone(),
            kube: self.kube.clone(),
            settings: self.settings.clone(),
            holder: self.holder.clone(),
            id,
            name,
            metrics: metrics.clone(),
        };
        self.running = Some(tokio::spawn(attempt.run()));
        Ok(())
    }
}

impl ScaleUp {
    /// The failed attempt's name to try again, when there is one and its namespace
    /// is absent or the one provisioning made for it: the next attempt then completes
    /// what the failed one left on the cluster rather than leaving it behind. A name
    /// whose namespace belongs to something else is not tried again.
    async fn retry_name(&self, client: &tokio_postgres::Client) -> Result<Option<String>, DbError> {
        let Some(name) = scale_up_retryable(client).await? else { return Ok(None) };
        let namespaces: Api<Namespace> = Api::all(self.kube.clone());
        match namespaces.get_opt(&name).await {
            Ok(None) => Ok(Some(name)),
            Ok(Some(namespace)) if provisioned_instance(&namespace) == Some(name.as_str()) => Ok(Some(name)),
            Ok(Some(_)) => Ok(None),
            Err(error) => {
                tracing::warn!(%error, engine.instance = %name, "could not read the namespace of the failed scale-up");
                Ok(None)
            }
        }
    }
}

/// One scale-up attempt, run beside the fleet watch.
struct Attempt {
    pool: DbPool,
    kube: kube::Client,
    settings: ScaleUpSettings,
    holder: String,
    id: i64,
    name: String,
    metrics: Arc<WriterMetrics>,
}

impl Attempt {
    async fn run(self) {
        let request = ProvisionRequest {
            name: self.name.clone(),
            namespace: None,
            version: self.settings.version.clone(),
            capacity: self.settings.capacity,
            agents: self.settings.agents.clone(),
            wait: self.settings.wait,
            host_cluster: self.settings.host_cluster.clone(),
            provisioned_by: ProvisionedBy::ScaleUp,
        };
        let made = async {
            let client = pooled(&self.pool).await.map_err(|e| e.to_string())?;
            provision(&client, self.kube.clone(), &request).await.map_err(|e| error_text(&e))
        };
        let outcome = tokio::select! {
            outcome = made => outcome,
            lost = self.renew() => Err(lost),
        };
        let finished = async {
            let client = pooled(&self.pool).await?;
            scale_up_finish(&client, self.id, &self.holder, outcome.as_ref().err().map(String::as_str)).await
        }
        .await;
        self.metrics.scale_up_in_progress.store(false, Ordering::Relaxed);
        match &outcome {
            Ok(id) => {
                self.metrics.scale_ups[0].fetch_add(1, Ordering::Relaxed);
                tracing::warn!(engine.instance = %self.name, instance.id = %id, "scale-up: instance provisioned and registered");
            }
            Err(error) => {
                self.metrics.scale_ups[1].fetch_add(1, Ordering::Relaxed);
                tracing::error!(engine.instance = %self.name, %error, "scale-up failed; tried again at a later look");
            }
        }
        if let Err(error) = finished {
            tracing::warn!(%error, "could not record the scale-up's end; it expires by itself");
        }
    }

    /// Renews the attempt until it is no longer this writer's; returns why.
    async fn renew(&self) -> String {
        let every = (self.settings.lease / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(every).await;
            let renewed = async {
                let client = pooled(&self.pool).await?;
                scale_up_renew(&client, self.id, &self.holder, self.settings.lease).await
            }
            .await;
            match renewed {
                Ok(true) => {}
                Ok(false) => return "the attempt expired before it finished".to_owned(),
                Err(error) => tracing::warn!(%error, "could not renew the scale-up"),
            }
        }
    }
}

fn error_text(error: &crate::provision::ProvisionError) -> String {
    gitops_shared::telemetry::error_chain(error)
}
