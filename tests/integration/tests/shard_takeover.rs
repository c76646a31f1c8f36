//! Writer shards when a writer crashes or is not ready: the shard keepers of several
//! writers race on the real `writer_shard` rows, and the times a takeover took are
//! read from the database's record of every lease, measured against the lease. A
//! whole writer whose Kubernetes API does not answer takes no shard.

use std::time::{Duration, SystemTime};

use gitops_shared::crypto::SecretBox;
use gitops_shared::db::writer_shard::{writer_shard_fence_in_txn, writer_shard_hand_over};
use gitops_testkit::TestDb;
use gitops_writer::run::{WriterConfig, run_writer};
use gitops_writer::shard::{SHARDS, ShardConfig};
use tokio_util::sync::CancellationToken;

use crate::support::shard::*;
use crate::support::{eventually, short_id};

/// How much later than its lease a crashed writer's shard may be taken.
const SLACK: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_writers_shards_go_to_the_survivor_within_a_lease_and_a_second() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    record_shard_changes(&client).await;
    // A round every 2 s: waiting for the next round after an expiry could take up to
    // 2 s, more than the slack; only looking again at the expiry itself keeps within it.
    let config = ShardConfig { lease: Duration::from_secs(3), interval: Duration::from_secs(2) };
    let doomed = Keeper::start(&db, "doomed", config, true);
    eventually("the first writer to hold every shard", || async {
        (live_owners(&client).await.get("doomed") == Some(&i64::from(SHARDS))).then_some(())
    })
    .await;
    let survivor = Keeper::start(&db, "survivor", config, true);
    eventually("the second writer to hold a shard", || async {
        live_owners(&client).await.contains_key("survivor").then_some(())
    })
    .await;

    doomed.crash().await;
    eventually("the survivor to hold every shard", || async {
        let owners = live_owners(&client).await;
        (owners.get("survivor") == Some(&i64::from(SHARDS)) && survivor.holds() == SHARDS as usize).then_some(owners)
    })
    .await;

    let crashed_renewal = last_renewal(&client, "doomed", config.lease).await;
    let taken: Vec<Handover> = handovers(&client, config.lease)
        .await
        .into_iter()
        .filter(|handover| handover.from == "doomed" && handover.renewed_at >= crashed_renewal)
        .collect();
    assert!(!taken.is_empty(), "the crashed writer held shards at its last renewal");
    assert!(taken.iter().all(|handover| handover.to == "survivor"), "{taken:?}");
    let last = taken.iter().max_by_key(|handover| handover.at).expect("a handover");
    assert!(last.at >= crashed_renewal + config.lease, "the last of them was taken once its lease ran out: {last:?}");
    assert!(
        last.since_renewal() <= config.lease + SLACK,
        "every shard taken within the lease and {SLACK:?} of the crashed writer's last renewal; the last after {:?}",
        last.since_renewal()
    );
    survivor.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_shard_goes_ownerless_beyond_a_lease_while_writers_crash_and_rebalance() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    record_shard_changes(&client).await;
    let config = ShardConfig { lease: Duration::from_secs(2), interval: Duration::from_millis(500) };
    let first = Keeper::start(&db, "first", config, true);
    let second = Keeper::start(&db, "second", config, true);
    let doomed = Keeper::start(&db, "doomed", config, true);
    // The first ready writer takes every free shard; the others take and are given
    // one per round until each holds a part.
    eventually("the three writers to share the shards", || async {
        let owners = live_owners(&client).await;
        (owners.len() == 3 && owners.values().all(|&held| held >= 16)).then_some(())
    })
    .await;

    doomed.crash().await;
    eventually("the two survivors to hold every shard", || async {
        let owners = live_owners(&client).await;
        let held: i64 = owners.values().sum();
        (!owners.contains_key("doomed") && held == i64::from(SHARDS)).then_some(())
    })
    .await;
    eventually("the survivors to split the shards evenly", || async {
        let owners = live_owners(&client).await;
        let half = i64::from(SHARDS / 2);
        (owners.get("first") == Some(&half) && owners.get("second") == Some(&half)).then_some(())
    })
    .await;

    // Fairness moved shards straight from writer to writer: none was let go.
    let let_go: i64 = client
        .query_one("SELECT count(*) FROM test_shard_change WHERE writer_id IS NULL", &[])
        .await
        .expect("shards let go")
        .get(0);
    assert_eq!(let_go, 0, "no shard was left without an owner while the writers rebalanced");
    let all = handovers(&client, config.lease).await;
    assert!(all.iter().any(|handover| handover.from == "doomed"), "the crashed writer's shards changed hands");
    for handover in &all {
        assert!(
            handover.since_renewal() <= config.lease + SLACK,
            "shard {} went without an owner for longer than the lease and {SLACK:?}: {handover:?}",
            handover.shard
        );
    }
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_is_not_ready_takes_no_free_shard_and_takes_them_all_once_ready() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    record_shard_changes(&client).await;
    // Alone, and with a timer that does not fire within the test: after its first
    // round only becoming ready wakes it.
    let config = ShardConfig { lease: Duration::from_secs(2), interval: Duration::from_secs(3600) };
    let waiting = Keeper::start(&db, "waiting", config, false);
    eventually("the writer's first round", || async {
        (statements_of(&client, &session_of("waiting")).await.0 >= 1).then_some(())
    })
    .await;
    assert!(live_owners(&client).await.is_empty(), "free shards stay free while no writer is ready");
    assert_eq!(waiting.holds(), 0);

    waiting.ready.send_replace(true);
    eventually("the writer, now ready, to take every shard", || async {
        let owners = live_owners(&client).await;
        (owners.get("waiting") == Some(&i64::from(SHARDS)) && waiting.holds() == SHARDS as usize).then_some(())
    })
    .await;
    waiting.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_is_not_ready_takes_nothing_from_a_ready_one_and_its_share_once_ready() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    record_shard_changes(&client).await;
    let config = ShardConfig { lease: Duration::from_secs(2), interval: Duration::from_millis(200) };
    let serving = Keeper::start(&db, "serving", config, true);
    eventually("the ready writer to hold every shard", || async {
        (live_owners(&client).await.get("serving") == Some(&i64::from(SHARDS))).then_some(())
    })
    .await;
    let waiting = Keeper::start(&db, "waiting", config, false);
    eventually("the unready writer to run three rounds", || async {
        (statements_of(&client, &session_of("waiting")).await.0 >= 3).then_some(())
    })
    .await;
    let owners = live_owners(&client).await;
    assert_eq!(owners.get("serving"), Some(&i64::from(SHARDS)), "nothing taken from the ready writer: {owners:?}");
    assert_eq!(waiting.holds(), 0);

    waiting.ready.send_replace(true);
    eventually("the two writers to split the shards evenly", || async {
        let owners = live_owners(&client).await;
        let half = i64::from(SHARDS / 2);
        (owners.get("serving") == Some(&half) && owners.get("waiting") == Some(&half)).then_some(())
    })
    .await;
    for handover in handovers(&client, config.lease).await {
        assert!(
            handover.since_renewal() <= config.lease + SLACK,
            "shard {} went without an owner for longer than the lease and {SLACK:?}: {handover:?}",
            handover.shard
        );
    }
    serving.stop().await;
    waiting.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_kubernetes_api_does_not_answer_takes_no_shard() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    record_shard_changes(&client).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let kubeconfig = std::env::temp_dir().join(format!("unreachable-{}.kubeconfig", short_id()));
    let config = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": format!("https://127.0.0.1:{port}"), "insecure-skip-tls-verify": true}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    });
    std::fs::write(&kubeconfig, config.to_string()).expect("write a kubeconfig");
    let key = SecretBox::generate_key("k1").expect("key");
    let secrets = SecretBox::from_config(Some(&key), Some("k1")).expect("secrets");
    let mut config = WriterConfig::new(db.url(), secrets, "unreachable".into());
    config.kubeconfig = Some(kubeconfig.clone());
    config.metrics_address = "127.0.0.1:0".parse().expect("address");
    config.shards = ShardConfig { lease: Duration::from_secs(2), interval: Duration::from_millis(200) };
    let metrics = config.metrics.clone();
    let cancel = CancellationToken::new();
    let writer = tokio::spawn(run_writer(config, cancel.clone()));

    // The writer's own sessions renew (nothing) every round.
    eventually("the writer's shard keeper to run three rounds", || async {
        (statements_of(&client, "gitops-writer").await.0 >= 3).then_some(())
    })
    .await;
    assert!(!metrics.is_ready(), "no watcher could list");
    assert!(live_owners(&client).await.is_empty(), "every shard stays free for a writer that can serve it");
    cancel.cancel();
    writer.await.expect("the writer task").expect("the writer stops cleanly");
    std::fs::remove_file(kubeconfig).expect("remove the kubeconfig");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_is_handed_over_only_to_a_writer_that_renewed_lately_and_after_the_givers_fence() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let lease = Duration::from_secs(30);
    let fresh = Duration::from_secs(2);
    for (shard, writer, renewed_ago) in [(1_i32, "giver", 0_i64), (2, "giver", 0), (3, "fresh", 1), (4, "stale", 10)] {
        client
            .execute(
                "UPDATE writer_shard SET writer_id = $2,
                        lease_expires_at = now() + $3::bigint * interval '1 second' WHERE shard = $1",
                &[&shard, &writer, &(30 - renewed_ago)],
            )
            .await
            .expect("hold a shard");
    }
    let expiry = |shard: i32| {
        let client = &client;
        async move {
            let row = client
                .query_one("SELECT writer_id, lease_expires_at FROM writer_shard WHERE shard = $1", &[&shard])
                .await
                .expect("shard row");
            (row.get::<_, Option<String>>(0), row.get::<_, Option<SystemTime>>(1))
        }
    };

    // A writer silent for longer than `fresh` is not handed anything.
    assert!(!writer_shard_hand_over(&client, "giver", 1, "stale", lease, fresh).await.expect("hand over"));
    assert!(!writer_shard_hand_over(&client, "giver", 1, "nobody", lease, fresh).await.expect("hand over"));
    assert_eq!(expiry(1).await.0.as_deref(), Some("giver"));
    // Nor can a writer hand over a shard it does not hold.
    assert!(!writer_shard_hand_over(&client, "stale", 1, "fresh", lease, fresh).await.expect("hand over"));

    // The giver's fenced transaction on shard 1 is open: the hand-over waits for it.
    let mut giver = db.connect().await;
    let fenced = giver.transaction().await.expect("begin");
    assert!(writer_shard_fence_in_txn(&fenced, 1, "giver").await.expect("fence"));
    let lock_timeout = |row: tokio_postgres::Row| row.get::<_, String>(0);
    assert_eq!(
        lock_timeout(fenced.query_one("SHOW lock_timeout", &[]).await.expect("show")),
        "2s",
        "a fenced transaction waits for no lock longer than 2 s"
    );
    let handing = {
        let db_client = db.connect().await;
        tokio::spawn(async move {
            writer_shard_hand_over(&db_client, "giver", 1, "fresh", lease, fresh).await.expect("hand over")
        })
    };
    eventually("the hand-over to wait for the giver's fence", || async {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE writer_shard s%'",
                &[],
            )
            .await
            .expect("waiting sessions")
            .get(0);
        (waiting == 1).then_some(())
    })
    .await;
    assert_eq!(expiry(1).await.0.as_deref(), Some("giver"), "still the giver's while its fence holds");
    fenced.commit().await.expect("commit");
    assert!(handing.await.expect("join"), "handed over once the fence ended");
    assert_eq!(
        lock_timeout(giver.query_one("SHOW lock_timeout", &[]).await.expect("show")),
        "0",
        "the bound ends with the fenced transaction"
    );

    // The shard is the recipient's, under the lease the recipient renewed to.
    let (owner, expires) = expiry(1).await;
    assert_eq!(owner.as_deref(), Some("fresh"));
    assert_eq!(expires, expiry(3).await.1, "the handed shard expires with the recipient's own");
    let txn = giver.transaction().await.expect("begin");
    assert!(!writer_shard_fence_in_txn(&txn, 1, "giver").await.expect("fence"), "the giver's fence now fails");
    assert!(writer_shard_fence_in_txn(&txn, 1, "fresh").await.expect("fence"));
    txn.rollback().await.expect("rollback");
}
