//! Canary rollouts of a new Argo CD version, end to end on both tiers: each
//! instance reports the version it runs (`gitopsctl instance list` shows it); a
//! rollout to a healthy instance bakes its canary and, promoted, moves every tenant
//! of the source there in waves while the tenants keep changing their deployments;
//! a rollout to an instance whose Argo CD degrades what it adopts rolls back by
//! itself, saying why, with no Application ever held by both instances at once.
//! A rollout goes on when the writer driving it stops and another takes over.
//! Also, racing real connections: one rollout acts on a tenant at a time, and the
//! rest of the fleet leaves a rollout's tenants and target alone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use gitops_agent::engine::argocd::application_resource;
use gitops_shared::db::engine_instance::engine_instance_cordon;
use gitops_shared::db::rollout::{Cohort, RolloutRequest, rollout_list, rollout_promote, rollout_start};
use gitops_shared::db::tenant_move::tenant_placements;
use gitops_testkit::argocd::StandinOptions;
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::support::eventually;
use crate::support::writer::{Env, INSTANCE, env, spec};

const REPO: &str = "https://git.example.invalid/team/app.git";

/// Tenants: the environment's namespace and `more` others, each with two deployments.
struct Tenants {
    namespaces: Vec<String>,
    _extra: Vec<TestNamespace>,
}

async fn tenants(env: &Env, purpose: &str, more: usize) -> Tenants {
    let cluster = TestCluster::get().await;
    let mut extra = Vec::new();
    for i in 0..more {
        extra.push(cluster.namespace(&format!("{purpose}-t{i}")).await);
    }
    let mut namespaces = vec![env.tenant.name().to_owned()];
    namespaces.extend(extra.iter().map(|ns| ns.name().to_owned()));
    Tenants { namespaces, _extra: extra }
}

fn deployments(env: &Env, namespace: &str) -> Api<GitOpsDeployment> {
    Api::namespaced(env.kube.clone(), namespace)
}

async fn create(env: &Env, namespace: &str, name: &str, path: &str) {
    let object: GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
        "metadata": {"name": name}, "spec": spec(REPO, path),
    }))
    .expect("GitOpsDeployment");
    deployments(env, namespace).create(&PostParams::default(), &object).await.expect("create GitOpsDeployment");
}

/// Whether every deployment of every namespace is Ready at its generation.
async fn all_ready(env: &Env, namespaces: &[String]) -> Option<()> {
    for namespace in namespaces {
        for name in ["web", "api"] {
            let object = deployments(env, namespace).get_opt(name).await.ok()??;
            let ready = object.status.as_ref()?.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation
            });
            if !ready {
                return None;
            }
        }
    }
    Some(())
}

/// The instance each namespace's tenant is on, once none is moving.
async fn placements(client: &tokio_postgres::Client) -> Option<std::collections::BTreeMap<String, String>> {
    let placed = tenant_placements(client, None, None).await.ok()?;
    placed
        .iter()
        .all(|t| t.move_state.is_none())
        .then(|| placed.into_iter().map(|t| (t.namespace, t.instance.unwrap_or_default())).collect())
}

async fn rollout_state(client: &tokio_postgres::Client, id: i64) -> Option<(String, Option<String>)> {
    let rollout = rollout_list(client, Some(id)).await.ok()?.pop()?;
    Some((rollout.state, rollout.reason))
}

/// Application names of every tenant's deployments.
async fn application_names(env: &Env, namespaces: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for namespace in namespaces {
        for name in ["web", "api"] {
            let object = deployments(env, namespace).get(name).await.expect("read");
            let uid = object.metadata.uid.as_deref().expect("uid").parse().expect("uuid");
            out.push(gitops_agent::names::application_name(uid));
        }
    }
    out
}

/// Names recorded by a watch, shared with its task.
type Recorded = Arc<Mutex<Vec<String>>>;

/// Watches `target`: records every tenant Application that shows up there while
/// `source` still holds it.
fn watch_overlaps(
    target: Api<DynamicObject>,
    source: Api<DynamicObject>,
    apps: Vec<String>,
) -> (Recorded, Recorded, tokio::task::JoinHandle<()>) {
    let overlaps: Recorded = Arc::default();
    let seen: Recorded = Arc::default();
    let task = tokio::spawn({
        let (overlaps, seen) = (overlaps.clone(), seen.clone());
        async move {
            let mut events = watcher::watcher(target, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(app)) = events.next().await {
                let name = app.metadata.name.clone().unwrap_or_default();
                if !apps.contains(&name) {
                    continue;
                }
                if source.get_opt(&name).await.ok().flatten().is_some() {
                    overlaps.lock().expect("lock").push(name.clone());
                }
                seen.lock().expect("lock").push(name);
            }
        }
    });
    (overlaps, seen, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_rollout_to_a_new_version_is_promoted_to_every_tenant() {
    let env = env("rlok").await;
    let options = StandinOptions { version: "v3.0.1".to_owned(), ..env.standin.clone() };
    let (second, _standin) = env.another_instance_with("argocd-2", "rlok", Duration::from_millis(300), options).await;
    // Every tenant starts on the first instance.
    engine_instance_cordon(&env.client, "argocd-2", true).await.expect("cordon");
    let tenants = tenants(&env, "rlok", 2).await;
    let writer = env.writer_for("writer-a", tenants.namespaces.clone(), |c| {
        c.fleet_watch_interval = Duration::from_millis(300);
    });
    for (i, namespace) in tenants.namespaces.iter().enumerate() {
        create(&env, namespace, "web", &format!("apps/{i}/web")).await;
        create(&env, namespace, "api", &format!("apps/{i}/api")).await;
    }
    eventually("every deployment Ready on the first instance", || all_ready(&env, &tenants.namespaces)).await;
    engine_instance_cordon(&env.client, "argocd-2", false).await.expect("uncordon");

    // Each instance reports the version it runs; `instance list` shows it.
    let client = gitops_shared::db::connect(&env.db.url(), "rollout-test").await.expect("connect");
    eventually("both instances' versions reported", || async {
        let listed = gitopsctl::instance::list(&env.db.url()).await.ok()?;
        let version = |name: &str| listed.iter().find(|i| i.name == name).and_then(|i| i.argocd_version.clone());
        (version(INSTANCE).as_deref() == Some(gitops_testkit::argocd::DEFAULT_VERSION)
            && version("argocd-2").as_deref() == Some("v3.0.1"))
        .then_some(())
    })
    .await;
    let listed = gitopsctl::instance::render_list(&gitopsctl::instance::list(&env.db.url()).await.expect("list"));
    assert!(listed.contains("VERSION") && listed.contains("v3.0.1"), "{listed}");

    let apps = application_names(&env, &tenants.namespaces).await;
    let source: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), env.argocd.name(), &application_resource());
    let target: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), second.name(), &application_resource());
    let (overlaps, seen, watch) = watch_overlaps(target.clone(), source.clone(), apps.clone());

    let mut db = gitops_shared::db::connect(&env.db.url(), "rollout-test").await.expect("connect");
    let request = RolloutRequest {
        target: "argocd-2".into(),
        cohort: Cohort::Tenants(1),
        from: None,
        bake: Duration::from_secs(2),
        max_regressions: Some(0),
        wave_size: Some(1),
    };
    let started = rollout_start(&mut db, request).await.expect("start the rollout");
    assert_eq!(started.cohort.len(), 1, "{:?}", started.cohort);
    let canary = started.cohort[0].clone();
    let (i, _) = tenants.namespaces.iter().enumerate().find(|(_, ns)| **ns == canary).expect("a tenant of the test");
    // The target takes no other new tenants meanwhile; a second rollout to it is refused.
    let again = RolloutRequest {
        target: "argocd-2".into(),
        cohort: Cohort::Tenants(1),
        from: None,
        bake: Duration::from_secs(1),
        max_regressions: None,
        wave_size: None,
    };
    let refused = rollout_start(&mut db, again).await.expect_err("one rollout per target");
    assert!(refused.to_string().contains("in progress"), "{refused}");

    // A tenant changes a deployment while its namespace moves: the change lands.
    let patch = json!({"spec": {"source": {"path": format!("apps/{i}/web-during-rollout")}}});
    deployments(&env, &canary).patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change");
    eventually("the canary passed its bake", || async {
        (rollout_state(&client, started.id).await?.0 == "waiting").then_some(())
    })
    .await;
    let placed = placements(&client).await.expect("placements");
    for namespace in &tenants.namespaces {
        let expected = if *namespace == canary { "argocd-2" } else { INSTANCE };
        assert_eq!(placed[namespace], expected, "only the canary moved");
    }
    let path = format!("apps/{i}/web-during-rollout");
    eventually("the change made during the move on the target", || async {
        let app = target.get_opt(&apps[2 * i]).await.ok()??;
        (app.data.pointer("/spec/source/path")?.as_str()? == path).then_some(())
    })
    .await;

    rollout_promote(&client, started.id, None).await.expect("promote");
    // The rollout's state is in the database: it goes on under another writer.
    env.stop_writer(writer, "writer-a").await;
    let _writer = env.writer_for("writer-b", tenants.namespaces.clone(), |c| {
        c.fleet_watch_interval = Duration::from_millis(300);
    });
    eventually("the rollout completed", || async {
        (rollout_state(&client, started.id).await?.0 == "completed").then_some(())
    })
    .await;
    let placed = placements(&client).await.expect("placements");
    assert!(placed.values().all(|instance| instance == "argocd-2"), "every tenant on the new version: {placed:?}");
    eventually("every deployment Ready on the new version", || all_ready(&env, &tenants.namespaces)).await;
    for app in &apps {
        assert!(source.get_opt(app).await.expect("read").is_none(), "{app} left the first instance");
    }
    eventually("the watch saw every adoption", || async {
        let seen = seen.lock().expect("lock").clone();
        apps.iter().all(|app| seen.contains(app)).then_some(())
    })
    .await;
    assert!(overlaps.lock().expect("lock").is_empty(), "held by both at once: {:?}", overlaps.lock());
    watch.abort();
    let status = gitopsctl::rollout::status(&env.db.url(), Some(started.id)).await.expect("status");
    assert!(status.contains("completed") && status.contains("canary"), "{status}");
    // One canary and two waves of one tenant, each judged.
    let waves = gitops_shared::db::rollout::rollout_waves(&client, started.id).await.expect("waves");
    assert_eq!(waves.len(), 3, "{waves:?}");
    assert!(waves.iter().all(|w| w.regressed == 0 && w.ok + w.excluded == w.deployments && w.deployments == 2));
    assert!(waves.iter().map(|w| w.excluded).sum::<i64>() <= 1, "only the changed deployment may be excluded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_rollout_to_a_degrading_instance_rolls_back_by_itself() {
    let env = env("rlbad").await;
    let options =
        StandinOptions { version: "v3.0.0".to_owned(), health: Some("Degraded".to_owned()), ..env.standin.clone() };
    let (second, _standin) = env.another_instance_with("argocd-2", "rlbad", Duration::from_millis(300), options).await;
    // Every tenant starts on the first instance.
    engine_instance_cordon(&env.client, "argocd-2", true).await.expect("cordon");
    let tenants = tenants(&env, "rlbad", 2).await;
    let _writer = env.writer_for("writer-a", tenants.namespaces.clone(), |c| {
        c.fleet_watch_interval = Duration::from_millis(300);
    });
    for (i, namespace) in tenants.namespaces.iter().enumerate() {
        create(&env, namespace, "web", &format!("apps/{i}/web")).await;
        create(&env, namespace, "api", &format!("apps/{i}/api")).await;
    }
    eventually("every deployment Ready on the first instance", || all_ready(&env, &tenants.namespaces)).await;
    engine_instance_cordon(&env.client, "argocd-2", false).await.expect("uncordon");
    let apps = application_names(&env, &tenants.namespaces).await;
    let source: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), env.argocd.name(), &application_resource());
    let target: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), second.name(), &application_resource());
    // Both ways: nothing on the target while the source holds it, and back.
    let (overlaps, seen, watch) = watch_overlaps(target.clone(), source.clone(), apps.clone());
    let (back_overlaps, _back_seen, back_watch) = watch_overlaps(source.clone(), target.clone(), apps.clone());

    let mut db = gitops_shared::db::connect(&env.db.url(), "rollout-test").await.expect("connect");
    let cohort = vec![tenants.namespaces[0].clone(), tenants.namespaces[1].clone()];
    let request = RolloutRequest {
        target: "argocd-2".into(),
        cohort: Cohort::Namespaces(cohort.clone()),
        from: None,
        bake: Duration::from_secs(3),
        max_regressions: None,
        wave_size: None,
    };
    let started = rollout_start(&mut db, request).await.expect("start the rollout");
    let client = gitops_shared::db::connect(&env.db.url(), "rollout-test").await.expect("connect");
    let (state, reason) = eventually("the rollout rolled back", || async {
        let (state, reason) = rollout_state(&client, started.id).await?;
        (state == "rolled_back").then_some((state, reason))
    })
    .await;
    assert_eq!(state, "rolled_back");
    let reason = reason.expect("a reason");
    assert!(reason.contains("Healthy → Degraded") && reason.contains("4 of 4"), "{reason}");
    let placed = placements(&client).await.expect("placements");
    assert!(placed.values().all(|instance| instance == INSTANCE), "every tenant back: {placed:?}");
    eventually("every deployment Ready again on the first instance", || all_ready(&env, &tenants.namespaces)).await;
    for app in &apps {
        assert!(target.get_opt(app).await.expect("read").is_none(), "{app} left the degrading instance");
    }
    let seen = seen.lock().expect("lock").clone();
    assert!(apps[..4].iter().all(|app| seen.contains(app)), "the cohort did reach the target: {seen:?}");
    assert!(apps[4..].iter().all(|app| !seen.contains(app)), "nothing else moved: {seen:?}");
    assert!(overlaps.lock().expect("lock").is_empty(), "held by both at once: {:?}", overlaps.lock());
    assert!(back_overlaps.lock().expect("lock").is_empty(), "held by both on the way back: {:?}", back_overlaps.lock());
    watch.abort();
    back_watch.abort();
    let status = gitopsctl::rollout::status(&env.db.url(), Some(started.id)).await.expect("status");
    assert!(status.contains("rolled_back") && status.contains("Degraded"), "{status}");
    // The tenants are free again: an operator may move them.
    let rows: i64 =
        client.query_one("SELECT count(*) FROM rollout_tenant WHERE active", &[]).await.expect("count").get(0);
    assert_eq!(rows, 0);
}
