//! Leases: how long a claimer may act on an operation, on its own monotonic clock.
//!
//! The database keeps `lease_expires_at`; the holder keeps a local deadline that
//! starts from the instant *before* the claim or renewal was sent, so it always ends
//! no later than the database's. The holder stops acting at `deadline − margin`,
//! and a renewal that the database refuses (someone else reclaimed the operation)
//! cancels the work at once.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{ClaimedOperation, secs};
use crate::db::{DbError, DbPool, column, pooled};
use crate::model::OperationId;

/// One claim of one operation. Cloning shares the same lease.
#[derive(Debug, Clone)]
pub struct Lease {
    inner: Arc<LeaseInner>,
}

#[derive(Debug)]
struct LeaseInner {
    token: Uuid,
    deadline: Mutex<Instant>,
    /// Cancelled when the lease is lost (renewal refused) or released.
    done: CancellationToken,
}

/// The lease ran out, or was lost, before the work finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the operation's lease ended before the work finished")]
pub struct LeaseEnded;

impl Lease {
    /// A lease granted by a statement sent at `sent_at`, for `lease_for`.
    pub fn new(token: Uuid, sent_at: Instant, lease_for: Duration) -> Self {
        Lease {
            inner: Arc::new(LeaseInner {
                token,
                deadline: Mutex::new(sent_at + lease_for),
                done: CancellationToken::new(),
            }),
        }
    }

    /// The token that identifies this claim in `operation.lease_token`.
    pub fn token(&self) -> Uuid {
        self.inner.token
    }

    /// The local deadline (the database's may be later, never earlier).
    pub fn deadline(&self) -> Instant {
        *self.inner.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn extend(&self, sent_at: Instant, lease_for: Duration) {
        let mut deadline = self.inner.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        *deadline = (*deadline).max(sent_at + lease_for);
    }

    /// Marks the lease as lost or finished; `run` stops at once.
    pub fn end(&self) {
        self.inner.done.cancel();
    }

    /// Whether `end` was called.
    pub fn has_ended(&self) -> bool {
        self.inner.done.is_cancelled()
    }

    /// Runs `work` for as long as the lease allows: it is dropped (stopped at its
    /// next await) when the lease ends or its deadline minus `margin` passes.
    pub async fn run<T>(&self, margin: Duration, work: impl Future<Output = T>) -> Result<T, LeaseEnded> {
        tokio::pin!(work);
        loop {
            let stop_at = self.deadline().checked_sub(margin).unwrap_or_else(Instant::now);
            tokio::select! {
                biased;
                () = self.inner.done.cancelled() => return Err(LeaseEnded),
                value = &mut work => return Ok(value),
                () = tokio::time::sleep_until(stop_at.into()) => {
                    // A renewal may have moved the deadline while we slept.
                    if Instant::now() + margin >= self.deadline() {
                        return Err(LeaseEnded);
                    }
                }
            }
        }
    }
}

/// The renewal statement (public so a test can EXPLAIN it).
pub const RENEW: &str = "
UPDATE operation o
   SET lease_expires_at = now() + make_interval(secs => $3)
 WHERE o.id = ANY ($1::bigint[]) AND o.lease_token = ($2::uuid[])[array_position($1::bigint[], o.id)]
   AND o.state::text = 'claimed' AND o.lease_expires_at > now()
RETURNING o.id";

/// Extends the given leases by `lease_for` from now; returns the ids renewed. A
/// lease that already expired is not renewed, even if nobody took it over.
pub async fn operation_renew(
    client: &Client,
    ops: &[&ClaimedOperation],
    lease_for: Duration,
) -> Result<Vec<OperationId>, DbError> {
    if ops.is_empty() {
        return Ok(Vec::new());
    }
    let sent_at = Instant::now();
    let ids: Vec<i64> = ops.iter().map(|op| op.id.0).collect();
    let tokens: Vec<Uuid> = ops.iter().map(|op| op.lease.token()).collect();
    let lease_s = secs(lease_for);
    let rows = client
        .query_typed(RENEW, &[(&ids, Type::INT8_ARRAY), (&tokens, Type::UUID_ARRAY), (&lease_s, Type::FLOAT8)])
        .await
        .map_err(DbError::query("renew leases"))?;
    let renewed: Vec<OperationId> =
        rows.iter().map(|row| column(row, "id", "renew leases")).collect::<Result<_, _>>()?;
    for op in ops {
        if renewed.contains(&op.id) {
            op.lease.extend(sent_at, lease_for);
        }
    }
    Ok(renewed)
}

/// Renews a batch's leases in the background until dropped. An operation whose
/// renewal is refused has its lease ended, which stops its work; a renewal that
/// fails for another reason is retried until the local deadlines pass.
pub struct LeaseKeeper {
    task: tokio::task::JoinHandle<()>,
}

impl LeaseKeeper {
    /// Starts renewing every `lease_for / 3`.
    pub fn start(pool: DbPool, ops: Vec<ClaimedOperation>, lease_for: Duration) -> Self {
        let every = lease_for / 3;
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let live: Vec<&ClaimedOperation> = ops.iter().filter(|op| !op.lease.has_ended()).collect();
                if live.is_empty() {
                    return;
                }
                let result = match pooled(&pool).await {
                    Ok(client) => operation_renew(&client, &live, lease_for).await,
                    Err(error) => Err(error),
                };
                match result {
                    Ok(renewed) => {
                        for op in live.iter().filter(|op| !renewed.contains(&op.id)) {
                            tracing::warn!(operation.id = %op.id, "lease lost; abandoning the work");
                            op.lease.end();
                        }
                    }
                    Err(error) => tracing::warn!(%error, "could not renew leases; will try again"),
                }
            }
        });
        LeaseKeeper { task }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.task.abort();
    }
}
