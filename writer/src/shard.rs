//! Writer shards: every tenant namespace belongs to one of [`SHARDS`] shards (FNV-1a
//! of its name), and each shard has at most one owning writer at a time, held as a
//! lease on its `writer_shard` row. The [`ShardKeeper`] renews this writer's leases,
//! takes free or expired shards up to its fair share (the shard count over the live
//! writers, a writer being live while it holds an unexpired lease), gives back what
//! is over its share, and — when every shard is held — takes one shard per round
//! from the writer holding the most, so a newcomer gets its share without a registry
//! table. Intent transactions re-check the lease under a row lock ([`shard_fence_in_txn`]),
//! so a shard taken away mid-reconcile never sees a write from its former owner.

use std::collections::BTreeSet;
use std::time::Duration;

use gitops_shared::db::{DbError, DbPool, pooled};
use tokio::sync::watch;
use tokio_postgres::Transaction;
use tokio_util::sync::CancellationToken;

/// The number of shards; the rows exist from migration V2.
pub const SHARDS: i32 = 64;

/// The shard of a namespace: FNV-1a (32 bit) of its name modulo [`SHARDS`].
pub fn shard_of(namespace: &str) -> i32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in namespace.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    // The modulus is below 64, so the value fits.
    i32::try_from(hash % SHARDS.unsigned_abs()).unwrap_or(0)
}

const RENEW: &str = "
UPDATE writer_shard SET lease_expires_at = now() + $2::bigint * interval '1 millisecond', updated_at = now()
 WHERE writer_id = $1 AND lease_expires_at > now()
RETURNING shard";

const OTHER_WRITERS: &str = "
SELECT count(DISTINCT writer_id) FROM writer_shard WHERE lease_expires_at > now() AND writer_id <> $1";

const RELEASE: &str = "
UPDATE writer_shard SET writer_id = NULL, lease_expires_at = NULL, updated_at = now()
 WHERE writer_id = $1 AND shard = ANY($2)";

const ACQUIRE: &str = "
UPDATE writer_shard SET writer_id = $1, lease_expires_at = now() + $2::bigint * interval '1 millisecond', updated_at = now()
 WHERE shard IN (SELECT shard FROM writer_shard
                  WHERE writer_id IS NULL OR lease_expires_at <= now()
                  ORDER BY shard LIMIT $3 FOR UPDATE SKIP LOCKED)
RETURNING shard";

// One shard of the writer holding the most, when that writer holds more than $3.
const TAKE_OVER: &str = "
UPDATE writer_shard SET writer_id = $1, lease_expires_at = now() + $2::bigint * interval '1 millisecond', updated_at = now()
 WHERE shard = (SELECT shard FROM writer_shard
                 WHERE lease_expires_at > now()
                   AND writer_id = (SELECT writer_id FROM writer_shard
                                     WHERE lease_expires_at > now() AND writer_id <> $1
                                     GROUP BY writer_id HAVING count(*) > $3
                                     ORDER BY count(*) DESC, writer_id LIMIT 1)
                 ORDER BY shard DESC LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING shard";

const FENCE: &str = "
SELECT 1 FROM writer_shard WHERE shard = $1 AND writer_id = $2 AND lease_expires_at > now() FOR SHARE";

/// Whether `writer_id` holds `shard`, locking the row against a hand-over until
/// `txn` ends.
pub async fn shard_fence_in_txn(txn: &Transaction<'_>, shard: i32, writer_id: &str) -> Result<bool, DbError> {
    let row = txn.query_opt(FENCE, &[&shard, &writer_id]).await.map_err(DbError::query("check a shard lease"))?;
    Ok(row.is_some())
}

/// How the keeper holds its leases.
#[derive(Debug, Clone, Copy)]
pub struct ShardConfig {
    /// How long a lease lasts without renewal.
    pub lease: Duration,
    /// How often leases are renewed and the share recomputed (well below `lease`).
    pub interval: Duration,
}

impl Default for ShardConfig {
    fn default() -> Self {
        ShardConfig { lease: Duration::from_secs(15), interval: Duration::from_secs(5) }
    }
}

/// Keeps this writer's shards and publishes the owned set.
pub struct ShardKeeper {
    pool: DbPool,
    writer_id: String,
    config: ShardConfig,
    owned: watch::Sender<Vec<i32>>,
}

impl ShardKeeper {
    pub fn new(pool: DbPool, writer_id: String, config: ShardConfig) -> (Self, watch::Receiver<Vec<i32>>) {
        let (owned, rx) = watch::channel(Vec::new());
        (ShardKeeper { pool, writer_id, config, owned }, rx)
    }

    /// Renews and rebalances every interval until `cancel`, then releases every shard.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            match self.round().await {
                Ok(owned) => {
                    self.owned.send_if_modified(|current| {
                        let changed = *current != owned;
                        if changed {
                            tracing::info!(writer.id = %self.writer_id, shards = owned.len(), "owned shards changed");
                            *current = owned;
                        }
                        changed
                    });
                }
                Err(error) => {
                    // Leases that lapse are dropped here so no work continues on them.
                    tracing::warn!(writer.id = %self.writer_id, error = %error, "could not renew shard leases");
                    self.owned.send_if_modified(|current| !std::mem::take(current).is_empty());
                }
            }
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(self.config.interval) => {}
            }
        }
        self.owned.send_replace(Vec::new());
        if let Err(error) = self.release_all().await {
            tracing::warn!(writer.id = %self.writer_id, error = %error, "could not release shard leases; they expire");
        }
    }

    /// One renewal and rebalancing; returns the shards held afterwards.
    async fn round(&self) -> Result<Vec<i32>, DbError> {
        let client = pooled(&self.pool).await?;
        let lease_ms = i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX);
        let id = self.writer_id.as_str();
        let mut owned: BTreeSet<i32> = client
            .query(RENEW, &[&id, &lease_ms])
            .await
            .map_err(DbError::query("renew shard leases"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let others: i64 =
            client.query_one(OTHER_WRITERS, &[&id]).await.map_err(DbError::query("count live writers"))?.get(0);
        let live = others + 1;
        let total = i64::from(SHARDS);
        let share = usize::try_from((total + live - 1) / live).unwrap_or(0);
        let floor = usize::try_from(total / live).unwrap_or(0);
        if owned.len() > share {
            let excess: Vec<i32> = owned.iter().rev().take(owned.len() - share).copied().collect();
            client.execute(RELEASE, &[&id, &excess]).await.map_err(DbError::query("release shards"))?;
            for shard in excess {
                owned.remove(&shard);
            }
        } else if owned.len() < share {
            let want = i64::try_from(share - owned.len()).unwrap_or(0);
            let rows =
                client.query(ACQUIRE, &[&id, &lease_ms, &want]).await.map_err(DbError::query("acquire shards"))?;
            owned.extend(rows.iter().map(|row| row.get::<_, i32>(0)));
            if owned.len() < floor {
                let share_i64 = i64::try_from(share).unwrap_or(i64::MAX);
                let rows = client
                    .query(TAKE_OVER, &[&id, &lease_ms, &share_i64])
                    .await
                    .map_err(DbError::query("take over a shard"))?;
                owned.extend(rows.iter().map(|row| row.get::<_, i32>(0)));
            }
        }
        Ok(owned.into_iter().collect())
    }

    async fn release_all(&self) -> Result<(), DbError> {
        let client = pooled(&self.pool).await?;
        let all: Vec<i32> = (0..SHARDS).collect();
        client.execute(RELEASE, &[&self.writer_id, &all]).await.map_err(DbError::query("release shards"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_reference_values() {
        // FNV-1a 32 of "" is the offset basis; of "a" is 0xe40c292c.
        assert_eq!(shard_of(""), (0x811c_9dc5_u32 % 64) as i32);
        assert_eq!(shard_of("a"), (0xe40c_292c_u32 % 64) as i32);
        assert_eq!(shard_of("foobar"), (0xbf9c_f968_u32 % 64) as i32);
    }

    #[test]
    fn shards_are_in_range_and_spread() {
        let shards: BTreeSet<i32> = (0..1000).map(|i| shard_of(&format!("team-{i}"))).collect();
        assert!(shards.iter().all(|s| (0..SHARDS).contains(s)));
        assert!(shards.len() > 50, "1000 names cover most shards: {}", shards.len());
    }
}
