//! The writer's end-to-end ground, shared by the writer's test files: the Argo CD
//! stand-in over a namespace of its own, an agent serving it (its heartbeat seen), a
//! tenant namespace and the service's home namespace; writers start in-process with
//! `writer`/`writer_for`, configured as a test wants.

use std::time::Duration;

use gitops_agent::engine::argocd::application_resource;
use gitops_agent::names;
use gitops_agent::{AgentConfig, run_agent};
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_testkit::TestDb;
use gitops_testkit::argocd::{self, StandinOptions, app_project_crd, application_crd};
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use gitops_writer::api::{GitOpsDeployment, GitOpsDeploymentSyncRun, crds};
use gitops_writer::controller::CONDITION;
use gitops_writer::run::{WriterConfig, run_writer};
use gitops_writer::shard::ShardConfig;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use super::eventually;

pub(crate) const INSTANCE: &str = "argocd-1";

/// Stand-in, agent (heartbeat seen) and a tenant namespace; writers start with
/// `writer`/`writer_for`. Shared with `writer_credentials`.
pub(crate) struct Env {
    pub(crate) db: TestDb,
    pub(crate) client: Client,
    pub(crate) kube: kube::Client,
    pub(crate) kubeconfig: std::path::PathBuf,
    pub(crate) argocd: TestNamespace,
    pub(crate) tenant: TestNamespace,
    /// The service's namespace of home ServiceAccounts (one per test).
    pub(crate) home: TestNamespace,
    pub(crate) secrets: SecretBox,
    pub(crate) cancel: CancellationToken,
    /// How this environment's stand-ins run (another instance's too).
    pub(crate) standin: StandinOptions,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(crate) async fn env(purpose: &str) -> Env {
    env_with(purpose, StandinOptions::default()).await
}

/// An environment whose stand-ins model what Applications deploy (see
/// `gitops_testkit::argocd::live`).
pub(crate) async fn env_live(purpose: &str) -> Env {
    env_with(purpose, StandinOptions { live_resources: true, ..StandinOptions::default() }).await
}

async fn env_with(purpose: &str, standin: StandinOptions) -> Env {
    let cluster = TestCluster::get().await;
    let mut all = crds();
    all.push(application_crd());
    all.push(app_project_crd());
    cluster.install_crds(all).await.expect("install the CRDs");
    let argocd_ns = cluster.namespace(&format!("{purpose}-argo")).await;
    let tenant = cluster.namespace(purpose).await;
    let home = cluster.namespace(&format!("{purpose}-home")).await;
    let kube = cluster.admin().await;
    let cancel = CancellationToken::new();
    tokio::spawn({
        let (kube, name, cancel, options) =
            (kube.clone(), argocd_ns.name().to_owned(), cancel.clone(), standin.clone());
        async move { argocd::run(kube, &name, options, cancel).await }
    });
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    engine_instance_add(&client, INSTANCE, argocd_ns.name(), 1000).await.expect("add instance");
    let key = SecretBox::generate_key("k1").expect("key");
    let secrets = SecretBox::from_config(Some(&key), Some("k1")).expect("secrets");
    let kubeconfig = cluster
        .namespace_identity(argocd_ns.name(), "gitops-agent", crate::support::agent_rbac_rules())
        .await
        .kubeconfig;
    let mut agent = AgentConfig::new(db.url(), INSTANCE.into(), secrets.clone());
    agent.kubeconfig = Some(kubeconfig);
    agent.metrics_address = "127.0.0.1:0".parse().expect("address");
    agent.poll_interval = Duration::from_secs(1);
    agent.stuck_deletion_after = Duration::from_secs(2);
    tokio::spawn(run_agent(agent, cancel.clone()));
    let admin_kubeconfig = cluster.kubeconfig_path().to_owned();
    let env = Env {
        db,
        client,
        kube,
        kubeconfig: admin_kubeconfig,
        argocd: argocd_ns,
        tenant,
        home,
        secrets,
        cancel,
        standin,
    };
    // Placement needs a heartbeat; the agent's first one comes at start.
    eventually("the agent's heartbeat", || async {
        let row = env.client.query_one("SELECT heartbeat_at IS NOT NULL FROM engine_instance", &[]).await.ok()?;
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    env
}

impl Env {
    /// Another engine instance `name`: a stand-in over a namespace of its own and
    /// an agent serving it (heartbeat and progress probe every `probe_every`; its
    /// heartbeat seen). Returns the namespace and the token that stops the stand-in
    /// (an Argo CD that stops while its agent lives).
    pub(crate) async fn another_instance(
        &self,
        name: &str,
        purpose: &str,
        probe_every: Duration,
    ) -> (TestNamespace, CancellationToken) {
        self.another_instance_with(name, purpose, probe_every, self.standin.clone()).await
    }

    /// [`Env::another_instance`] whose stand-in runs with `options` (another
    /// version, an instance-wide knob).
    pub(crate) async fn another_instance_with(
        &self,
        name: &str,
        purpose: &str,
        probe_every: Duration,
        options: StandinOptions,
    ) -> (TestNamespace, CancellationToken) {
        let cluster = TestCluster::get().await;
        let namespace = cluster.namespace(&format!("{purpose}-{name}")).await;
        let standin = self.cancel.child_token();
        tokio::spawn({
            let (kube, ns, cancel) = (self.kube.clone(), namespace.name().to_owned(), standin.clone());
            async move { argocd::run(kube, &ns, options, cancel).await }
        });
        engine_instance_add(&self.client, name, namespace.name(), 1000).await.expect("add instance");
        let kubeconfig = cluster
            .namespace_identity(namespace.name(), "gitops-agent", crate::support::agent_rbac_rules())
            .await
            .kubeconfig;
        let mut agent = AgentConfig::new(self.db.url(), name.into(), self.secrets.clone());
        agent.kubeconfig = Some(kubeconfig);
        agent.metrics_address = "127.0.0.1:0".parse().expect("address");
        agent.poll_interval = Duration::from_secs(1);
        agent.heartbeat_interval = probe_every;
        tokio::spawn(run_agent(agent, self.cancel.clone()));
        eventually("the second agent's heartbeat", || async {
            let row = self
                .client
                .query_one("SELECT heartbeat_at IS NOT NULL FROM engine_instance WHERE name = $1", &[&name])
                .await
                .ok()?;
            row.get::<_, bool>(0).then_some(())
        })
        .await;
        (namespace, standin)
    }

    pub(crate) fn writer(&self, id: &str) -> CancellationToken {
        self.writer_for(id, vec![self.tenant.name().to_owned()], |_| {})
    }

    /// Stops writer `id` (started with `cancel`) and returns once it has: its shard
    /// leases are released only after its controllers stopped, so nothing of it acts
    /// on the cluster any more (cancelling alone returns at once).
    pub(crate) async fn stop_writer(&self, cancel: CancellationToken, id: &str) {
        cancel.cancel();
        eventually(&format!("writer {id} stopped"), || async {
            let row =
                self.client.query_one("SELECT count(*) FROM writer_shard WHERE writer_id = $1", &[&id]).await.ok()?;
            (row.get::<_, i64>(0) == 0).then_some(())
        })
        .await;
    }

    /// A writer for `namespaces`, its config adjusted by `adjust`.
    pub(crate) fn writer_for(
        &self,
        id: &str,
        namespaces: Vec<String>,
        adjust: impl FnOnce(&mut WriterConfig),
    ) -> CancellationToken {
        let mut config = WriterConfig::new(self.db.url(), self.secrets.clone(), id.to_owned());
        config.namespaces = namespaces;
        config.kubeconfig = Some(self.kubeconfig.clone());
        config.metrics_address = "127.0.0.1:0".parse().expect("address");
        config.shards = ShardConfig { lease: Duration::from_secs(3), interval: Duration::from_millis(300) };
        config.controllers.retry_delay = Duration::from_millis(500);
        config.controllers.prune_poll = Duration::from_millis(300);
        config.home.namespace = self.home.name().to_owned();
        config.home_check_every = Duration::from_millis(300);
        // Most tests are not about who asks; those that are register the webhook.
        config.allow_unverified_home = true;
        adjust(&mut config);
        let cancel = self.cancel.child_token();
        let task = tokio::spawn(run_writer(config, cancel.clone()));
        tokio::spawn(async move {
            if let Ok(Err(error)) = task.await {
                panic!("the writer stopped: {error:?}");
            }
        });
        cancel
    }

    pub(crate) fn deployments(&self) -> Api<GitOpsDeployment> {
        self.deployments_with(self.kube.clone())
    }

    /// The tenant namespace's GitOpsDeployments as `client` sees them.
    pub(crate) fn deployments_with(&self, client: kube::Client) -> Api<GitOpsDeployment> {
        Api::namespaced(client, self.tenant.name())
    }

    /// Lists the Applications the agent made for tenants (not its progress probe).
    pub(crate) fn tenant_apps_params() -> ListParams {
        ListParams::default().labels(&format!("{}={}", names::MANAGED_BY_LABEL, names::MANAGED_BY_VALUE))
    }

    pub(crate) fn apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.kube.clone(), self.argocd.name(), &application_resource())
    }

    pub(crate) async fn create(&self, name: &str, spec: serde_json::Value) -> GitOpsDeployment {
        let object: GitOpsDeployment = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("GitOpsDeployment");
        self.deployments().create(&PostParams::default(), &object).await.expect("create GitOpsDeployment")
    }

    /// Waits for the writer's condition at the object's current generation.
    pub(crate) async fn condition(&self, name: &str) -> (String, String, String) {
        eventually("the writer's condition", || async {
            let object = self.deployments().get_opt(name).await.ok()??;
            let status = object.status.as_ref()?;
            let condition = status.conditions.iter().find(|c| c.type_ == CONDITION)?;
            (condition.observed_generation == object.metadata.generation).then(|| {
                (
                    condition.status.clone(),
                    condition.reason.clone().unwrap_or_default(),
                    condition.message.clone().unwrap_or_default(),
                )
            })
        })
        .await
    }

    pub(crate) async fn rows(&self, name: &str) -> i64 {
        self.client
            .query_one("SELECT count(*) FROM application WHERE resource_name = $1", &[&name])
            .await
            .expect("count")
            .get(0)
    }
}

/// An automated deployment of `path` in `repo` into its own namespace.
pub(crate) fn spec(repo: &str, path: &str) -> serde_json::Value {
    json!({"source": {"repoURL": repo, "path": path}, "destination": {}, "type": "automated"})
}

/// A manual deployment of `path` in `repo` into its own namespace.
pub(crate) fn manual(repo: &str, path: &str) -> serde_json::Value {
    json!({"source": {"repoURL": repo, "path": path}, "destination": {}, "type": "manual"})
}

/// SyncRuns and manual deployments.
impl Env {
    pub(crate) fn sync_runs(&self) -> Api<GitOpsDeploymentSyncRun> {
        Api::namespaced(self.kube.clone(), self.tenant.name())
    }

    pub(crate) async fn create_sync_run(&self, name: &str, deployment: &str, revision: &str) {
        let object: GitOpsDeploymentSyncRun = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentSyncRun",
            "metadata": {"name": name}, "spec": {"gitopsDeploymentName": deployment, "revisionID": revision},
        }))
        .expect("GitOpsDeploymentSyncRun");
        self.sync_runs().create(&PostParams::default(), &object).await.expect("create GitOpsDeploymentSyncRun");
    }

    /// Waits for the writer's condition on a SyncRun to have `reason`.
    pub(crate) async fn sync_run_reason(&self, name: &str, reason: &str) {
        eventually(&format!("SyncRun {name} condition {reason}"), || async {
            let object = self.sync_runs().get_opt(name).await.ok()??;
            let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
            (condition.reason.as_deref() == Some(reason)).then_some(())
        })
        .await;
    }

    pub(crate) async fn sync_state(&self, name: &str) -> Option<(String, Option<String>)> {
        let row = self
            .client
            .query_opt("SELECT state::text, synced_revision FROM sync_operation WHERE resource_name = $1", &[&name])
            .await
            .expect("read sync_operation")?;
        Some((row.get(0), row.get(1)))
    }

    pub(crate) async fn application_of(&self, name: &str) -> String {
        let object = self.deployments().get(name).await.expect("read");
        let uid = uuid::Uuid::parse_str(object.metadata.uid.as_deref().expect("uid")).expect("uuid");
        names::application_name(uid)
    }
}

/// The tenant's home identity.
impl Env {
    /// The UID of the tenant namespace (it names the home ServiceAccount).
    pub(crate) async fn namespace_uid(&self) -> uuid::Uuid {
        let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(self.kube.clone())
            .get(self.tenant.name())
            .await
            .expect("namespace");
        namespace.metadata.uid.as_deref().and_then(|u| u.parse().ok()).expect("a namespace UID")
    }

    /// The Argo CD cluster Secret of the tenant's home environment in Argo CD
    /// namespace `argocd`, once its bearer token passes `check`: (data, token).
    pub(crate) async fn home_secret_in(
        &self,
        argocd: &str,
        check: impl Fn(&str) -> bool,
    ) -> (std::collections::BTreeMap<String, String>, String) {
        let name = names::cluster_secret_name(self.namespace_uid().await);
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(self.kube.clone(), argocd);
        eventually("the home cluster Secret", || async {
            let secret = secrets.get_opt(&name).await.ok()??;
            let data: std::collections::BTreeMap<String, String> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect();
            let config: serde_json::Value = serde_json::from_str(data.get("config")?).ok()?;
            let token = config["bearerToken"].as_str()?.to_owned();
            check(&token).then_some((data, token))
        })
        .await
    }
}
