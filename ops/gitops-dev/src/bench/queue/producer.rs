//! Bench producers: each on its own dedicated connection and tenant, enqueueing
//! exactly as a writer does — one application intent and its operation per
//! transaction — either as fast as they can or on a fixed open-loop schedule.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::try_join_all;
use gitops_shared::db::application::{ApplicationIntent, application_upsert_in_txn};
use gitops_shared::db::tenant::tenant_upsert_locked_in_txn;
use gitops_shared::db::{self, DbError, in_txn_retrying};
use gitops_shared::model::{EngineInstanceId, OperationId, ResourceType, SyncType, TenantId};
use gitops_shared::queue::{Enqueued, operation_enqueue_in_txn};
use tokio_postgres::Client;
use uuid::Uuid;

use super::BenchError;

const REPO_URL: &str = "https://git.example.invalid/repo.git";

const BASELINE_INSERT: &str = "INSERT INTO bench_baseline (v) VALUES ($1)";

// The switch `signal_raise` reads; session-wide on the producer's connection.
const SKIP_SIGNAL: &str = "SET gitops.bench_skip_signal = on";
const KEEP_SIGNAL: &str = "RESET gitops.bench_skip_signal";

/// What each transaction of a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// One row into an unindexed table, autocommit: the server's bare commit.
    Baseline,
    /// The writer's enqueue transaction.
    Enqueue,
    /// The enqueue alone, for a resource of its own with no application row:
    /// operations through the queue, without the application table growing by one
    /// row each (the held benchmark's preload).
    Operation,
}

/// Resources of `Work::Operation` are numbered from here, past any application's id.
const OPERATION_RESOURCES: i64 = 1 << 40;

/// An enqueue transaction's operation and when the producer saw its commit
/// acknowledged (local clock, the database's on this host).
#[derive(Debug, Clone, Copy)]
pub struct Committed {
    pub id: OperationId,
    pub at: SystemTime,
}

/// One producer: a connection and the tenant it writes for.
pub struct Producer {
    client: Client,
    instance: EngineInstanceId,
    tenant: TenantId,
}

impl Producer {
    /// Connects and registers the producer's tenant, placed on `instance`.
    pub async fn connect(url: &str, instance: EngineInstanceId, index: usize) -> Result<Self, BenchError> {
        let mut client =
            db::connect(url, "gitops-bench-producer").await.map_err(BenchError::db("connect a producer"))?;
        let namespace_uid = Uuid::new_v4();
        let namespace_name = format!("bench-tenant-{index}");
        let tenant = in_txn_retrying(&mut client, |txn| {
            let namespace_name = namespace_name.clone();
            Box::pin(
                async move { tenant_upsert_locked_in_txn(txn, namespace_uid, &namespace_name, Some(instance)).await },
            )
        })
        .await
        .map_err(BenchError::db("register a tenant"))?;
        Ok(Producer { client, instance, tenant: tenant.id })
    }

    /// Hands this connection's pending statistics to the server now (they are
    /// otherwise sent at most once a second, and by an idle connection after ten).
    pub async fn flush_stats(&self) -> Result<(), BenchError> {
        self.client
            .execute(super::stats::FLUSH, &[])
            .await
            .map_err(DbError::query("flush statistics"))
            .map_err(BenchError::db("flush statistics"))?;
        Ok(())
    }

    /// Switches the signalling step of the enqueue transaction off (or back on).
    pub async fn skip_signal(&self, skip: bool) -> Result<(), BenchError> {
        self.client
            .batch_execute(if skip { SKIP_SIGNAL } else { KEEP_SIGNAL })
            .await
            .map_err(DbError::query("set the signal switch"))
            .map_err(BenchError::db("set the signal switch"))
    }

    /// One enqueue transaction for intent number `seq`, retried as a writer would;
    /// returns the operation and when its commit was acknowledged.
    pub async fn enqueue(&mut self, seq: u64) -> Result<Committed, DbError> {
        let intent = Arc::new(ApplicationIntent {
            resource_uid: Uuid::new_v4(),
            resource_name: format!("bench-app-{seq}"),
            generation: 1,
            repo_url: REPO_URL.to_owned(),
            path: "apps/x".to_owned(),
            target_revision: "HEAD".to_owned(),
            managed_environment_id: None,
            destination_namespace: "bench".to_owned(),
            sync_type: SyncType::Automated,
            create_namespace: false,
            wait_for_pruning: false,
        });
        let (instance, tenant) = (self.instance, self.tenant);
        let enqueued = in_txn_retrying(&mut self.client, |txn| {
            let intent = intent.clone();
            Box::pin(async move {
                let app = application_upsert_in_txn(txn, tenant, &intent)
                    .await?
                    .ok_or_else(|| DbError::NotFound { what: "the row of a new application intent".to_owned() })?;
                operation_enqueue_in_txn(txn, instance, tenant, ResourceType::Application, app.0).await
            })
        })
        .await?;
        committed(enqueued)
    }

    /// One transaction that enqueues an operation for resource number `seq` of
    /// `Work::Operation`, retried as a writer would.
    pub async fn operation(&mut self, seq: u64) -> Result<Committed, DbError> {
        let resource = OPERATION_RESOURCES.saturating_add(i64::try_from(seq).unwrap_or(i64::MAX));
        let (instance, tenant) = (self.instance, self.tenant);
        let enqueued = in_txn_retrying(&mut self.client, |txn| {
            Box::pin(async move {
                operation_enqueue_in_txn(txn, instance, tenant, ResourceType::Application, resource).await
            })
        })
        .await?;
        committed(enqueued)
    }
}

/// The operation a producer's transaction made; anything else is a lost operation.
fn committed(enqueued: Enqueued) -> Result<Committed, DbError> {
    match enqueued {
        Enqueued::New(id) => Ok(Committed { id, at: SystemTime::now() }),
        other => Err(DbError::NotFound { what: format!("a new operation for a new resource (found {other:?})") }),
    }
}

/// Runs `operations` transactions of `work` over all producers as fast as they
/// go (each takes the next number when it is free). Returns the elapsed time and
/// the enqueue transactions' commits.
pub async fn run_closed(
    producers: &mut [Producer],
    operations: u64,
    work: Work,
) -> Result<(Duration, Vec<Committed>), BenchError> {
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let committed = try_join_all(producers.iter_mut().map(|producer| {
        let next = &next;
        async move {
            let baseline = match work {
                Work::Baseline => {
                    Some(producer.client.prepare(BASELINE_INSERT).await.map_err(DbError::query("prepare"))?)
                }
                Work::Enqueue | Work::Operation => None,
            };
            let mut committed = Vec::new();
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= operations {
                    return Ok::<_, DbError>(committed);
                }
                match (&baseline, work) {
                    (Some(insert), _) => {
                        let v = i64::try_from(seq).unwrap_or(i64::MAX);
                        producer.client.execute(insert, &[&v]).await.map_err(DbError::query("baseline insert"))?;
                    }
                    (None, Work::Operation) => committed.push(producer.operation(seq).await?),
                    (None, _) => committed.push(producer.enqueue(seq).await?),
                }
            }
        }
    }))
    .await
    .map_err(BenchError::db("produce"))?;
    Ok((started.elapsed(), committed.into_iter().flatten().collect()))
}

/// Enqueues `operations` on a fixed open-loop schedule of `rate` per second in
/// total from `start`: producer i sends operation number k·P + i at
/// `start + (k·P + i) / rate`. A producer behind schedule sends at once and never
/// skips, so a slow transaction delays only what that producer sends next.
pub async fn run_scheduled(
    producers: &mut [Producer],
    operations: u64,
    rate: f64,
    start: Instant,
) -> Result<Vec<Committed>, BenchError> {
    let count = producers.len();
    let committed = try_join_all(producers.iter_mut().enumerate().map(|(index, producer)| async move {
        let mut committed = Vec::new();
        for seq in sequence(index, count, operations) {
            tokio::time::sleep_until((start + send_offset(seq, rate)).into()).await;
            committed.push(producer.enqueue(seq).await?);
        }
        Ok::<_, DbError>(committed)
    }))
    .await
    .map_err(BenchError::db("produce on schedule"))?;
    Ok(committed.into_iter().flatten().collect())
}

/// The operation numbers producer `index` of `count` sends: index, index + count, …
fn sequence(index: usize, count: usize, operations: u64) -> impl Iterator<Item = u64> {
    (index as u64..operations).step_by(count.max(1))
}

/// When operation number `seq` is due, after the schedule's start.
fn send_offset(seq: u64, rate: f64) -> Duration {
    Duration::from_secs_f64(seq as f64 / rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producers_interleave_and_cover_every_operation_once() {
        assert_eq!(sequence(1, 4, 10).collect::<Vec<_>>(), vec![1, 5, 9]);
        let mut all: Vec<u64> = (0..4).flat_map(|i| sequence(i, 4, 10)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(sequence(7, 8, 5).count(), 0);
    }

    #[test]
    fn the_schedule_is_k_p_over_r_plus_i_over_r() {
        // P = 4, R = 100/s: producer 1's third operation (k = 2) is number 9, due at
        // 2·4/100 + 1/100 = 90 ms.
        assert_eq!(send_offset(2 * 4 + 1, 100.0), Duration::from_millis(90));
        assert_eq!(send_offset(0, 100.0), Duration::ZERO);
    }
}
