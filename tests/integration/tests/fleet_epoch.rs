//! Fencing in the statements: an agent's status writes land only while the tenant is
//! placed on its instance and the instance is at the epoch the agent writes at and not
//! fenced. Raced with real connections: once a fence committed, no write from the
//! fenced epoch, nor from an instance the tenant is not placed on, lands.

use std::time::Duration;

use gitops_shared::db::application_state::{
    AgentOutcome, ObservedApplication, application_state_record_outcome, application_state_upsert,
};
use gitops_shared::db::engine_instance::{
    InstanceEpoch, engine_instance_add, engine_instance_cordon, engine_instance_heartbeat,
};
use gitops_shared::db::failover::{failover_step, instance_fenced, instance_unfence};
use gitops_shared::model::{ApplicationId, EngineInstanceId, TenantId};
use gitops_testkit::TestDb;
use serde_json::json;
use tokio_postgres::Client;
use uuid::Uuid;

/// Instances `a` and `b`, and a tenant on `a` with one application row.
async fn fixture(client: &Client) -> (EngineInstanceId, EngineInstanceId, TenantId, ApplicationId) {
    let a = engine_instance_add(client, "a", "argo-a", 10).await.expect("add");
    let b = engine_instance_add(client, "b", "argo-b", 10).await.expect("add");
    for id in [a, b] {
        engine_instance_heartbeat(client, id).await.expect("heartbeat");
    }
    let tenant: i64 = client
        .query_one(
            "INSERT INTO tenant (namespace_uid, namespace_name, engine_instance_id) VALUES ($1, 'team-a', $2) RETURNING id",
            &[&Uuid::new_v4(), &a.0],
        )
        .await
        .expect("tenant")
        .get(0);
    let application = crate::support::application_row(client, tenant).await;
    (a, b, TenantId(tenant), ApplicationId(application))
}

fn observed(application: ApplicationId, tenant: TenantId, health: &str) -> ObservedApplication {
    ObservedApplication {
        application_id: application,
        tenant_id: tenant,
        sync_status: Some("Synced".into()),
        sync_revision: Some("abc".into()),
        health_status: Some(health.into()),
        health_message: None,
        resources: json!([]),
        conditions: json!([]),
        operation_state: None,
        reconciled_state: None,
    }
}

async fn stored_health(client: &Client, application: ApplicationId) -> Option<String> {
    client
        .query_opt("SELECT health_status FROM application_state WHERE application_id = $1", &[&application.0])
        .await
        .expect("read")
        .and_then(|row| row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn status_lands_only_from_the_placed_instance_at_its_current_epoch() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let (a, b, tenant, application) = fixture(&client).await;
    let at_a = InstanceEpoch::new(a, 0);
    let at_b = InstanceEpoch::new(b, 0);

    // The placed instance at its epoch writes; another instance does not.
    assert!(
        application_state_upsert(&client, &at_a, &observed(application, tenant, "Healthy")).await.unwrap().is_some()
    );
    assert!(
        application_state_upsert(&client, &at_b, &observed(application, tenant, "Degraded")).await.unwrap().is_none()
    );
    assert_eq!(stored_health(&client, application).await.as_deref(), Some("Healthy"));

    // `a` is lost past the grace with nowhere to go (`b` cordoned): the failover
    // step fences it and the tenant stays placed on it for now.
    engine_instance_cordon(&client, "b", true).await.expect("cordon");
    client
        .execute("UPDATE engine_instance SET heartbeat_at = now() - interval '1 hour' WHERE id = $1", &[&a.0])
        .await
        .expect("age the heartbeat");
    let step = failover_step(&mut client, Duration::ZERO, 10, Duration::from_secs(60)).await.expect("failover");
    assert_eq!((step.fenced.as_slice(), step.unplaced), (["a".to_owned()].as_slice(), 1));
    let (fenced, epoch) = instance_fenced(&client, a).await.expect("fence");
    assert!(fenced && epoch == 1, "fenced at epoch 1, was {epoch}");

    // Many writers from the fenced epoch at once, on connections of their own: none
    // lands, although the tenant is still placed on `a`.
    let writers = (0..16).map(|i| {
        let url = db.url();
        let at_a = at_a.clone();
        tokio::spawn(async move {
            let client = gitops_shared::db::connect(&url, "stale-writer").await.expect("connect");
            let written =
                application_state_upsert(&client, &at_a, &observed(application, tenant, &format!("Stale{i}")))
                    .await
                    .expect("upsert");
            let outcome = AgentOutcome::Failed { message: "stale".into(), stalled: true };
            application_state_record_outcome(&client, &at_a, application, &outcome).await.expect("outcome");
            written
        })
    });
    for writer in writers {
        assert!(writer.await.expect("writer").is_none(), "a write from a fenced epoch landed");
    }
    assert_eq!(stored_health(&client, application).await.as_deref(), Some("Healthy"));
    let message: Option<String> = client
        .query_one("SELECT agent_message FROM application_state WHERE application_id = $1", &[&application.0])
        .await
        .expect("read")
        .get(0);
    assert_eq!(message, None, "no outcome from the fenced epoch");

    // The fence lifted (its agent cleaned up): the old epoch still writes nothing, the
    // new one does.
    instance_unfence(&client, a).await.expect("unfence");
    assert!(application_state_upsert(&client, &at_a, &observed(application, tenant, "Stale")).await.unwrap().is_none());
    let (_, epoch) = instance_fenced(&client, a).await.expect("fence");
    at_a.set(epoch);
    assert!(
        application_state_upsert(&client, &at_a, &observed(application, tenant, "Missing")).await.unwrap().is_some()
    );
    assert_eq!(stored_health(&client, application).await.as_deref(), Some("Missing"));

    // With room on `b`, the next step fences `a` again and places the tenant on `b`:
    // `a` writes nothing at any epoch, `b` writes.
    engine_instance_cordon(&client, "b", false).await.expect("uncordon");
    let step = failover_step(&mut client, Duration::ZERO, 10, Duration::from_secs(60)).await.expect("failover");
    assert_eq!(step.moved, [tenant]);
    let (_, epoch) = instance_fenced(&client, a).await.expect("fence");
    instance_unfence(&client, a).await.expect("unfence");
    at_a.set(epoch);
    assert!(application_state_upsert(&client, &at_a, &observed(application, tenant, "Stale")).await.unwrap().is_none());
    assert!(
        application_state_upsert(&client, &at_b, &observed(application, tenant, "Progressing"))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(stored_health(&client, application).await.as_deref(), Some("Progressing"));
}

#[tokio::test]
async fn a_fenced_instance_claims_nothing_until_its_fence_is_lifted() {
    use gitops_shared::model::ResourceType;
    use gitops_shared::queue::{operation_claim, operation_enqueue_in_txn};

    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let (a, b, tenant, application) = fixture(&client).await;
    engine_instance_cordon(&client, "b", true).await.expect("cordon");
    let txn = client.transaction().await.expect("begin");
    operation_enqueue_in_txn(&txn, a, tenant, ResourceType::Application, application.0).await.expect("enqueue");
    txn.commit().await.expect("commit");
    client
        .execute("UPDATE engine_instance SET heartbeat_at = now() - interval '1 hour' WHERE id = $1", &[&a.0])
        .await
        .expect("age the heartbeat");
    let step = failover_step(&mut client, Duration::ZERO, 10, Duration::from_secs(60)).await.expect("failover");
    assert_eq!(step.fenced, ["a"], "fenced; the tenant stays (b is cordoned)");
    let lease = Duration::from_secs(30);
    assert!(operation_claim(&client, a, "a-agent", 10, lease).await.expect("claim").is_empty(), "fenced: nothing");
    instance_unfence(&client, a).await.expect("unfence");
    let claimed = operation_claim(&client, a, "a-agent", 10, lease).await.expect("claim");
    assert_eq!(claimed.iter().map(|op| op.resource_id).collect::<Vec<_>>(), [application.0]);
    let _ = b;
}
