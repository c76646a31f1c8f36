//! Shard keepers as separate writers run them — each on a pool of its own, named after
//! the writer so the database can tell their statements apart — and a record, kept by
//! triggers with the database's clock, of every change of a shard's owner or lease and
//! of every update statement each keeper ran. Tests measure takeovers against the lease
//! from that record, never with the test's own clock.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use gitops_testkit::TestDb;
use gitops_writer::shard::{ShardConfig, ShardKeeper};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

/// A running keeper with the readiness it is given.
pub struct Keeper {
    pub owned: watch::Receiver<Vec<i32>>,
    pub ready: watch::Sender<bool>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Keeper {
    pub fn start(db: &TestDb, id: &str, config: ShardConfig, ready: bool) -> Keeper {
        let pool = gitops_shared::db::pool(&db.url(), 2, &session_of(id)).expect("a keeper's pool");
        let (ready, ready_rx) = watch::channel(ready);
        let (keeper, owned) = ShardKeeper::new(pool, id.to_owned(), config, ready_rx);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(keeper.run(cancel.clone()));
        Keeper { owned, ready, cancel, task }
    }

    /// Stops as a writer shutting down does: every shard is released.
    pub async fn stop(self) {
        self.cancel.cancel();
        self.task.await.expect("the keeper stops");
    }

    /// Ends as a crashed writer does: nothing is released, the leases run out.
    pub async fn crash(self) {
        self.task.abort();
        let ended = self.task.await;
        assert!(ended.is_err_and(|error| error.is_cancelled()), "the keeper was aborted, not finished");
    }

    /// How many shards this keeper says it holds.
    pub fn holds(&self) -> usize {
        self.owned.borrow().len()
    }
}

/// The application name of the sessions of `writer`'s keeper.
pub fn session_of(writer: &str) -> String {
    format!("keeper-{writer}")
}

/// Starts recording every change of a shard's owner or lease, and every update
/// statement on `writer_shard` with the application name of the session that ran it.
pub async fn record_shard_changes(client: &Client) {
    client
        .batch_execute(
            "CREATE TABLE test_shard_change (
                 id bigserial PRIMARY KEY, shard integer NOT NULL, writer_id text,
                 lease_expires_at timestamptz, at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE FUNCTION test_shard_change() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO test_shard_change (shard, writer_id, lease_expires_at)
                 VALUES (NEW.shard, NEW.writer_id, NEW.lease_expires_at);
                 RETURN NULL;
             END $$;
             CREATE TRIGGER test_shard_change AFTER UPDATE ON writer_shard FOR EACH ROW
                 WHEN (OLD.writer_id IS DISTINCT FROM NEW.writer_id
                       OR OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at)
                 EXECUTE FUNCTION test_shard_change();
             CREATE TABLE test_shard_statement (
                 id bigserial PRIMARY KEY, application_name text NOT NULL,
                 at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE FUNCTION test_shard_statement() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO test_shard_statement (application_name) VALUES (current_setting('application_name'));
                 RETURN NULL;
             END $$;
             CREATE TRIGGER test_shard_statement AFTER UPDATE ON writer_shard FOR EACH STATEMENT
                 EXECUTE FUNCTION test_shard_statement();",
        )
        .await
        .expect("record shard changes");
}

/// How many update statements sessions named `application_name` have run on
/// `writer_shard` (a keeper runs one renewal at least per round, even when it holds
/// nothing), and when the last ran.
pub async fn statements_of(client: &Client, application_name: &str) -> (i64, Option<SystemTime>) {
    let row = client
        .query_one(
            "SELECT count(*) AS statements, max(at) AS last FROM test_shard_statement WHERE application_name = $1",
            &[&application_name],
        )
        .await
        .expect("count a keeper's statements");
    (row.get("statements"), row.get("last"))
}

/// Unexpired shards by owner.
pub async fn live_owners(client: &Client) -> BTreeMap<String, i64> {
    client
        .query(
            "SELECT writer_id, count(*) AS shards FROM writer_shard WHERE lease_expires_at > now() GROUP BY writer_id",
            &[],
        )
        .await
        .expect("owners")
        .iter()
        .map(|row| (row.get("writer_id"), row.get("shards")))
        .collect()
}

/// A shard passing from one writer to another.
#[derive(Debug, Clone)]
pub struct Handover {
    pub shard: i32,
    pub from: String,
    pub to: String,
    /// The former owner's last renewal of this shard (its lease expiry minus the lease).
    pub renewed_at: SystemTime,
    /// When the new owner took it.
    pub at: SystemTime,
}

impl Handover {
    /// How long the shard went from its former owner's last renewal to its new owner.
    pub fn since_renewal(&self) -> Duration {
        self.at.duration_since(self.renewed_at).unwrap_or(Duration::ZERO)
    }
}

/// Every handover recorded so far: a writer's last lease on a shard (given back or
/// not) followed by another writer taking it, with the `lease` every writer uses.
pub async fn handovers(client: &Client, lease: Duration) -> Vec<Handover> {
    let rows = client
        .query("SELECT shard, writer_id, lease_expires_at, at FROM test_shard_change ORDER BY id", &[])
        .await
        .expect("shard changes");
    // Per shard, the last writer to hold a lease on it and that lease's expiry.
    let mut last: BTreeMap<i32, (String, SystemTime)> = BTreeMap::new();
    let mut found = Vec::new();
    for row in &rows {
        let shard: i32 = row.get("shard");
        let (writer, expires): (Option<String>, Option<SystemTime>) =
            (row.get("writer_id"), row.get("lease_expires_at"));
        let (Some(writer), Some(expires)) = (writer, expires) else {
            // Given back: the shard is ownerless from here, counted from the last renewal.
            continue;
        };
        if let Some((from, expired_at)) = last.get(&shard)
            && *from != writer
        {
            found.push(Handover {
                shard,
                from: from.clone(),
                to: writer.clone(),
                renewed_at: *expired_at - lease,
                at: row.get("at"),
            });
        }
        last.insert(shard, (writer, expires));
    }
    found
}

/// `writer`'s last renewal of any shard: its latest lease expiry minus the lease.
pub async fn last_renewal(client: &Client, writer: &str, lease: Duration) -> SystemTime {
    let row = client
        .query_one("SELECT max(lease_expires_at) AS expires FROM test_shard_change WHERE writer_id = $1", &[&writer])
        .await
        .expect("the last lease of a writer");
    let expires: SystemTime = row.get::<_, Option<SystemTime>>("expires").expect("the writer held a lease");
    expires - lease
}
