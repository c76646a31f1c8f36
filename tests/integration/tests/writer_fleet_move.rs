//! A tenant moved between two instances, each with its Argo CD stand-in and agent:
//! watched on both throughout, no Application is ever held by both instances at
//! once (each one appearing on the target is checked absent on the source at that
//! moment), even while the tenant changes its deployments mid-move; afterwards every deployment is Ready on the target with the same
//! Application names, the source holds nothing of the tenant, and changes reach the
//! target. A drain moves every tenant off an instance the same way, and so does a
//! rebalancing step from the fuller instance to the emptier one.

use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use gitops_agent::engine::argocd::application_resource;
use gitops_shared::db::tenant_move::{tenant_move, tenant_placements};
use gitops_testkit::argocd::live::WRITTEN_BY_ANNOTATION;
use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::GitOpsDeployment;
use gitops_writer::controller::home_account_name;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

use crate::support::eventually;
use crate::support::writer::{Env, env, env_live, spec};

const REPO: &str = "https://git.example.invalid/team/app.git";

/// Whether every deployment in `names` is Ready at its generation.
async fn all_ready(env: &Env, names: &[String]) -> Option<()> {
    for name in names {
        let object = env.deployments().get_opt(name).await.ok()??;
        let ready =
            object.status.as_ref()?.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation
            });
        if !ready {
            return None;
        }
    }
    Some(())
}

/// Application names (the agent's naming) of `names`.
async fn application_names(env: &Env, names: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for name in names {
        let object = env.deployments().get(name).await.expect("read");
        let uid = object.metadata.uid.as_deref().expect("uid").parse().expect("uuid");
        out.push(gitops_agent::names::application_name(uid));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_fleet_move_never_holds_an_application_on_two_instances() {
    let env = env_live("fmove").await;
    let (second, _standin) = env.another_instance("argocd-2", "fmove", std::time::Duration::from_secs(15)).await;
    let _writer = env.writer("writer-a");
    let names: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        env.create(name, spec(REPO, &format!("apps/{i}"))).await;
    }
    eventually("every deployment Ready on the first instance", || all_ready(&env, &names)).await;
    let apps = application_names(&env, &names).await;
    let first = env.apps();
    let target: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), second.name(), &application_resource());
    for app in &apps {
        assert!(first.get_opt(app).await.expect("read").is_some(), "{app} on the first instance");
    }
    // What the Applications deployed: one live object each, written by the first
    // instance. Any deletion of one during the move would be a prune.
    let live: Api<ConfigMap> = Api::namespaced(env.kube.clone(), env.tenant.name());
    let mut uids = std::collections::BTreeMap::new();
    for app in &apps {
        let object = eventually("the live object written by the first instance", || async {
            let object = live.get_opt(app).await.ok()??;
            (object.annotations().get(WRITTEN_BY_ANNOTATION)? == env.argocd.name()).then_some(object)
        })
        .await;
        uids.insert(app.clone(), object.metadata.uid.clone().expect("uid"));
    }
    let pruned: Arc<Mutex<Vec<String>>> = Arc::default();
    let live_watch = tokio::spawn({
        let (live, apps, pruned) = (live.clone(), apps.clone(), pruned.clone());
        async move {
            let mut events = watcher::watcher(live, watcher::Config::default()).boxed();
            while let Some(Ok(event)) = events.next().await {
                if let watcher::Event::Delete(object) = event
                    && apps.contains(&object.name_any())
                {
                    pruned.lock().expect("lock").push(object.name_any());
                }
            }
        }
    });

    // Watch the target: whenever one of the tenant's Applications shows up there,
    // the source must not hold it any more.
    let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let watch = tokio::spawn({
        let (target, first, apps, overlaps, seen) =
            (target.clone(), first.clone(), apps.clone(), overlaps.clone(), seen.clone());
        async move {
            let mut events = watcher::watcher(target, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(app)) = events.next().await {
                let name = app.metadata.name.clone().unwrap_or_default();
                if !apps.contains(&name) {
                    continue;
                }
                if first.get_opt(&name).await.ok().flatten().is_some() {
                    overlaps.lock().expect("lock").push(name.clone());
                }
                seen.lock().expect("lock").push(name);
            }
        }
    });

    let mut client = gitops_shared::db::connect(&env.db.url(), "fleet-move-test").await.expect("connect");
    tenant_move(&mut client, env.tenant.name(), "argocd-2", "test").await.expect("move");
    // The tenant keeps working during the move: those changes wait for the release.
    for name in &names[1..] {
        let patch = json!({"spec": {"source": {"path": format!("apps/{name}/during-move")}}});
        env.deployments().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change");
    }
    eventually("the move settled on the second instance", || async {
        let placed = tenant_placements(&client, Some(env.tenant.name()), None).await.ok()?;
        let tenant = placed.first()?;
        (tenant.instance.as_deref() == Some("argocd-2") && tenant.move_state.is_none()).then_some(())
    })
    .await;
    eventually("every Application adopted by the second instance", || async {
        for app in &apps {
            target.get_opt(app).await.ok()??;
        }
        Some(())
    })
    .await;
    eventually("every deployment Ready on the second instance", || all_ready(&env, &names)).await;
    for app in &apps {
        assert!(first.get_opt(app).await.expect("read").is_none(), "{app} released by the first instance");
    }
    for (name, app) in names.iter().zip(&apps).skip(1) {
        let app = target.get(app).await.expect("read");
        let path = app.data.pointer("/spec/source/path").and_then(|p| p.as_str()).unwrap_or_default().to_owned();
        assert_eq!(path, format!("apps/{name}/during-move"), "the change made during the move is there");
    }
    eventually("the watch saw every adoption", || async {
        let seen = seen.lock().expect("lock").clone();
        apps.iter().all(|app| seen.contains(app)).then_some(())
    })
    .await;
    assert!(overlaps.lock().expect("lock").is_empty(), "held by both at once: {:?}", overlaps.lock());
    // Nothing was pruned: the second instance adopted each live object (same UID)
    // and wrote it last.
    for app in &apps {
        eventually("the live object adopted by the second instance", || async {
            let object = live.get_opt(app).await.ok()??;
            (object.annotations().get(WRITTEN_BY_ANNOTATION)? == second.name()).then_some(())
        })
        .await;
        let object = live.get(app).await.expect("live object");
        assert_eq!(object.metadata.uid.as_ref(), uids.get(app), "{app}'s live object adopted, not recreated");
    }
    assert!(pruned.lock().expect("lock").is_empty(), "pruned during the move: {:?}", pruned.lock());
    live_watch.abort();

    // After the move, changes go to the new instance.
    let patch = json!({"spec": {"source": {"path": "apps/moved"}}});
    env.deployments().patch(&names[0], &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change");
    eventually("the change reached the second instance", || async {
        let app = target.get_opt(&apps[0]).await.ok()??;
        (app.data.pointer("/spec/source/path")?.as_str()? == "apps/moved").then_some(())
    })
    .await;
    assert!(first.get_opt(&apps[0]).await.expect("read").is_none(), "nothing back on the first instance");
    watch.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_fleet_failover_fences_a_lost_instance_and_it_cleans_up_when_back() {
    use gitops_shared::db::engine_instance::{engine_instance_by_name, engine_instance_cordon};
    use std::time::Duration;

    let env = env_live("ffail").await;
    let db: String = env.client.query_one("SELECT current_database()", &[]).await.expect("name").get(0);
    env.client
        .batch_execute(&format!("ALTER DATABASE \"{db}\" SET gitops.instance_lost_after = '3 seconds'"))
        .await
        .expect("set the window");
    let (second, _standin2) = env.another_instance("argocd-2", "ffail", Duration::from_millis(300)).await;
    let (third, _standin3) = env.another_instance("argocd-3", "ffail", Duration::from_millis(300)).await;
    engine_instance_cordon(&env.client, crate::support::writer::INSTANCE, true).await.expect("cordon the first");
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| {
        c.fleet_watch_interval = Duration::from_millis(300);
        c.failover = Some(gitops_writer::fleet::FailoverSettings { grace: Duration::from_secs(2), batch: 20 });
    });
    let names: Vec<String> = (0..2).map(|i| format!("web-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        env.create(name, spec(REPO, &format!("apps/{i}"))).await;
    }
    eventually("every deployment Ready", || all_ready(&env, &names)).await;
    let apps = application_names(&env, &names).await;
    let on = |ns: &str| -> Api<DynamicObject> { Api::namespaced_with(env.kube.clone(), ns, &application_resource()) };
    let (lost_apps, new_apps) = (on(second.name()), on(third.name()));
    for app in &apps {
        assert!(lost_apps.get_opt(app).await.expect("read").is_some(), "{app} on the second instance");
    }
    // What the Applications deployed, written by the second instance.
    let live: Api<ConfigMap> = Api::namespaced(env.kube.clone(), env.tenant.name());
    let mut uids = std::collections::BTreeMap::new();
    for app in &apps {
        let object = eventually("the live object written by the second instance", || async {
            let object = live.get_opt(app).await.ok()??;
            (object.annotations().get(WRITTEN_BY_ANNOTATION)? == second.name()).then_some(object)
        })
        .await;
        uids.insert(app.clone(), object.metadata.uid.clone().expect("uid"));
    }
    // The home token the second instance's Argo CD holds, and the identity behind it.
    let (_, lost_token) = env.home_secret_in(second.name(), |_| true).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(env.kube.clone(), env.home.name());
    let account = home_account_name(env.namespace_uid().await);
    let first_uid = accounts.get(&account).await.expect("home ServiceAccount").metadata.uid;

    // The second instance's agent loses its Argo CD: lost, then fenced and failed over.
    let binding = crate::support::revoke_agent_access(&env.kube, second.name()).await;
    let client = gitops_shared::db::connect(&env.db.url(), "fleet-failover-test").await.expect("connect");
    eventually("the tenant placed on the third instance", || async {
        let placed = tenant_placements(&client, Some(env.tenant.name()), None).await.ok()?;
        let tenant = placed.first()?;
        (tenant.instance.as_deref() == Some("argocd-3") && tenant.move_state.is_none()).then_some(())
    })
    .await;
    let fenced = engine_instance_by_name(&client, "argocd-2").await.expect("instance");
    assert!(fenced.cordoned, "a fenced instance is cordoned");
    eventually("every Application adopted by the third instance", || async {
        for app in &apps {
            new_apps.get_opt(app).await.ok()??;
        }
        Some(())
    })
    .await;
    eventually("every deployment Ready on the third instance", || all_ready(&env, &names)).await;
    // Its home identity was replaced: the token the lost Argo CD holds is refused,
    // the third instance's works.
    eventually("a new home ServiceAccount", || async {
        let made = accounts.get_opt(&account).await.ok()??;
        (made.metadata.uid != first_uid).then_some(())
    })
    .await;
    let cluster = TestCluster::get().await;
    let tenant_ns = env.tenant.name().to_owned();
    eventually("a new home token on the third instance that works", || async {
        let (_, token) = env.home_secret_in(third.name(), |token| token != lost_token).await;
        let scoped = cluster.client_with_token(&token).await;
        Api::<ConfigMap>::namespaced(scoped, &tenant_ns).list(&ListParams::default()).await.ok()
    })
    .await;
    let scoped = cluster.client_with_token(&lost_token).await;
    let refused = Api::<ConfigMap>::namespaced(scoped, &tenant_ns).list(&ListParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 401),
        "the lost instance's home token is refused: {refused:?}"
    );
    // The lost instance could not be told: its Applications are still there.
    assert!(lost_apps.get_opt(&apps[0]).await.expect("read").is_some(), "nothing could reach the lost instance");

    // It comes back: before rejoining, it removes what is no longer its own.
    crate::support::restore_agent_access(&env.kube, second.name(), binding).await;
    eventually("the returning instance removed the tenant's Applications", || async {
        for app in &apps {
            if lost_apps.get_opt(app).await.ok()?.is_some() {
                return None;
            }
        }
        Some(())
    })
    .await;
    eventually("the fence lifted", || async {
        let row = client
            .query_one("SELECT fenced_at IS NULL FROM engine_instance WHERE name = 'argocd-2'", &[])
            .await
            .ok()?;
        row.get::<_, bool>(0).then_some(())
    })
    .await;
    let back = engine_instance_by_name(&client, "argocd-2").await.expect("instance");
    assert!(back.cordoned, "it rejoins cordoned");
    // Neither the failover nor the returning instance's clean-up pruned anything:
    // every live object is the one deployed before the loss. (The lost Argo CD kept
    // writing it while it ran: Argo CD itself cannot be fenced.)
    for app in &apps {
        let object = live.get(app).await.expect("the live object is still there");
        assert_eq!(object.metadata.uid.as_ref(), uids.get(app), "{app}'s live object adopted, not recreated");
    }
    for app in &apps {
        assert!(new_apps.get_opt(app).await.expect("read").is_some(), "{app} stays on the third instance");
    }
    eventually("still Ready", || all_ready(&env, &names)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_fleet_sweep_releases_what_a_moved_tenant_left_behind() {
    use std::time::Duration;

    use gitops_agent::engine::argocd::ArgoCdEngine;
    use gitops_agent::sweep::{SweepConfig, Sweeper};
    use gitops_shared::db::engine_instance::engine_instance_by_name;
    use gitops_testkit::argocd::{FINALIZER_KNOB, RESOURCES_FINALIZER};

    let env = env("fleft").await;
    let (second, _standin) = env.another_instance("argocd-2", "fleft", Duration::from_secs(15)).await;
    let _writer = env.writer("writer-a");
    let names = vec!["web".to_owned()];
    env.create(&names[0], spec(REPO, "apps/web")).await;
    eventually("Ready on the first instance", || all_ready(&env, &names)).await;
    let app = application_names(&env, &names).await.remove(0);
    let labels = env.apps().get(&app).await.expect("read").metadata.labels.unwrap_or_default();
    let mut client = gitops_shared::db::connect(&env.db.url(), "fleet-leftover-test").await.expect("connect");
    tenant_move(&mut client, env.tenant.name(), "argocd-2", "test").await.expect("move");
    let target: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), second.name(), &application_resource());
    eventually("adopted by the second instance", || async { target.get_opt(&app).await.ok()? }).await;
    eventually("released by the first", || async { env.apps().get_opt(&app).await.ok()?.is_none().then_some(()) })
        .await;

    // Something left the Application behind on the first instance (a restored
    // backup, say), with Argo CD's resources finalizer, which Argo CD would hold.
    let leftover: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": app, "labels": labels, "finalizers": [RESOURCES_FINALIZER],
                     "annotations": {FINALIZER_KNOB: "hang"}},
        "spec": {"project": "default", "source": {"repoURL": REPO, "path": "apps/web"},
                 "destination": {"server": "https://cluster.example.invalid", "namespace": "web"}},
    }))
    .expect("Application");
    env.apps().create(&Default::default(), &leftover).await.expect("create the leftover");
    let first = engine_instance_by_name(&client, crate::support::writer::INSTANCE).await.expect("instance");
    let sweeper = Sweeper {
        engine: std::sync::Arc::new(ArgoCdEngine::new(env.kube.clone(), env.argocd.name())),
        pool: env.db.pool(2),
        instance: first.id,
        config: SweepConfig {
            interval: Duration::from_secs(300),
            max_deletions: 50,
            dry_run: false,
            page_size: gitops_agent::sweep::PAGE_SIZE,
        },
        metrics: std::sync::Arc::default(),
        duty: None,
    };
    let plan = sweeper.sweep_once().await.expect("sweep");
    assert!(plan.deletions.is_empty(), "a row placed elsewhere is never queued for deletion here: {plan:?}");
    eventually("the leftover released without pruning (its finalizer would hang)", || async {
        env.apps().get_opt(&app).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(target.get_opt(&app).await.expect("read").is_some(), "the tenant's Application stays where it lives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_fleet_drain_moves_every_tenant_off_and_nothing_is_pruned() {
    let env = env_live("fdrain").await;
    let (second, _standin) = env.another_instance("argocd-2", "fdrain", std::time::Duration::from_secs(15)).await;
    let _writer = env.writer("writer-a");
    let names: Vec<String> = (0..2).map(|i| format!("web-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        env.create(name, spec(REPO, &format!("apps/{i}"))).await;
    }
    eventually("every deployment Ready on the first instance", || all_ready(&env, &names)).await;
    let apps = application_names(&env, &names).await;
    let live: Api<ConfigMap> = Api::namespaced(env.kube.clone(), env.tenant.name());
    let mut uids = std::collections::BTreeMap::new();
    for app in &apps {
        let object = eventually("the live object", || async { live.get_opt(app).await.ok()? }).await;
        uids.insert(app.clone(), object.metadata.uid.clone().expect("uid"));
    }

    let moved = gitopsctl::instance::drain(&env.db.url(), crate::support::writer::INSTANCE).await.expect("drain");
    assert_eq!(moved, 1, "the one tenant moves");
    let client = gitops_shared::db::connect(&env.db.url(), "fleet-drain-test").await.expect("connect");
    eventually("the tenant settled on the second instance", || async {
        let placed = tenant_placements(&client, Some(env.tenant.name()), None).await.ok()?;
        let tenant = placed.first()?;
        (tenant.instance.as_deref() == Some("argocd-2") && tenant.move_state.is_none()).then_some(())
    })
    .await;
    eventually("every deployment Ready on the second instance", || all_ready(&env, &names)).await;
    let (first, target) =
        (env.apps(), Api::<DynamicObject>::namespaced_with(env.kube.clone(), second.name(), &application_resource()));
    for app in &apps {
        assert!(first.get_opt(app).await.expect("read").is_none(), "{app} left the drained instance");
        eventually("the Application on the second instance", || async { target.get_opt(app).await.ok()? }).await;
        let object = live.get(app).await.expect("the live object is still there");
        assert_eq!(object.metadata.uid.as_ref(), uids.get(app), "{app}'s live object adopted, not recreated");
    }
    let listed = gitopsctl::instance::list(&env.db.url()).await.expect("list");
    let drained = listed.iter().find(|i| i.name == crate::support::writer::INSTANCE).expect("the first instance");
    assert!(drained.cordoned && drained.tenants == 0, "drained: cordoned and empty");
}

/// Whether deployment `name` in `namespace` is Ready at its generation; its
/// Application's name when it is.
async fn ready_in(kube: &kube::Client, namespace: &str, name: &str) -> Option<String> {
    let object = Api::<GitOpsDeployment>::namespaced(kube.clone(), namespace).get_opt(name).await.ok()??;
    let ready = object
        .status
        .as_ref()?
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation);
    let uid = object.metadata.uid.as_deref()?.parse().ok()?;
    ready.then(|| gitops_agent::names::application_name(uid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_fleet_rebalance_moves_a_tenant_to_the_emptier_instance() {
    use gitops_shared::db::engine_instance::engine_instance_cordon;
    use gitops_shared::db::fleet_balance::{BalanceSettings, balance_step};

    let env = env_live("fbal").await;
    let other = TestCluster::get().await.namespace("fbal-other").await;
    let (second, _standin) = env.another_instance("argocd-2", "fbal", std::time::Duration::from_secs(15)).await;
    // Both tenants land on the first instance.
    engine_instance_cordon(&env.client, "argocd-2", true).await.expect("cordon");
    let namespaces = [env.tenant.name().to_owned(), other.name().to_owned()];
    let _writer = env.writer_for("writer-a", namespaces.to_vec(), |_| {});
    for namespace in &namespaces {
        let object: GitOpsDeployment = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
            "metadata": {"name": "web"}, "spec": spec(REPO, &format!("apps/{namespace}")),
        }))
        .expect("GitOpsDeployment");
        Api::<GitOpsDeployment>::namespaced(env.kube.clone(), namespace)
            .create(&kube::api::PostParams::default(), &object)
            .await
            .expect("create");
    }
    let mut apps = Vec::new();
    for namespace in &namespaces {
        apps.push(eventually("Ready on the first instance", || ready_in(&env.kube, namespace, "web")).await);
    }
    let mut uids = Vec::new();
    for (namespace, app) in namespaces.iter().zip(&apps) {
        let live: Api<ConfigMap> = Api::namespaced(env.kube.clone(), namespace);
        let object = eventually("the live object", || async { live.get_opt(app).await.ok()? }).await;
        uids.push(object.metadata.uid.clone().expect("uid"));
    }

    // The second instance opens: 2 tenants against 0 are more than the threshold apart.
    engine_instance_cordon(&env.client, "argocd-2", false).await.expect("uncordon");
    let mut client = gitops_shared::db::connect(&env.db.url(), "fleet-rebalance-test").await.expect("connect");
    let settings = BalanceSettings { degraded_grace: None, rebalance_threshold: Some(0.0001), max_concurrent_moves: 5 };
    let step = balance_step(&mut client, settings).await.expect("balance");
    assert_eq!(step.moves.len(), 1, "one tenant moves: {step:?}");
    let moved = step.moves[0].clone();
    assert_eq!((moved.to.as_str(), moved.reason), ("argocd-2", "rebalance"));
    let index = namespaces.iter().position(|n| *n == moved.namespace).expect("one of the tenants");
    eventually("the tenant settled on the second instance", || async {
        let placed = tenant_placements(&client, Some(&moved.namespace), None).await.ok()?;
        let tenant = placed.first()?;
        (tenant.instance.as_deref() == Some("argocd-2") && tenant.move_state.is_none()).then_some(())
    })
    .await;
    eventually("Ready on the second instance", || ready_in(&env.kube, &moved.namespace, "web")).await;
    let target = Api::<DynamicObject>::namespaced_with(env.kube.clone(), second.name(), &application_resource());
    eventually("adopted by the second instance", || async { target.get_opt(&apps[index]).await.ok()? }).await;
    assert!(env.apps().get_opt(&apps[index]).await.expect("read").is_none(), "released by the first");
    let live: Api<ConfigMap> = Api::namespaced(env.kube.clone(), &moved.namespace);
    let object = live.get(&apps[index]).await.expect("the live object is still there");
    assert_eq!(object.metadata.uid.as_ref(), Some(&uids[index]), "adopted, not recreated");
    // One tenant each: balanced, nothing more moves.
    assert!(balance_step(&mut client, settings).await.expect("balance").moves.is_empty());
}
