//! The writers' status feed in SQL: a state row is read in its tenant's shard (and
//! follows the tenant if the shard is recorded later), and a read walks the rows
//! past the cursor, not every tenant of the shard.

use gitops_shared::db::application::application_upsert_in_txn;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_shared::db::status_feed::{FEED_READ, FeedRow, STATUS_FEED_BATCH, status_feed_read};
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::model::{EngineInstanceId, TenantId};
use gitops_testkit::TestDb;
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::intent;

const WRITER: &str = "feed-reader";

async fn own(client: &Client, shard: i32) {
    client
        .execute(
            "UPDATE writer_shard SET writer_id = $2, lease_expires_at = now() + interval '1 hour' WHERE shard = $1",
            &[&shard, &WRITER],
        )
        .await
        .expect("claim the shard");
}

/// `count` tenants of `shard` (None: not recorded yet), each with one application
/// and its observed state; returns the tenants and their applications.
async fn tenants_with_state(
    client: &mut Client,
    instance: EngineInstanceId,
    shard: Option<i32>,
    count: usize,
) -> Vec<(TenantId, i64)> {
    let txn = client.transaction().await.expect("begin");
    let mut made = Vec::with_capacity(count);
    for _ in 0..count {
        let name = format!("team-{}", &Uuid::new_v4().simple().to_string()[..12]);
        let tenant = tenant_upsert_locked_in_txn(&txn, Uuid::new_v4(), &name, Some(instance)).await.expect("tenant");
        txn.execute("UPDATE tenant SET writer_shard = $1 WHERE id = $2", &[&shard, &tenant.id.0]).await.expect("shard");
        let app = application_upsert_in_txn(&txn, tenant.id, &intent(Uuid::new_v4(), 1))
            .await
            .expect("upsert")
            .expect("a new row");
        txn.execute(
            "INSERT INTO application_state (application_id, tenant_id, sync_status, health_status)
             VALUES ($1, $2, 'Synced', 'Healthy')",
            &[&app.0, &tenant.id.0],
        )
        .await
        .expect("state");
        made.push((tenant.id, app.0));
    }
    txn.commit().await.expect("commit");
    made
}

async fn applications_read(client: &Client, shard: i32) -> Vec<i64> {
    let rows = status_feed_read(client, shard, WRITER, STATUS_FEED_BATCH).await.expect("read the feed");
    rows.iter()
        .filter_map(|row| match row {
            FeedRow::Application(row) => Some(row.application_id.0),
            FeedRow::Resource(_) => None,
        })
        .collect()
}

/// Moves the shard's cursor past every state row written so far, as a writer does
/// once it has handled them. (The snapshot's xmin would do in a writer, but other
/// tests' transactions on the same server hold it back.)
async fn catch_up(client: &Client, shard: i32) {
    client
        .execute(
            "UPDATE writer_shard
                SET status_xid = (SELECT (max(x) + 1)::text::xid8
                                    FROM (SELECT max(changed_xid::text::bigint) AS x FROM application_state
                                          UNION ALL
                                          SELECT max(changed_xid::text::bigint) FROM resource_state) m)
              WHERE shard = $1",
            &[&shard],
        )
        .await
        .expect("move the cursor");
}

#[tokio::test]
async fn state_rows_are_read_in_their_tenants_shard_and_follow_it_when_recorded() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let instance = engine_instance_add(&client, "argocd-1", "argocd", 1000).await.expect("add instance");
    own(&client, 3).await;
    own(&client, 4).await;
    let in_three = tenants_with_state(&mut client, instance, Some(3), 2).await;
    let unrecorded = tenants_with_state(&mut client, instance, None, 1).await;

    let mut expected: Vec<i64> = in_three.iter().map(|(_, app)| *app).collect();
    expected.sort_unstable();
    let mut read = applications_read(&client, 3).await;
    read.sort_unstable();
    assert_eq!(read, expected, "shard 3 reads its tenants' rows");
    assert_eq!(applications_read(&client, 4).await, Vec::<i64>::new(), "shard 4 has no tenant yet");

    // Both readers are past every row; then the shard of the unrecorded tenant is
    // recorded, and that of a tenant of shard 3 changes: each row is read by its new
    // shard only, although its last change is older than that shard's cursor.
    catch_up(&client, 3).await;
    catch_up(&client, 4).await;
    assert_eq!(applications_read(&client, 3).await, Vec::<i64>::new());
    let (moved, moved_app) = in_three[0];
    let (late, late_app) = unrecorded[0];
    for tenant in [moved, late] {
        client.execute("UPDATE tenant SET writer_shard = 4 WHERE id = $1", &[&tenant.0]).await.expect("record");
    }
    let mut read = applications_read(&client, 4).await;
    read.sort_unstable();
    let mut expected = vec![moved_app, late_app];
    expected.sort_unstable();
    assert_eq!(read, expected, "shard 4 reads the rows of the tenants now in it");
    assert_eq!(applications_read(&client, 3).await, Vec::<i64>::new(), "shard 3 no longer reads them");

    // A later write of a state row keeps its tenant's shard.
    catch_up(&client, 4).await;
    client
        .execute("UPDATE application_state SET health_status = 'Degraded' WHERE application_id = $1", &[&late_app])
        .await
        .expect("observe");
    assert_eq!(applications_read(&client, 4).await, vec![late_app]);
    let shard: Option<i32> = client
        .query_one("SELECT writer_shard FROM application_state WHERE application_id = $1", &[&late_app])
        .await
        .expect("row")
        .get(0);
    assert_eq!(shard, Some(4));
}

#[tokio::test]
async fn a_feed_read_walks_the_rows_past_the_cursor_not_the_shards_tenants() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    own(&client, 5).await;
    // 100 tenants in each of the 64 shards with two applications and a repository
    // credential each, every state handled already; the feed's statistics see them all.
    client
        .batch_execute(
            "INSERT INTO tenant (namespace_uid, namespace_name, writer_shard)
             SELECT gen_random_uuid(), 'team-' || g, g % 64 FROM generate_series(1, 6400) g;
             INSERT INTO application (tenant_id, resource_uid, resource_name, generation, repo_url, path,
                                      destination_namespace, sync_type)
             SELECT t.id, gen_random_uuid(), 'app-' || k, 1, 'https://git.example.invalid/team/repo.git',
                    'deploy', t.namespace_name, 'automated'
               FROM tenant t CROSS JOIN generate_series(1, 2) k;
             INSERT INTO application_state (application_id, tenant_id, sync_status, health_status)
             SELECT id, tenant_id, 'Synced', 'Healthy' FROM application;
             INSERT INTO repository_credential (tenant_id, resource_uid, resource_name, generation, repo_url,
                                                secret_name)
             SELECT id, gen_random_uuid(), 'creds', 1, 'https://git.example.invalid/team/repo.git', 'creds'
               FROM tenant;
             INSERT INTO resource_state (repository_credential_id, tenant_id, applied_generation)
             SELECT id, tenant_id, 1 FROM repository_credential;
             ANALYZE tenant; ANALYZE application; ANALYZE application_state; ANALYZE resource_state;",
        )
        .await
        .expect("fill");
    catch_up(&client, 5).await;
    let changed: i64 = client
        .query_one(
            "UPDATE application_state SET sync_status = 'OutOfSync'
              WHERE application_id = (SELECT min(application_id) FROM application_state WHERE writer_shard = 5)
             RETURNING application_id",
            &[],
        )
        .await
        .expect("observe")
        .get(0);

    // The writer keeps the read prepared, so the generic plan is the one that runs.
    let txn = client.transaction().await.expect("begin");
    txn.batch_execute("SET LOCAL plan_cache_mode = force_generic_plan").await.expect("plan mode");
    let plan: Vec<String> = txn
        .query(&format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {FEED_READ}"), &[&5i32, &WRITER, &500i64])
        .await
        .expect("explain")
        .iter()
        .map(|row| row.get(0))
        .collect();
    txn.rollback().await.expect("rollback");
    let plan = plan.join("\n");

    for index in ["application_state_shard_xid_idx", "resource_state_shard_xid_idx"] {
        assert!(plan.contains(index), "the feed must read {index}:\n{plan}");
    }
    assert!(!plan.contains("tenant_writer_shard_idx"), "no walk over the shard's tenants:\n{plan}");
    assert!(!plan.contains("Seq Scan on application_state"), "no sequential scan:\n{plan}");
    // One changed row of 400 tenants: a few pages, not one probe per tenant.
    // The top node's figures come first and include every node below it.
    let buffers: i64 = plan
        .lines()
        .find(|line| line.trim_start().starts_with("Buffers:"))
        .map(|line| line.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<i64>().ok()).sum())
        .expect("the plan reports buffers");
    assert!(buffers < 100, "{buffers} buffers for one changed row of the shard's 100 tenants:\n{plan}");
    assert_eq!(applications_read(&client, 5).await, vec![changed]);
}
