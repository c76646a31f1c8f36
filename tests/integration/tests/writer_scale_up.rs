//! The automatic scale-up, on both tiers with the test kit's operator: two writers
//! with it on see the fleet short of room, exactly one provisions the next instance
//! (registered with the host cluster, so the running `--host-cluster` agent serves
//! it), and a tenant lands there; metrics and `instance list` say so. Attempts
//! after a failure try the same instance again, so nothing is left behind. Racing
//! connections begin one attempt at a time, and an abandoned attempt is ended.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gitops_agent::{AgentConfig, Served, run_agent};
use gitops_shared::db::engine_instance::{engine_instance_add, engine_instance_cordon};
use gitops_shared::db::instance_scale_up::{fleet_free_capacity, scale_up_begin, scale_up_finish, scale_up_recent};
use gitops_shared::db::tenant_move::tenant_placements;
use gitops_testkit::TestDb;
use gitops_testkit::argocd::operator::{argocd_crd, run_operator};
use gitops_testkit::cluster::TestCluster;
use gitops_writer::metrics::WriterMetrics;
use gitops_writer::scale_up::ScaleUpSettings;

use crate::support::eventually;
use crate::support::writer::{INSTANCE, env, spec};

const REPO: &str = "https://git.example.invalid/team/app.git";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_scale_up_provisions_one_instance_when_the_fleet_is_short() {
    let env = env("scale").await;
    let cluster = TestCluster::get().await;
    cluster.install_crds(vec![argocd_crd()]).await.expect("install the ArgoCD CRD");
    tokio::spawn(run_operator(env.kube.clone(), env.standin.clone(), "argocd-auto-".into(), env.cancel.child_token()));
    // An agent of host cluster east, serving nothing yet.
    let mut agent = AgentConfig::new(env.db.url(), String::new(), env.secrets.clone());
    agent.serve = Served::HostCluster("east".into());
    agent.instances_refresh = Duration::from_millis(300);
    agent.kubeconfig = Some(std::env::temp_dir().join(format!("kubeconfig-{}-gitops-agent", env.argocd.name())));
    agent.metrics_address = "127.0.0.1:0".parse().expect("address");
    agent.poll_interval = Duration::from_secs(1);
    agent.heartbeat_interval = Duration::from_millis(300);
    let handle = agent.handle.clone();
    tokio::spawn(run_agent(agent, env.cancel.child_token()));

    // The only instance is closed: no free slot left.
    engine_instance_cordon(&env.client, INSTANCE, true).await.expect("cordon");
    let settings = ScaleUpSettings {
        below_free: 5,
        name_prefix: "argocd-auto".into(),
        capacity: 10,
        version: Some("v3.0.2".into()),
        host_cluster: Some("east".into()),
        agents: vec![format!("{}/gitops-agent", env.argocd.name())],
        wait: Duration::from_secs(60),
        lease: Duration::from_secs(5),
    };
    let metrics: Vec<Arc<WriterMetrics>> = (0..2).map(|_| Arc::default()).collect();
    for (n, metrics) in metrics.iter().enumerate() {
        let (settings, metrics) = (settings.clone(), metrics.clone());
        env.writer_for(&format!("writer-{n}"), vec![env.tenant.name().to_owned()], move |c| {
            c.scale_up = Some(settings);
            c.metrics = metrics;
            c.fleet_watch_interval = Duration::from_millis(200);
        });
    }
    eventually("the running agent serves the instance the scale-up made", || async {
        (handle.instances() == ["argocd-auto-1"]).then_some(())
    })
    .await;
    let ended = eventually("the scale-up recorded as completed", || async {
        let attempts = scale_up_recent(&env.client, 10).await.ok()?;
        attempts.iter().all(|a| a.state == "completed").then_some(attempts)
    })
    .await;
    assert_eq!(ended.len(), 1, "one attempt for the whole fleet: {ended:?}");
    assert_eq!(ended[0].instance_name, "argocd-auto-1");
    let made: Vec<(String, Option<String>)> = env
        .client
        .query("SELECT name, host_cluster FROM engine_instance WHERE provisioned_by = 'scale-up'", &[])
        .await
        .expect("instances")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert_eq!(made, [("argocd-auto-1".to_owned(), Some("east".to_owned()))]);
    let completed: u64 = metrics.iter().map(|m| m.scale_ups[0].load(Ordering::Relaxed)).sum();
    let failed: u64 = metrics.iter().map(|m| m.scale_ups[1].load(Ordering::Relaxed)).sum();
    assert_eq!((completed, failed), (1, 0), "one writer provisioned it");
    assert!(metrics.iter().any(|m| m.render().contains("gitops_writer_scale_ups_total{outcome=\"completed\"} 1")));
    let listed = gitopsctl::instance::render_scale_ups(&ended);
    assert!(listed.contains("last scale-up: \"argocd-auto-1\" provisioned"), "{listed}");

    // The fleet has room again: a tenant lands on the new instance.
    env.create("web", spec(REPO, "apps/web")).await;
    eventually("Ready on the scaled-up instance", || async {
        let object = env.deployments().get_opt("web").await.ok()??;
        object
            .status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation)
            .then_some(())
    })
    .await;
    let placed = tenant_placements(&env.client, Some(env.tenant.name()), None).await.expect("placements");
    assert_eq!(placed[0].instance.as_deref(), Some("argocd-auto-1"));
    assert_eq!(scale_up_recent(&env.client, 10).await.expect("attempts").len(), 1, "no further scale-up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_scale_up_after_a_failure_completes_the_same_instance() {
    let env = env("rescale").await;
    let cluster = TestCluster::get().await;
    cluster.install_crds(vec![argocd_crd()]).await.expect("install the ArgoCD CRD");
    engine_instance_cordon(&env.client, INSTANCE, true).await.expect("cordon");
    let settings = ScaleUpSettings {
        below_free: 5,
        name_prefix: "argocd-again".into(),
        capacity: 10,
        version: Some("v3.0.2".into()),
        host_cluster: Some("east".into()),
        agents: vec![format!("{}/gitops-agent", env.argocd.name())],
        // No operator runs yet: every attempt fails waiting for it.
        wait: Duration::from_millis(500),
        lease: Duration::from_secs(5),
    };
    env.writer_for("writer-0", vec![env.tenant.name().to_owned()], move |c| {
        c.scale_up = Some(settings);
        c.fleet_watch_interval = Duration::from_millis(200);
    });
    eventually("two failed attempts", || async {
        let attempts = scale_up_recent(&env.client, 10).await.ok()?;
        (attempts.iter().filter(|a| a.state == "failed").count() >= 2).then_some(())
    })
    .await;
    // The operator arrives: the next attempt completes what the failed ones made.
    tokio::spawn(run_operator(env.kube.clone(), env.standin.clone(), "argocd-again-".into(), env.cancel.child_token()));
    let attempts = eventually("an attempt completed", || async {
        let attempts = scale_up_recent(&env.client, 100).await.ok()?;
        attempts.iter().any(|a| a.state == "completed").then_some(attempts)
    })
    .await;
    let names: std::collections::BTreeSet<&str> = attempts.iter().map(|a| a.instance_name.as_str()).collect();
    assert_eq!(names, ["argocd-again-1"].into(), "every attempt tried the same instance: {attempts:?}");
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(env.kube.clone());
    let left: Vec<String> = namespaces
        .list(&Default::default())
        .await
        .expect("namespaces")
        .items
        .into_iter()
        .filter_map(|ns| ns.metadata.name)
        .filter(|name| name.starts_with("argocd-again-"))
        .collect();
    assert_eq!(left, ["argocd-again-1"], "no namespace of a failed attempt left behind");
    let registered: i64 = env
        .client
        .query_one("SELECT count(*) FROM engine_instance WHERE name = 'argocd-again-1'", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(registered, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_scale_up_attempts_race_one_at_a_time() {
    let db = TestDb::migrated().await;
    let racers = 8;
    let barrier = Arc::new(tokio::sync::Barrier::new(racers));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..racers {
        let mut client = db.connect().await;
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            scale_up_begin(&mut client, "auto", None, &format!("writer-{n}"), 1, Duration::from_secs(60))
                .await
                .expect("begin")
        });
    }
    let mut begun = Vec::new();
    while let Some(done) = tasks.join_next().await {
        begun.extend(done.expect("racer"));
    }
    assert_eq!(begun.len(), 1, "one attempt begins: {begun:?}");
    let mut client = db.connect().await;
    // An attempt whose writer stopped renewing it is ended, and the next begins.
    client.execute("UPDATE instance_scale_up SET expires_at = now() - interval '1 second'", &[]).await.expect("age");
    let next = scale_up_begin(&mut client, "auto", None, "writer-x", 1, Duration::from_secs(60)).await.expect("begin");
    let (id, name) = next.expect("the abandoned attempt no longer blocks");
    assert_eq!(name, "auto-2");
    let attempts = scale_up_recent(&client, 10).await.expect("attempts");
    assert_eq!(attempts[1].state, "failed");
    assert!(attempts[1].error.as_deref().is_some_and(|e| e.contains("abandoned")), "{attempts:?}");
    // Only its writer ends it.
    scale_up_finish(&client, id, "writer-y", None).await.expect("finish");
    assert_eq!(scale_up_recent(&client, 1).await.expect("attempts")[0].state, "provisioning");
    scale_up_finish(&client, id, "writer-x", None).await.expect("finish");
    assert_eq!(scale_up_recent(&client, 1).await.expect("attempts")[0].state, "completed");
}

/// A writer that saw the fleet short while another writer's attempt was
/// provisioning, and begins only after that attempt registered its instance and
/// ended, begins nothing: the fleet has room by then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_scale_up_is_not_repeated_by_a_writer_that_looked_before_the_last_one_ended() {
    let db = TestDb::migrated().await;
    let (mut first, mut second) = (db.connect().await, db.connect().await);
    let lease = Duration::from_secs(60);
    let (id, name) = scale_up_begin(&mut first, "auto", None, "writer-a", 5, lease)
        .await
        .expect("begin")
        .expect("an empty fleet is short");
    // The second writer looks now: short, with an attempt in progress.
    let seen = fleet_free_capacity(&second).await.expect("free capacity");
    assert!(seen.free < 5, "{seen:?}");
    // The first attempt registers its instance and ends.
    engine_instance_add(&first, &name, "argocd-auto-1", 10).await.expect("register");
    scale_up_finish(&first, id, "writer-a", None).await.expect("finish");
    // The second writer acts on what it saw: nothing begins.
    let again = scale_up_begin(&mut second, "auto", None, "writer-b", 5, lease).await.expect("begin");
    assert_eq!(again, None, "the fleet has room now");
    assert_eq!(scale_up_recent(&second, 10).await.expect("attempts").len(), 1);
    // Still short after all (the new instance cordoned): the next look begins one.
    engine_instance_cordon(&second, &name, true).await.expect("cordon");
    let next = scale_up_begin(&mut second, "auto", None, "writer-b", 5, lease).await.expect("begin");
    assert_eq!(next.map(|(_, name)| name), Some("auto-2".to_owned()));
}
