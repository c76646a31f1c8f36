//! Claim, complete and fail: the lease-checked transitions of an operation.

use std::future::Future;
use std::time::{Duration, Instant};

use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Row};
use uuid::Uuid;

use super::{ClaimedOperation, Lease, RetryPolicy, secs};
use crate::db::{DbError, column};
use crate::model::{EngineInstanceId, OperationId, ResourceType};
use crate::sanitize::sanitize_tenant_message;

// One statement, one transaction: complete the operations handled since the last
// claim ($6/$7, lease-checked: each leaves `operation` for `operation_history`, see
// migrations/V25), then pick up to $2 due operations of this instance
// whose resource has no claimed operation, lock them (skipping rows another claimer
// holds), lease them, and move the instance's front to the highest key taken.
//
// Completions, the claimed-resource check and the lease of what was picked probe one
// row or resource each (by primary key, see the module `queue`; by
// operation_one_claimed_idx: OFFSET 0 keeps the planner from turning the check into a
// join that reads every claimed row and the entries they left; the picked ids as an
// array, so that a generic plan, which cannot know how many were picked, does not
// join them to a scan of the whole table).
// The pick walks operation_claim_idx in queue-key order (fair across tenants, see
// migrations/V20) from the claimer's floor $5: keys below it were claimed already, and
// the dead index entries they left are not visited even while a held snapshot keeps
// them (`super::floor` says why skipping them loses nothing); it runs with sorting off
// (`CLAIM_IN_KEY_ORDER` says why). An ordinary operation is
// not claimed by an instance its tenant is not placed on, nor while the tenant is being
// released (a move: see sql/README.md); one whose tenant row is gone is claimed, to be
// completed quietly. Tenant operations carry the move itself and are always claimable.
// A fenced instance claims nothing: its agents clean up first (`db::failover`), then
// the fence is lifted. A claim that took work marks the instance's signal awake, as a
// consumer that wakes does (see `crate::signal`): its claimer scans on, and will not
// sleep without setting the signal again and scanning once more, so the enqueuers
// need not notify meanwhile.
//
// The completions run before the pick locks anything (the pick's filter reads their
// count, so they are done when it is first evaluated). A pick whose snapshot is older
// than another claimer's last commit can lock a row that claimer has just claimed: the
// row looked waiting, PostgreSQL locks its newest version and then drops it from the
// result, keeping the lock until the statement ends. A completion that meets such a
// lock waits for it. Were the completions to run after the pick, two claimers could
// each wait in their completions for a lock the other's pick left: a deadlock. With
// the completions first, a claim that waits holds no lock another claim waits for.
//
// The result has one row per claimed operation, or a single row of NULLs when none
// was; each row carries how many of the completions were recorded (a count: the
// ids would travel once per row). Every column it returns has a built-in type (the
// resource type as text): the statement goes with `query_typed`, and a column of a
// type the connection has not looked up yet would need that lookup in the middle of
// the exchange, which never completes once the batch's rows fill the connection's
// buffer (`queue_race::a_full_batch_claimed_on_a_connection_that_has_run_nothing_yet_comes_back`).
/// The claim statement (public so a test can EXPLAIN it).
pub const CLAIM: &str = concat!(
    "
WITH finished AS (
    DELETE FROM operation o
     WHERE o.id = ANY ($6::bigint[]) AND o.lease_token = ($7::uuid[])[array_position($6::bigint[], o.id)]
       AND o.state::text = 'claimed' AND o.lease_expires_at > now()
    RETURNING o.*
), done AS (
    ",
    file_finished!("completed", "attempts", "lease_expiries", "NULL"),
    "
    RETURNING id
), picked AS (
    SELECT o.id, o.queue_key
      FROM operation o
     WHERE o.engine_instance_id = $1
       AND o.state = 'waiting'
       AND o.queue_key IS NOT NULL
       AND o.queue_key >= $5
       AND o.run_after <= now()
       AND NOT EXISTS (SELECT 1 FROM operation c
                        WHERE c.state = 'claimed'
                          AND c.resource_type = o.resource_type
                          AND c.resource_id = o.resource_id
                       OFFSET 0)
       AND (o.resource_type = 'tenant'
            OR NOT EXISTS (SELECT 1 FROM tenant t
                            WHERE t.id = o.tenant_id
                              AND (t.engine_instance_id IS DISTINCT FROM o.engine_instance_id
                                   OR t.move_state = 'releasing')))
       AND NOT EXISTS (SELECT 1 FROM engine_instance e WHERE e.id = $1 AND e.fenced_at IS NOT NULL)
       AND (SELECT count(*) FROM done) >= 0
     ORDER BY o.queue_key, o.id
     LIMIT $2
       FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE operation o
       SET state = 'claimed',
           claimed_by = $3,
           lease_token = gen_random_uuid(),
           lease_expires_at = now() + make_interval(secs => $4),
           claimed_at = clock_timestamp(),
           attempts = o.attempts + 1
     WHERE o.id = ANY (ARRAY(SELECT id FROM picked))
    RETURNING o.id, o.tenant_id, o.resource_type::text AS resource_type, o.resource_id, o.attempts, o.lease_token,
              o.created_at, o.claimed_at, o.queue_key
), front AS (
    SELECT operation_advance_front($1, max(queue_key)) FROM claimed
), awake AS (
    UPDATE signal s
       SET sleeping = false, updated_at = now()
     WHERE s.kind = 'operations' AND s.ref_id = $1 AND s.sleeping
       AND EXISTS (SELECT 1 FROM claimed)
    RETURNING 1
)
SELECT c.*, (SELECT count(*) FROM done) AS completed, (SELECT count(*) FROM front) AS fronts,
       (SELECT count(*) FROM awake) AS woke
  FROM (VALUES (1)) AS one (x) LEFT JOIN claimed c ON true"
);

/// What one claim statement did.
#[derive(Debug, Default)]
pub struct ClaimRound {
    /// The operations now leased to the claimer, by id.
    pub claimed: Vec<ClaimedOperation>,
    /// How many of the completions handed in were recorded (the others' leases had
    /// passed on).
    pub completed: u64,
    /// The lowest queue key claimed.
    pub lowest_key: Option<i64>,
    /// The highest queue key claimed.
    pub highest_key: Option<i64>,
}

impl ClaimRound {
    /// Where the claimer's next scan may start (an optimistic floor, see
    /// `super::floor`), for a claim of at most `limit`: at the batch's highest key
    /// when it was full, at its lowest key otherwise; None when nothing was claimed.
    ///
    /// A full batch means a backlog, which the claimers are working through: starting
    /// at the lowest key, the next scan would visit the whole batch again, and while
    /// a snapshot is held those entries cannot be marked dead, so each costs a read
    /// of the table. A batch that was not full reached the end of the due work; what
    /// it passed over is near its lowest key, where operations being written while it
    /// ran get theirs, and the next scan starts there.
    pub fn next_floor(&self, limit: i64) -> Option<Floor> {
        let full = i64::try_from(self.claimed.len()).is_ok_and(|claimed| claimed >= limit);
        if full { self.highest_key } else { self.lowest_key }.map(Floor)
    }
}

/// Where a claim's scan starts: everything at or past `floor` in queue-key order.
/// `FROM_START` reads the instance's whole waiting index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Floor(pub i64);

impl Floor {
    pub const FROM_START: Floor = Floor(i64::MIN);
}

/// Claims up to `limit` due operations of `instance` for `claimer`, each with a
/// lease of `lease_for`, reading the whole queue (retries whose backoff ended are
/// given their place first). The local deadline of each lease is measured from
/// before the statement was sent, so it never ends after the database's. Consumers
/// use `operation_complete_and_claim` on a pooled connection, from a floor.
pub async fn operation_claim(
    client: &Client,
    instance: EngineInstanceId,
    claimer: &str,
    limit: i64,
    lease_for: Duration,
) -> Result<Vec<ClaimedOperation>, DbError> {
    super::operation_promote_due(client, instance).await?;
    let round =
        operation_complete_and_claim(client, instance, claimer, limit, lease_for, Floor::FROM_START, &[]).await?;
    Ok(round.claimed)
}

/// Records `done` as completed (lease-checked, as `operation_complete` does) and
/// claims the next batch from `floor`, in one statement and one commit. How the
/// statement travels depends on the connection ([`ClaimClient`]).
pub async fn operation_complete_and_claim<C: ClaimClient>(
    client: &C,
    instance: EngineInstanceId,
    claimer: &str,
    limit: i64,
    lease_for: Duration,
    floor: Floor,
    done: &[(OperationId, Uuid)],
) -> Result<ClaimRound, DbError> {
    let params = ClaimParams::new(instance, claimer, limit, lease_for, floor, done);
    let sent_at = Instant::now();
    let rows = client.claim_rows(&params).await?;
    read_round(&rows, instance, sent_at, lease_for)
}

/// A connection the claim statement can run on.
pub trait ClaimClient: Sync {
    /// Runs the claim statement with `params`.
    fn claim_rows(&self, params: &ClaimParams<'_>) -> impl Future<Output = Result<Vec<Row>, DbError>> + Send;
}

/// A bare connection sends the statement with its parameter types (`query_typed`):
/// parsed and run in one exchange, with no separate prepare, inside a transaction
/// that walks the queue's index in its order (`CLAIM_IN_KEY_ORDER`), all in one round
/// trip.
impl ClaimClient for Client {
    async fn claim_rows(&self, params: &ClaimParams<'_>) -> Result<Vec<Row>, DbError> {
        let params = params.typed();
        let (_, rows, _) = tokio::try_join!(
            self.batch_execute(CLAIM_IN_KEY_ORDER),
            self.query_typed(CLAIM, &params),
            self.batch_execute("COMMIT"),
        )
        .map_err(DbError::query("claim operations"))?;
        Ok(rows)
    }
}

/// A pooled connection prepares the statement once and keeps it, and runs it in a
/// transaction of its own that keeps its generic plan (`CLAIM_IN_GENERIC_PLAN`):
/// planned once per connection instead of at every claim, which took as long as
/// running it. This is what a consumer, claiming many times a second, uses.
///
/// Left to itself PostgreSQL plans every claim again: its estimate of the generic
/// plan takes `LIMIT $2` to pick a tenth of the queue, which costs more than any
/// custom plan. The settings are the transaction's (`SET LOCAL`), so nothing else on
/// the connection runs with them, behind a transaction-mode pooler too. The transaction's
/// statements go together, in one round trip: they are queued on the connection when
/// first polled, all three, so a claim dropped half-way (its consumer cancelled)
/// still leaves the connection outside a transaction; a COMMIT after a failed claim
/// rolls it back.
impl ClaimClient for ClientWrapper {
    async fn claim_rows(&self, params: &ClaimParams<'_>) -> Result<Vec<Row>, DbError> {
        let statement = self.prepare_cached(CLAIM).await.map_err(DbError::query("prepare the claim"))?;
        let params = params.untyped();
        let (_, rows, _) = tokio::try_join!(
            self.batch_execute(CLAIM_IN_GENERIC_PLAN),
            self.query(&statement, &params),
            self.batch_execute("COMMIT"),
        )
        .map_err(DbError::query("claim operations"))?;
        Ok(rows)
    }
}

/// The text of `CLAIM_IN_KEY_ORDER`, for the statements that build on it (`concat!`
/// takes literals, not consts).
macro_rules! claim_in_key_order {
    () => {
        "BEGIN; SET LOCAL enable_sort = off"
    };
}

/// Opens the transaction a pooled claim runs in: `CLAIM_IN_KEY_ORDER`'s, planned
/// once.
const CLAIM_IN_GENERIC_PLAN: &str = concat!(claim_in_key_order!(), "; SET LOCAL plan_cache_mode = force_generic_plan");

/// Opens a transaction whose claim reads the waiting index in key order and stops at
/// its limit, never reading the whole index and sorting it.
///
/// The queue table's statistics swing with its load: analysed while the queue was
/// nearly empty, and read while a held snapshot kept its dead entries, the planner
/// took the sort for cheaper and each claim read every entry of the index, dead or
/// alive (`EXPLAIN (ANALYZE, BUFFERS)`: 110,000 buffers and 77 ms instead of 2.6 ms),
/// until the next ANALYZE. With sorting off, the only plan left that returns rows in
/// key order is the index walk.
const CLAIM_IN_KEY_ORDER: &str = claim_in_key_order!();

/// The claim statement's parameters, in its order.
pub struct ClaimParams<'a> {
    instance: i64,
    limit: i64,
    claimer: &'a str,
    lease_s: f64,
    floor: i64,
    ids: Vec<i64>,
    tokens: Vec<Uuid>,
}

impl<'a> ClaimParams<'a> {
    fn new(
        instance: EngineInstanceId,
        claimer: &'a str,
        limit: i64,
        lease_for: Duration,
        floor: Floor,
        done: &[(OperationId, Uuid)],
    ) -> Self {
        ClaimParams {
            instance: instance.0,
            limit,
            claimer,
            lease_s: secs(lease_for),
            floor: floor.0,
            ids: done.iter().map(|(id, _)| id.0).collect(),
            tokens: done.iter().map(|(_, token)| *token).collect(),
        }
    }

    fn untyped(&self) -> [&(dyn ToSql + Sync); 7] {
        [&self.instance, &self.limit, &self.claimer, &self.lease_s, &self.floor, &self.ids, &self.tokens]
    }

    fn typed(&self) -> [(&(dyn ToSql + Sync), Type); 7] {
        let [instance, limit, claimer, lease_s, floor, ids, tokens] = self.untyped();
        [
            (instance, Type::INT8),
            (limit, Type::INT8),
            (claimer, Type::TEXT),
            (lease_s, Type::FLOAT8),
            (floor, Type::INT8),
            (ids, Type::INT8_ARRAY),
            (tokens, Type::UUID_ARRAY),
        ]
    }
}

/// What a claim's rows say. Leases are measured from `sent_at`.
fn read_round(
    rows: &[Row],
    instance: EngineInstanceId,
    sent_at: Instant,
    lease_for: Duration,
) -> Result<ClaimRound, DbError> {
    let read = |row: &Row| -> Result<Option<(ClaimedOperation, i64)>, tokio_postgres::Error> {
        let Some(id) = row.try_get::<_, Option<OperationId>>("id")? else { return Ok(None) };
        let op = ClaimedOperation {
            id,
            engine_instance_id: instance,
            tenant_id: row.try_get("tenant_id")?,
            resource_type: ResourceType::from_db(row.try_get("resource_type")?),
            resource_id: row.try_get("resource_id")?,
            attempts: row.try_get("attempts")?,
            created_at: row.try_get("created_at")?,
            claimed_at: row.try_get("claimed_at")?,
            lease: Lease::new(row.try_get("lease_token")?, sent_at, lease_for),
        };
        Ok(Some((op, row.try_get("queue_key")?)))
    };
    let mut round = ClaimRound::default();
    for row in rows {
        let Some((op, key)) = read(row).map_err(DbError::query("read claimed operations"))? else { continue };
        round.lowest_key = Some(round.lowest_key.map_or(key, |lowest| lowest.min(key)));
        round.highest_key = Some(round.highest_key.map_or(key, |highest| highest.max(key)));
        round.claimed.push(op);
    }
    if let Some(row) = rows.first() {
        let completed: i64 = column(row, "completed", "read completed operations")?;
        round.completed = u64::try_from(completed).unwrap_or(0);
    }
    round.claimed.sort_by_key(|op| op.id);
    Ok(round)
}

/// The completion statement (public so a test can EXPLAIN it).
pub const COMPLETE: &str = concat!(
    "
WITH finished AS (
    DELETE FROM operation o
     WHERE o.id = ANY ($1::bigint[]) AND o.lease_token = ($2::uuid[])[array_position($1::bigint[], o.id)]
       AND o.state::text = 'claimed' AND o.lease_expires_at > now()
    RETURNING o.*
)
",
    file_finished!("completed", "attempts", "lease_expiries", "NULL"),
    "
RETURNING id"
);

/// Marks operations done, in one statement: each moves from `operation` to
/// `operation_history`. Only operations whose lease is still this holder's and
/// unexpired move; the ids returned are those that did. A
/// holder that lost its lease cannot overwrite the new holder's result.
pub async fn operation_complete(client: &Client, done: &[(OperationId, Uuid)]) -> Result<Vec<OperationId>, DbError> {
    if done.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = done.iter().map(|(id, _)| id.0).collect();
    let tokens: Vec<Uuid> = done.iter().map(|(_, token)| *token).collect();
    let rows = client
        .query_typed(COMPLETE, &[(&ids, Type::INT8_ARRAY), (&tokens, Type::UUID_ARRAY)])
        .await
        .map_err(DbError::query("complete operations"))?;
    rows.iter().map(|row| column(row, "id", "complete operations")).collect()
}

/// Why an operation failed, and so what happens to it.
#[derive(Debug, Clone)]
pub enum Failure {
    /// Transient (Argo CD or its cluster unavailable, a timeout, a throttle): back
    /// off (capped) and try again, for as long as it takes; never dead-lettered.
    Transient { operator_error: String, tenant_message: String },
    /// Someone else changed the object first: try again at once.
    Conflict { operator_error: String, tenant_message: String },
    /// Trying again cannot help (Argo CD refused the object): dead-letter it now.
    Permanent { operator_error: String, tenant_message: String },
}

impl Failure {
    fn parts(&self) -> (&str, &str) {
        match self {
            Failure::Transient { operator_error, tenant_message }
            | Failure::Conflict { operator_error, tenant_message }
            | Failure::Permanent { operator_error, tenant_message } => (operator_error, tenant_message),
        }
    }
}

/// What `operation_fail` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Back to waiting, due after the backoff.
    Retrying { after: Duration },
    /// A newer waiting operation for the resource will do the work.
    Superseded,
    /// Dead-lettered: permanent, or out of attempts.
    Failed,
    /// The lease was no longer this holder's; nothing changed.
    LeaseLost,
}

/// The dead-letter statement (public so a test can EXPLAIN it).
pub const FAIL_DEAD: &str = "
UPDATE operation
   SET state = 'failed', completed_at = clock_timestamp(), lease_expires_at = NULL,
       operator_error = $3, tenant_message = $4
 WHERE id = $1 AND lease_token = $2 AND state::text = 'claimed' AND lease_expires_at > now()
RETURNING id";

/// The retry statement (public so a test can EXPLAIN it).
pub const FAIL_RETRY: &str = requeue_or_supersede!(
    "o.id = $1 AND o.lease_token = $2 AND o.state::text = 'claimed' AND o.lease_expires_at > now()",
    "state = 'waiting', run_after = now() + make_interval(secs => $5), lease_expires_at = NULL,
           operator_error = $3, tenant_message = $4",
    "attempts",
    "lease_expiries",
    "$3"
);

/// Records a failed attempt. Transient failures go back to waiting with capped,
/// jittered exponential backoff, conflicts at once, unless the resource has a newer
/// waiting operation, which supersedes it (into `operation_history`); permanent
/// ones end `failed` with both messages. The tenant message is sanitised here.
pub async fn operation_fail(
    client: &Client,
    op: &ClaimedOperation,
    failure: &Failure,
    policy: &RetryPolicy,
) -> Result<FailOutcome, DbError> {
    let (operator_error, tenant_message) = failure.parts();
    let tenant_message = sanitize_tenant_message(tenant_message);
    let token = op.lease.token();
    if let Failure::Permanent { .. } = failure {
        let row = client
            .query_opt(FAIL_DEAD, &[&op.id.0, &token, &operator_error, &tenant_message])
            .await
            .map_err(DbError::query("dead-letter an operation"))?;
        return Ok(if row.is_some() { FailOutcome::Failed } else { FailOutcome::LeaseLost });
    }
    let after = match failure {
        Failure::Conflict { .. } => Duration::ZERO,
        _ => policy.delay(op.attempts),
    };
    // A writer may insert the resource's next waiting operation between our look
    // and our update; the unique index then refuses it and the next try sees it.
    for _ in 0..3 {
        let result = client
            .query_opt(FAIL_RETRY, &[&op.id.0, &token, &operator_error, &tenant_message, &secs(after)])
            .await
            .map_err(DbError::query("schedule an operation retry"));
        match result {
            Ok(None) => return Ok(FailOutcome::LeaseLost),
            Ok(Some(row)) => {
                let state: crate::model::OperationState = column(&row, "state", "schedule an operation retry")?;
                return Ok(match state {
                    crate::model::OperationState::Superseded => FailOutcome::Superseded,
                    _ => FailOutcome::Retrying { after },
                });
            }
            Err(error) if error.is_unique_violation() => continue,
            Err(error) => return Err(error),
        }
    }
    Err(DbError::KeptRacing { operation: op.id.0 })
}
