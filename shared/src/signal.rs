//! Debounced wake-up signals: the one mechanism every notifying trigger uses.
//!
//! PostgreSQL serialises the commits of all transactions that issued a NOTIFY, so a
//! NOTIFY per enqueued row would cap write throughput. Instead, a signal row per
//! (kind, id) says whether a consumer may be asleep, and the trigger function
//! `signal_raise` notifies only then.
//!
//! The protocol, and why no wake-up is lost:
//! - An enqueuer (inside its transaction, via `signal_raise`) takes the signal's
//!   advisory lock *shared*, then reads `sleeping`; if true it notifies (delivered at
//!   commit). The shared lock is held until it commits or rolls back.
//! - A consumer that wakes marks the signal awake (`mark_awake`), which only stops
//!   further notifications; it then scans until it finds nothing. A queue claim that
//!   takes work marks it awake too (`queue::CLAIM`): with several consumers, one
//!   going to sleep sets the shared flag while the others still claim, and every
//!   enqueue would notify (a transaction in each listening session) until a sleeper
//!   woke up. A consumer that clears the flag this way is scanning, so it passes
//!   through `try_sleep` and a final scan before it sleeps, as below.
//! - Before sleeping, the consumer tries to take the same lock *exclusively without
//!   waiting* and set `sleeping` (`try_sleep`). If an enqueuer is in flight, the try
//!   fails and the consumer scans again. Once it has committed, it scans once more,
//!   then waits for a notification or its timer.
//!
//! - Consumers that share a signal but read different rows (the writers, each
//!   scanning its own shards of `status`) cannot let one of them silence the others:
//!   a writer that clears `sleeping` notifies the others itself while it works, and
//!   when it sets `sleeping` again (`writer::status` says when).
//!
//! An operation committed by an enqueuer that read `sleeping = false` was locked in
//! before the consumer could set `sleeping`; the consumer's lock therefore came after
//! that commit, and so did its final scan, which sees the operation. An enqueuer that
//! read `sleeping = true` notifies, and the consumer listens throughout.

use tokio_postgres::{Client, Transaction};

use crate::db::DbError;
use crate::model::{EngineInstanceId, SignalKind};

/// One signal: a row in `signal` and a LISTEN channel derived from its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signal {
    pub kind: SignalKind,
    pub ref_id: i64,
}

/// What `try_sleep` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SleepAttempt {
    /// `sleeping` is set: scan once more, then wait for a notification.
    Asleep,
    /// An enqueuer holds the lock: scan again before trying to sleep.
    EnqueuerInFlight,
}

const MARK_AWAKE: &str =
    "UPDATE signal SET sleeping = false, updated_at = now() WHERE kind = $1 AND ref_id = $2 AND sleeping";

const NOTIFY: &str = "SELECT pg_notify(signal_channel($1, $2), '')";

// MARK_AWAKE and NOTIFY in one statement (a data-modifying WITH runs whether or not
// it is read).
const RELAY: &str = "
WITH awake AS (
    UPDATE signal SET sleeping = false, updated_at = now() WHERE kind = $1 AND ref_id = $2 AND sleeping
)
SELECT pg_notify(signal_channel($1, $2), '')";

const TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock(signal_lock_key($1, $2)) AS locked";

const MARK_SLEEPING: &str = "
INSERT INTO signal (kind, ref_id, sleeping) VALUES ($1, $2, true)
ON CONFLICT (kind, ref_id) DO UPDATE SET sleeping = true, updated_at = now()
 WHERE NOT signal.sleeping";

impl Signal {
    /// The signal that wakes the agents of an engine instance.
    pub fn operations(instance: EngineInstanceId) -> Self {
        Signal { kind: SignalKind::Operations, ref_id: instance.0 }
    }

    /// The signal that wakes writers when an agent recorded new observed state.
    pub fn status() -> Self {
        Signal { kind: SignalKind::Status, ref_id: 0 }
    }

    /// The LISTEN channel, as `signal_channel()` derives it in SQL.
    pub fn channel(&self) -> String {
        format!("gitops_{}_{}", self.kind.as_str(), self.ref_id)
    }

    /// Stops further notifications: a consumer is awake and will scan. Losing the
    /// race against an enqueuer only costs a notification.
    pub async fn mark_awake(&self, client: &Client) -> Result<(), DbError> {
        client.execute(MARK_AWAKE, &[&self.kind, &self.ref_id]).await.map_err(DbError::query("mark a signal awake"))?;
        Ok(())
    }

    /// Notifies every listener of the signal now (at commit, inside a transaction).
    /// For a consumer that keeps the signal awake on behalf of others who share it.
    pub async fn notify(&self, client: &impl tokio_postgres::GenericClient) -> Result<(), DbError> {
        client.execute(NOTIFY, &[&self.kind, &self.ref_id]).await.map_err(DbError::query("notify a signal"))?;
        Ok(())
    }

    /// Keeps the signal awake (another consumer may have set `sleeping` since) and
    /// notifies every listener: for a consumer that silences the others' wake-ups
    /// while it works.
    pub async fn relay(&self, client: &Client) -> Result<(), DbError> {
        client.execute(RELAY, &[&self.kind, &self.ref_id]).await.map_err(DbError::query("relay a signal"))?;
        Ok(())
    }

    /// The part of `try_sleep` inside its transaction: the caller commits. Split
    /// out so tests can hold a consumer at this point of the protocol.
    pub async fn try_sleep_in_txn(&self, txn: &Transaction<'_>) -> Result<SleepAttempt, DbError> {
        let row =
            txn.query_one(TRY_LOCK, &[&self.kind, &self.ref_id]).await.map_err(DbError::query("lock a signal"))?;
        let locked: bool = crate::db::column(&row, "locked", "lock a signal")?;
        if !locked {
            return Ok(SleepAttempt::EnqueuerInFlight);
        }
        txn.execute(MARK_SLEEPING, &[&self.kind, &self.ref_id])
            .await
            .map_err(DbError::query("mark a signal sleeping"))?;
        Ok(SleepAttempt::Asleep)
    }

    /// Sets `sleeping` unless an enqueuer is in flight. After `Asleep`, the caller
    /// must scan once more before it waits.
    pub async fn try_sleep(&self, client: &mut Client) -> Result<SleepAttempt, DbError> {
        let txn = client.transaction().await.map_err(DbError::query("begin"))?;
        let attempt = self.try_sleep_in_txn(&txn).await?;
        txn.commit().await.map_err(DbError::query("commit a signal"))?;
        Ok(attempt)
    }
}
