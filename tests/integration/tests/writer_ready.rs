//! `Ready` on a GitOpsDeployment tells the truth: `True` once its current generation
//! is in Argo CD, synced and healthy; `False` with the reason while a new generation
//! waits for an agent that cannot reach Argo CD, and `True` again once it can.

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::support::writer::{Env, env, spec};
use crate::support::{eventually, restore_agent_access, revoke_agent_access, short_id};

const REPO: &str = "https://git.example.invalid/team/app.git";

/// (status, reason, message) of `Ready` when it speaks of the object's generation.
async fn ready(env: &Env, name: &str) -> Option<(String, String, String)> {
    let object = env.deployments().get_opt(name).await.ok()??;
    let status = object.status.as_ref()?;
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
    (ready.observed_generation == object.metadata.generation).then(|| {
        (ready.status.clone(), ready.reason.clone().unwrap_or_default(), ready.message.clone().unwrap_or_default())
    })
}

/// Waits for an event about `name` with `reason` of `type_` (`Normal`, `Warning`).
async fn wait_event(env: &Env, name: &str, reason: &str, type_: &str) -> Event {
    let events: Api<Event> = Api::namespaced(env.kube.clone(), env.tenant.name());
    eventually(&format!("a {type_} event {reason}"), || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some(type_)
        })
    })
    .await
}

async fn wait_ready(env: &Env, name: &str, what: &str, status: &str, reason: &str) -> String {
    eventually(what, || async { ready(env, name).await.filter(|(s, r, _)| s == status && r == reason).map(|r| r.2) })
        .await
}

#[tokio::test]
async fn writer_ready_follows_the_current_generation_through_an_unreachable_argocd() {
    let env = env("wr-ready").await;
    let _writer = env.writer("writer-a");
    let name = format!("web-{}", short_id());
    env.create(&name, spec(REPO, "apps/web")).await;
    wait_ready(&env, &name, "Ready once applied, synced and healthy", "True", "Ready").await;
    wait_event(&env, &name, "Accepted", "Normal").await;
    let ready = wait_event(&env, &name, "Ready", "Normal").await;
    assert_eq!(ready.reporting_controller.as_deref(), Some("gitops-service-writer"));

    // The agent loses its access to Argo CD; the tenant changes the deployment.
    let binding = revoke_agent_access(&env.kube, env.argocd.name()).await;
    let patch = json!({"spec": {"source": {"path": "apps/web-v2"}}});
    env.deployments().patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change the path");
    let message = wait_ready(&env, &name, "not Ready: Argo CD unavailable", "False", "ArgoCDUnavailable").await;
    assert!(message.contains("unavailable"), "the tenant reads why: {message}");
    let warning = wait_event(&env, &name, "ArgoCDUnavailable", "Warning").await;
    assert!(warning.note.as_deref().is_some_and(|n| n.contains("unavailable")), "{warning:?}");
    let object = env.deployments().get(&name).await.expect("read");
    let conditions = object.status.map(|s| s.conditions).unwrap_or_default();
    let of = |t: &str| conditions.iter().find(|c| c.type_ == t).map(|c| c.status.clone());
    assert_eq!((of("Reconciling"), of("Stalled")), (Some("True".into()), Some("False".into())), "retried, not stuck");

    // Access comes back: the new generation reaches Argo CD and Ready follows.
    restore_agent_access(&env.kube, env.argocd.name(), binding).await;
    wait_ready(&env, &name, "Ready again at the new generation", "True", "Ready").await;

    // Deleting it is an event too.
    env.deployments().delete(&name, &DeleteParams::default()).await.expect("delete");
    wait_event(&env, &name, "Deleted", "Normal").await;
}

#[tokio::test]
async fn writer_ready_says_when_a_deletion_is_stuck_and_the_deletion_still_finishes() {
    use gitops_testkit::argocd::FINALIZER_KNOB;
    use gitops_writer::controller::WAIT_FOR_PRUNING;

    let env = env("wr-stuck").await;
    let _writer = env.writer("writer-a");
    let name = format!("web-{}", short_id());
    let object: gitops_writer::api::GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
        "metadata": {"name": name, "annotations": {WAIT_FOR_PRUNING: "true"}},
        "spec": spec(REPO, "apps/web"),
    }))
    .expect("GitOpsDeployment");
    env.deployments().create(&Default::default(), &object).await.expect("create");
    wait_ready(&env, &name, "Ready", "True", "Ready").await;
    // Argo CD will not let go of the Application (its resources finalizer hangs).
    let app = env.application_of(&name).await;
    let hang = json!({"metadata": {"annotations": {FINALIZER_KNOB: "hang"}}});
    env.apps().patch(&app, &PatchParams::default(), &Patch::Merge(&hang)).await.expect("hang knob");
    env.deployments().delete(&name, &DeleteParams::default()).await.expect("delete");
    let message = eventually("Ready=False DeletionStuck", || async {
        let object = env.deployments().get_opt(&name).await.ok()??;
        let ready = object.status?.conditions.into_iter().find(|c| c.type_ == "Ready")?;
        (ready.status == "False" && ready.reason.as_deref() == Some("DeletionStuck")).then_some(ready.message?)
    })
    .await;
    assert!(message.contains("finalizer"), "the tenant reads why: {message}");

    // Argo CD lets go: the deletion finishes by itself.
    let release = json!({"metadata": {"annotations": {FINALIZER_KNOB: null}}});
    env.apps().patch(&app, &PatchParams::default(), &Patch::Merge(&release)).await.expect("release knob");
    eventually("the GitOpsDeployment gone", || async {
        env.deployments().get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
}

#[tokio::test]
async fn writer_ready_says_when_the_argocd_instance_is_degraded_or_lost() {
    use gitops_shared::db::engine_instance::engine_instance_cordon;
    use gitops_testkit::argocd::{self, StandinOptions};

    let env = env("wr-inst").await;
    // Short windows for this test's database (new sessions read them).
    let db: String = env.client.query_one("SELECT current_database()", &[]).await.expect("name").get(0);
    env.client
        .batch_execute(&format!(
            "ALTER DATABASE \"{db}\" SET gitops.instance_degraded_after = '4 seconds';
             ALTER DATABASE \"{db}\" SET gitops.instance_lost_after = '3 seconds'"
        ))
        .await
        .expect("set the windows");
    // Probes a little over a second apart: Argo CD's `reconciledAt` has a resolution of
    // a second, and progress must be seen in three probes in a row.
    let (second, standin) = env.another_instance("argocd-2", "wr-inst", std::time::Duration::from_millis(1100)).await;
    engine_instance_cordon(&env.client, crate::support::writer::INSTANCE, true).await.expect("cordon the first");
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| {
        c.fleet_watch_interval = std::time::Duration::from_millis(300);
    });
    let name = format!("web-{}", short_id());
    env.create(&name, spec(REPO, "apps/web")).await;
    wait_ready(&env, &name, "Ready on the second instance", "True", "Ready").await;

    // Argo CD stops; its agent still reaches the API.
    standin.cancel();
    let message = wait_ready(&env, &name, "not Ready: instance degraded", "False", "InstanceDegraded").await;
    assert!(message.contains("not making progress"), "{message}");
    // It comes back.
    let again = env.cancel.child_token();
    tokio::spawn({
        let (kube, ns, cancel) = (env.kube.clone(), second.name().to_owned(), again.clone());
        async move { argocd::run(kube, &ns, StandinOptions::default(), cancel).await }
    });
    wait_ready(&env, &name, "Ready again", "True", "Ready").await;

    // The agent loses the API: no heartbeat, the instance is lost.
    let binding = revoke_agent_access(&env.kube, second.name()).await;
    wait_ready(&env, &name, "not Ready: instance lost", "False", "InstanceLost").await;
    restore_agent_access(&env.kube, second.name(), binding).await;
    wait_ready(&env, &name, "Ready once more", "True", "Ready").await;
}
