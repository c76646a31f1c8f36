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

use gitops_shared::db::writer_shard::{
    writer_shard_acquire, writer_shard_other_writers, writer_shard_release, writer_shard_renew, writer_shard_take_over,
};
use gitops_shared::db::{DbError, DbPool, pooled};
use tokio::sync::watch;
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

pub use gitops_shared::db::writer_shard::writer_shard_fence_in_txn as shard_fence_in_txn;

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
        let (id, lease) = (self.writer_id.as_str(), self.config.lease);
        let mut owned: BTreeSet<i32> = writer_shard_renew(&client, id, lease).await?.into_iter().collect();
        let live = writer_shard_other_writers(&client, id).await? + 1;
        let total = i64::from(SHARDS);
        let share = usize::try_from((total + live - 1) / live).unwrap_or(0);
        let floor = usize::try_from(total / live).unwrap_or(0);
        if owned.len() > share {
            let excess: Vec<i32> = owned.iter().rev().take(owned.len() - share).copied().collect();
            writer_shard_release(&client, id, &excess).await?;
            for shard in excess {
                owned.remove(&shard);
            }
        } else if owned.len() < share {
            let want = i64::try_from(share - owned.len()).unwrap_or(0);
            owned.extend(writer_shard_acquire(&client, id, lease, want).await?);
            if owned.len() < floor {
                let share = i64::try_from(share).unwrap_or(i64::MAX);
                owned.extend(writer_shard_take_over(&client, id, lease, share).await?);
            }
        }
        Ok(owned.into_iter().collect())
    }

    async fn release_all(&self) -> Result<(), DbError> {
        let client = pooled(&self.pool).await?;
        let all: Vec<i32> = (0..SHARDS).collect();
        writer_shard_release(&client, &self.writer_id, &all).await
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
