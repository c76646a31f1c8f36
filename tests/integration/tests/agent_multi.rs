//! Agent processes that serve several instances, and instances served by several
//! processes: one process serves two instances (one endpoint, every series with
//! its `instance` label) and goes on reconciling one while the other's Argo CD
//! is out of reach; two processes of one instance, started at once, both claim its
//! operations while only the holder of the duty lease sweeps and heartbeats, and
//! the other takes the duties when the holder stops; racing connections take the
//! lease one at a time.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_agent::engine::argocd::application_resource;
use gitops_agent::names;
use gitops_agent::{AgentConfig, AgentHandle, Served, run_agent};
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::application::application_upsert_in_txn;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_shared::db::instance_duty::{instance_duty_hold, instance_duty_holder};
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::{EngineInstanceId, ManagedEnvironmentId, ResourceType, SyncType, TenantId};
use gitops_shared::queue::operation_enqueue_in_txn;
use gitops_testkit::TestDb;
use gitops_testkit::argocd::{self, StandinOptions, app_project_crd, application_crd};
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DynamicObject, PostParams};
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{
    DEADLINE, agent_rbac_rules, eventually, home_environment, http_get, intent, restore_agent_access,
    revoke_agent_access,
};

/// One instance of the ground: its stand-in's namespace and a tenant placed there.
struct Instance {
    id: EngineInstanceId,
    ns: TestNamespace,
    tenant: TenantId,
    home: ManagedEnvironmentId,
}

/// Stand-ins over namespaces of their own, each registered as an instance with a
/// tenant, and one agent identity with the agents' rights in every one of them.
struct Ground {
    db: TestDb,
    client: Client,
    kube: kube::Client,
    instances: Vec<Instance>,
    secrets: SecretBox,
    kubeconfig: std::path::PathBuf,
    cancel: CancellationToken,
}

impl Drop for Ground {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn ground(purpose: &str, names: &[&str]) -> Ground {
    let cluster = TestCluster::get().await;
    cluster.install_crds(vec![application_crd(), app_project_crd()]).await.expect("install the Argo CD CRDs");
    let kube = cluster.admin().await;
    let cancel = CancellationToken::new();
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let key = SecretBox::generate_key("k1").expect("key");
    let secrets = SecretBox::from_config(Some(&key), Some("k1")).expect("secrets");
    let mut instances = Vec::new();
    let mut kubeconfig = None;
    for (i, name) in names.iter().enumerate() {
        let ns = cluster.namespace(&format!("{purpose}-{i}")).await;
        tokio::spawn({
            let (kube, ns, cancel) = (kube.clone(), ns.name().to_owned(), cancel.clone());
            async move { argocd::run(kube, &ns, StandinOptions::default(), cancel).await }
        });
        let id = engine_instance_add(&client, name, ns.name(), 1000).await.expect("add instance");
        let txn = client.transaction().await.expect("begin");
        let tenant =
            tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), &format!("team-{i}"), Some(id)).await.expect("tenant").id;
        txn.commit().await.expect("commit");
        let home = home_environment(&mut client, &secrets, id, tenant, "team-a").await;
        match kubeconfig.as_ref().map(|(_, first): &(std::path::PathBuf, String)| first.clone()) {
            None => {
                let identity = cluster.namespace_identity(ns.name(), "gitops-agent", agent_rbac_rules()).await;
                kubeconfig = Some((identity.kubeconfig, ns.name().to_owned()));
            }
            Some(first) => bind_agent(&kube, ns.name(), &first).await,
        }
        instances.push(Instance { id, ns, tenant, home });
    }
    let (kubeconfig, _) = kubeconfig.expect("at least one instance");
    Ground { db, client, kube, instances, secrets, kubeconfig, cancel }
}

/// Gives the agent identity of namespace `first` the agents' rights in `namespace`.
async fn bind_agent(kube: &kube::Client, namespace: &str, first: &str) {
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gitops-agent"}, "rules": agent_rbac_rules()
    }))
    .expect("a Role");
    Api::<Role>::namespaced(kube.clone(), namespace).create(&PostParams::default(), &role).await.expect("Role");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gitops-agent"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gitops-agent"},
        "subjects": [{"kind": "ServiceAccount", "name": "gitops-agent", "namespace": first}]
    }))
    .expect("a RoleBinding");
    Api::<RoleBinding>::namespaced(kube.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
}

/// A running agent process.
struct Agent {
    cancel: CancellationToken,
    task: JoinHandle<Result<(), gitops_agent::AgentError>>,
    handle: AgentHandle,
}

impl Agent {
    async fn stop(self) {
        self.cancel.cancel();
        let result = tokio::time::timeout(DEADLINE, self.task).await.expect("the agent stops in time");
        result.expect("agent task").expect("a clean exit");
    }
}

impl Ground {
    fn config(&self, serve: Served, claimer: &str) -> AgentConfig {
        let mut config = AgentConfig::new(self.db.url(), String::new(), self.secrets.clone());
        config.serve = serve;
        config.claimer = claimer.to_owned();
        config.kubeconfig = Some(self.kubeconfig.clone());
        config.metrics_address = "127.0.0.1:0".parse().expect("address");
        config.sweep.interval = Duration::from_millis(200);
        config.heartbeat_interval = Duration::from_millis(200);
        config.duty_lease = Duration::from_secs(10);
        config.poll_interval = Duration::from_secs(1);
        config.concurrency = 1;
        config
    }

    fn start(&self, config: AgentConfig) -> Agent {
        let cancel = CancellationToken::new();
        let handle = config.handle.clone();
        let task = tokio::spawn(run_agent(config, cancel.clone()));
        Agent { cancel, task, handle }
    }

    /// A manual application of instance `i`'s tenant with its operation, as the
    /// writer writes it; returns its Application's name.
    async fn application(&mut self, i: usize) -> String {
        let instance = &self.instances[i];
        let uid = Uuid::new_v4();
        let mut intent = intent(uid, 1);
        intent.sync_type = SyncType::Manual;
        intent.managed_environment_id = Some(instance.home);
        let txn = self.client.transaction().await.expect("begin");
        let id = application_upsert_in_txn(&txn, instance.tenant, &intent).await.expect("upsert").expect("new row").0;
        operation_enqueue_in_txn(&txn, instance.id, instance.tenant, ResourceType::Application, id)
            .await
            .expect("enqueue");
        txn.commit().await.expect("commit");
        names::application_name(uid)
    }

    async fn wait_application(&self, i: usize, name: &str) {
        let apps: Api<DynamicObject> =
            Api::namespaced_with(self.kube.clone(), self.instances[i].ns.name(), &application_resource());
        eventually(&format!("Application {name} on instance {i}"), || async {
            apps.get_opt(name).await.ok().flatten().map(|_| ())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_one_process_serves_two_instances_and_one_failing_stalls_nothing() {
    let mut g = ground("multi", &["argocd-a", "argocd-b"]).await;
    let agent = g.start(g.config(Served::Instances(vec!["argocd-a".into(), "argocd-b".into()]), "one-process"));
    let (a, b) = (g.application(0).await, g.application(1).await);
    g.wait_application(0, &a).await;
    g.wait_application(1, &b).await;
    let address = eventually("the HTTP endpoint bound", || async { agent.handle.http_address() }).await;
    let metrics = eventually("both instances on the one endpoint", || async {
        let (_, text) = http_get(address, "/metrics").await;
        text.contains("gitops_agent_instances_served 2").then_some(text)
    })
    .await;
    for name in ["argocd-a", "argocd-b"] {
        let series = format!("gitops_agent_heartbeats_total{{instance=\"{name}\"}}");
        assert!(metrics.contains(&series), "{series} missing from:\n{metrics}");
    }
    assert_eq!(metrics.matches("# HELP gitops_agent_heartbeats_total ").count(), 1, "one family, two series");

    // Instance b's Argo CD is out of the agent's reach: a goes on.
    let binding = revoke_agent_access(&g.kube, g.instances[1].ns.name()).await;
    let (on_a, on_b) = (agent.handle.metrics("argocd-a"), agent.handle.metrics("argocd-b"));
    eventually("b unreachable", || async { (!on_b.argocd_reachable.load(Ordering::Relaxed)).then_some(()) }).await;
    let beats = on_a.heartbeats.load(Ordering::Relaxed);
    let a2 = g.application(0).await;
    g.wait_application(0, &a2).await;
    eventually("a keeps heartbeating", || async {
        (on_a.heartbeats.load(Ordering::Relaxed) > beats + 2).then_some(())
    })
    .await;
    assert!(on_a.argocd_reachable.load(Ordering::Relaxed));
    eventually("the process stays ready", || async { (http_get(address, "/readyz").await.0 == 200).then_some(()) })
        .await;
    let (_, text) = http_get(address, "/metrics").await;
    assert!(text.contains("gitops_agent_argocd_reachable{instance=\"argocd-b\"} 0"), "{text}");
    assert!(text.contains("gitops_agent_argocd_reachable{instance=\"argocd-a\"} 1"), "{text}");

    // b comes back, and is served again.
    restore_agent_access(&g.kube, g.instances[1].ns.name(), binding).await;
    let b2 = g.application(1).await;
    g.wait_application(1, &b2).await;
    eventually("b reachable again", || async { on_b.argocd_reachable.load(Ordering::Relaxed).then_some(()) }).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_processes_of_one_instance_all_claim_and_one_sweeps() {
    let mut g = ground("duty", &["argocd-1"]).await;
    let serve = || Served::Instances(vec!["argocd-1".into()]);
    // Started at once: they race for the duty lease.
    let first = g.start(g.config(serve(), "process-1"));
    let second = g.start(g.config(serve(), "process-2"));
    let (m1, m2) = (first.handle.metrics("argocd-1"), second.handle.metrics("argocd-1"));
    let claimed = |m: &gitops_agent::metrics::Metrics| m.of(ResourceType::Application).claimed.load(Ordering::SeqCst);
    // Operations until both processes have claimed some (ten rounds at most).
    for _ in 0..10 {
        let mut made = Vec::new();
        for _ in 0..6 {
            made.push(g.application(0).await);
        }
        for name in &made {
            g.wait_application(0, name).await;
        }
        if claimed(&m1) > 0 && claimed(&m2) > 0 {
            break;
        }
    }
    assert!(claimed(&m1) > 0 && claimed(&m2) > 0, "both claim: {} and {}", claimed(&m1), claimed(&m2));

    let holder_sweeps =
        eventually("one process sweeps", || async { (m1.sweeps().max(m2.sweeps()) >= 3).then_some(()) });
    holder_sweeps.await;
    let (holder, other, holder_name, other_name) = if m1.sweeps() >= 3 {
        (first, second, "process-1", "process-2")
    } else {
        (second, first, "process-2", "process-1")
    };
    let (on_holder, on_other) = (holder.handle.metrics("argocd-1"), other.handle.metrics("argocd-1"));
    assert_eq!(on_other.sweeps(), 0, "only the duty holder sweeps");
    assert_eq!(on_other.heartbeats.load(Ordering::SeqCst), 0, "only the duty holder heartbeats");
    assert!(on_holder.duty_held.load(Ordering::SeqCst) && !on_other.duty_held.load(Ordering::SeqCst));
    let id = g.instances[0].id;
    assert_eq!(instance_duty_holder(&g.client, id).await.expect("holder").as_deref(), Some(holder_name));

    // The holder stops (and gives the lease up): the other takes the duties.
    holder.stop().await;
    eventually("the other process takes the duties", || async {
        (on_other.sweeps() >= 2 && on_other.heartbeats.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert_eq!(instance_duty_holder(&g.client, id).await.expect("holder").as_deref(), Some(other_name));
    other.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_duty_lease_racers_take_it_one_at_a_time() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let id = engine_instance_add(&client, "argocd-1", "argocd", 10).await.expect("add instance");
    let racers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(racers));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..racers {
        let racer = db.connect().await;
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            let held = instance_duty_hold(&racer, id, &format!("racer-{n}"), Duration::from_secs(30)).await;
            (n, held.expect("the lease statement"))
        });
    }
    let mut winners = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (n, held) = done.expect("racer");
        if held {
            winners.push(n);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one racer holds the lease: {winners:?}");
    let winner = format!("racer-{}", winners[0]);
    assert_eq!(instance_duty_holder(&client, id).await.expect("holder"), Some(winner.clone()));
    assert!(instance_duty_hold(&client, id, &winner, Duration::from_millis(300)).await.expect("renew"), "renewed");
    let loser = if winners[0] == 0 { "racer-1" } else { "racer-0" };
    // Once the holder stops renewing, the lease ends and another takes it.
    eventually("the lease taken over after it expired", || async {
        instance_duty_hold(&client, id, loser, Duration::from_secs(30)).await.expect("hold").then_some(())
    })
    .await;
    assert!(!instance_duty_hold(&client, id, &winner, Duration::from_secs(30)).await.expect("hold"), "lost it");
}
