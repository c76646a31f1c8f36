//! Anti-entropy: rows whose tenant resource went while no writer watched (its
//! finalizer stripped) are tombstoned by the next writer's pass, and their Argo CD
//! objects removed; a pass that would tombstone more than its cap tombstones none.

use std::sync::Arc;
use std::time::Duration;

use gitops_writer::controller::FINALIZER;
use gitops_writer::metrics::WriterMetrics;
use gitops_writer::work_queue::Kind;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::support::writer::{Env, env, manual, spec};
use crate::support::{eventually, short_id};
use gitops_testkit::argocd::SYNC_KNOB;

const REPO: &str = "https://git.example.invalid/team/app.git";

/// Creates deployments `names` with a running writer and waits for their Applications.
async fn deployed(env: &Env, names: &[String]) {
    let writer = env.writer("writer-a");
    for name in names {
        env.create(name, spec(REPO, "apps/web")).await;
    }
    eventually("every Application", || async {
        let apps = env.apps().list(&Env::tenant_apps_params()).await.ok()?;
        (apps.items.len() == names.len()).then_some(())
    })
    .await;
    env.stop_writer(writer, "writer-a").await;
}

/// What a tenant can do while no writer runs: strip the finalizer, then delete.
async fn delete_behind_the_writers_back(env: &Env, name: &str) {
    let patch = json!({"metadata": {"finalizers": null}});
    env.deployments().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("strip the finalizer");
    env.deployments().delete(name, &DeleteParams::default()).await.expect("delete");
    eventually("the deployment gone", || async { env.deployments().get_opt(name).await.ok()?.is_none().then_some(()) })
        .await;
}

async fn row_state(env: &Env, name: &str) -> String {
    env.client
        .query_one("SELECT row_state::text AS state FROM application WHERE resource_name = $1", &[&name])
        .await
        .expect("the row")
        .get("state")
}

#[tokio::test]
async fn writer_resync_tombstones_rows_of_resources_deleted_while_no_writer_watched() {
    let env = env("wr-gone").await;
    let (gone, kept) = (format!("gone-{}", short_id()), format!("kept-{}", short_id()));
    deployed(&env, &[gone.clone(), kept.clone()]).await;
    let object = env.deployments().get(&kept).await.expect("read");
    assert!(object.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER));
    delete_behind_the_writers_back(&env, &gone).await;
    assert_eq!(row_state(&env, &gone).await, "active", "no writer saw the deletion");

    let metrics = Arc::new(WriterMetrics::default());
    let _writer = env.writer_for("writer-b", vec![env.tenant.name().to_owned()], |c| {
        c.metrics = metrics.clone();
        // Only the pass at start can repair it.
        c.controllers.resync_interval = Duration::from_secs(3600);
    });
    eventually("the row of the gone deployment confirmed deleted", || async {
        (row_state(&env, &gone).await == "deleted").then_some(())
    })
    .await;
    eventually("only the kept Application", || async {
        let apps = env.apps().list(&Env::tenant_apps_params()).await.ok()?;
        (apps.items.len() == 1).then_some(apps)
    })
    .await;
    assert_eq!(row_state(&env, &kept).await, "active", "a deployment still there keeps its row");
    assert_eq!(metrics.resync_repairs(Kind::Deployment, "tombstoned"), 1);
    assert!(metrics.resync_passes.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}

#[tokio::test]
async fn writer_resync_tombstones_nothing_above_its_cap() {
    let env = env("wr-cap").await;
    let names: Vec<String> = (0..3).map(|i| format!("d{i}-{}", short_id())).collect();
    deployed(&env, &names).await;
    for name in &names[..2] {
        delete_behind_the_writers_back(&env, name).await;
    }

    let metrics = Arc::new(WriterMetrics::default());
    let _writer = env.writer_for("writer-b", vec![env.tenant.name().to_owned()], |c| {
        c.metrics = metrics.clone();
        c.controllers.resync_max_tombstones = 1;
    });
    eventually("the pass refused", || async { (metrics.resync_refusals("too_many_tombstones") >= 1).then_some(()) })
        .await;
    for name in &names {
        assert_eq!(row_state(&env, name).await, "active", "{name}: nothing tombstoned above the cap");
    }
    assert_eq!(metrics.resync_repairs(Kind::Deployment, "tombstoned"), 0);
    let apps = env.apps().list(&Env::tenant_apps_params()).await.expect("list");
    assert_eq!(apps.items.len(), names.len(), "every Application stays");
}

#[tokio::test]
async fn writer_resync_terminates_the_sync_of_a_sync_run_deleted_while_no_writer_watched() {
    let env = env("wr-sync").await;
    let writer = env.writer("writer-a");
    let (deployment, run) = (format!("web-{}", short_id()), format!("run-{}", short_id()));
    env.create(&deployment, manual(REPO, "apps/web")).await;
    let application = env.application_of(&deployment).await;
    eventually("the Application", || async { env.apps().get_opt(&application).await.ok()?.map(|_| ()) }).await;
    // Argo CD holds the sync running until told otherwise.
    let hold = json!({"metadata": {"annotations": {SYNC_KNOB: "hold"}}});
    env.apps().patch(&application, &PatchParams::default(), &Patch::Merge(&hold)).await.expect("hold syncs");
    env.create_sync_run(&run, &deployment, "v2").await;
    eventually("the sync running", || async {
        env.sync_state(&run).await.filter(|(state, _)| state == "running").map(|_| ())
    })
    .await;
    env.stop_writer(writer, "writer-a").await;

    let runs = env.sync_runs();
    let strip = json!({"metadata": {"finalizers": null}});
    runs.patch(&run, &PatchParams::default(), &Patch::Merge(&strip)).await.expect("strip the finalizer");
    runs.delete(&run, &DeleteParams::default()).await.expect("delete the SyncRun");
    eventually("the SyncRun gone", || async { runs.get_opt(&run).await.ok()?.is_none().then_some(()) }).await;
    assert_eq!(env.sync_state(&run).await.map(|s| s.0).as_deref(), Some("running"), "nobody saw it go");

    let metrics = Arc::new(WriterMetrics::default());
    let _writer = env.writer_for("writer-b", vec![env.tenant.name().to_owned()], |c| c.metrics = metrics.clone());
    let (state, _) = eventually("the running sync terminated", || async {
        env.sync_state(&run).await.filter(|(state, _)| state == "terminated")
    })
    .await;
    assert_eq!(state, "terminated");
    assert_eq!(metrics.resync_repairs(Kind::SyncRun, "tombstoned"), 1);
}
