//! Writer shards: every tenant namespace belongs to one of [`SHARDS`] shards (FNV-1a
//! of its name), and each shard has at most one owning writer at a time, held as a
//! lease on its `writer_shard` row. Intent transactions re-check the lease under a
//! row lock ([`shard_fence_in_txn`]), so a shard taken away mid-reconcile never sees a
//! write from its former owner.
//!
//! The [`ShardKeeper`] renews this writer's leases every `interval` and, once the
//! writer is ready (its watchers listed, so its Kubernetes API answers), takes every
//! free or expired shard at once, whatever its share: a shard nobody holds serves
//! nobody, while a share computed now may still count a writer that crashed but whose
//! leases have not run out. The keeper also wakes when the first lease held by another
//! writer is due to expire, so a crashed writer's shards are taken within a fraction
//! of a second of their expiry instead of up to an `interval` later: no shard stays
//! ownerless much longer than a lease after its owner's last renewal.
//!
//! Fairness (the shard count over the live writers, a writer being live while it
//! holds an unexpired lease it renewed lately) is restored gradually, one shard per
//! round on each side: a ready writer below its share (rounded down) takes one shard
//! from the writer holding the most, if that one is above its share (rounded up); a
//! writer above its share hands one straight to the live writer furthest below its
//! share, under the lease that writer last renewed its own shards to, and only if it
//! renewed within [`HAND_OVER_FRESH`]. A shard given for fairness is therefore never
//! ownerless, and one handed to a writer that crashed a moment ago expires with that
//! writer's other shards. So a newcomer gets its share without a registry table, and a
//! share miscounted (a crashed writer still counted) never sends shards ownerless.

use std::collections::BTreeSet;
use std::time::Duration;

use gitops_shared::db::writer_shard::{
    OtherWriterRow, writer_shard_acquire, writer_shard_hand_over, writer_shard_other_writers, writer_shard_release,
    writer_shard_renew, writer_shard_take_over, writer_shard_unowned,
};
use gitops_shared::db::{DbError, DbPool, PooledClient, held_or_pooled};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The number of shards; the rows exist from migration V2.
pub const SHARDS: i32 = 64;

/// How long past another writer's lease expiry the keeper looks again: enough for the
/// database clock to have passed it, little next to a lease.
const EXPIRY_MARGIN: Duration = Duration::from_millis(150);
/// A round slower than this is logged: it delays renewals and takeovers.
const SLOW_ROUND: Duration = Duration::from_secs(1);
/// How often a ready keeper below its share looks for shards given back.
const BELOW_SHARE_LOOK: Duration = Duration::from_secs(1);
/// How recently a writer must have renewed its leases to be handed a shard: a writer
/// below its share renews every [`BELOW_SHARE_LOOK`], so one silent for longer may
/// have crashed.
pub const HAND_OVER_FRESH: Duration = Duration::from_secs(2);
/// How soon the keeper tries again after a failed round (its connection is replaced).
const FAILED_ROUND_RETRY: Duration = Duration::from_secs(1);
/// How soon a ready keeper looks again while shards are left unowned.
const UNOWNED_RETRY: Duration = Duration::from_millis(250);

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
    /// The keeper also looks again when another writer's lease is due to expire.
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
    /// Whether the writer may take shards (its watchers have listed once).
    ready: watch::Receiver<bool>,
    /// The keeper's own connection, held between rounds so that a renewal or a
    /// takeover never waits for a pool busy with intent transactions; replaced after
    /// a failed round.
    connection: Option<PooledClient>,
    owned: watch::Sender<Vec<i32>>,
}

/// What one round leaves: the shards held and when to look again.
struct Round {
    owned: Vec<i32>,
    next: Duration,
}

impl ShardKeeper {
    /// A keeper that takes shards only while `ready` says true; renewing what it
    /// holds does not wait for it.
    pub fn new(
        pool: DbPool,
        writer_id: String,
        config: ShardConfig,
        ready: watch::Receiver<bool>,
    ) -> (Self, watch::Receiver<Vec<i32>>) {
        let (owned, rx) = watch::channel(Vec::new());
        (ShardKeeper { pool, writer_id, config, ready, owned, connection: None }, rx)
    }

    /// Renews and rebalances every interval, when another writer's lease is due to
    /// expire and when the writer becomes ready, until `cancel`; then releases every
    /// shard. A keeper that is dropped instead releases nothing: its leases expire.
    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            let ready = *self.ready.borrow_and_update();
            let started = std::time::Instant::now();
            let round = self.round(ready).await;
            if started.elapsed() > SLOW_ROUND {
                tracing::warn!(writer.id = %self.writer_id, elapsed = ?started.elapsed(),
                    "a shard round took long: leases may lapse and free shards wait");
            }
            let next = match round {
                Ok(Round { owned, next }) => {
                    self.owned.send_if_modified(|current| {
                        let changed = *current != owned;
                        if changed {
                            let gained: Vec<i32> = owned.iter().copied().filter(|s| !current.contains(s)).collect();
                            let lost: Vec<i32> = current.iter().copied().filter(|s| !owned.contains(s)).collect();
                            tracing::info!(writer.id = %self.writer_id, shards = owned.len(), ?gained, ?lost,
                                "owned shards changed");
                            *current = owned;
                        }
                        changed
                    });
                    next
                }
                Err(error) => {
                    self.connection = None;
                    // Leases that lapse are dropped here so no work continues on them.
                    tracing::warn!(writer.id = %self.writer_id, error = %error, "could not renew shard leases");
                    self.owned.send_if_modified(|current| !std::mem::take(current).is_empty());
                    self.config.interval.min(FAILED_ROUND_RETRY)
                }
            };
            tokio::select! {
                () = cancel.cancelled() => break,
                () = tokio::time::sleep(next) => {}
                () = until_ready(&mut self.ready), if !ready => {}
            }
        }
        self.owned.send_replace(Vec::new());
        if let Err(error) = self.release_all().await {
            tracing::warn!(writer.id = %self.writer_id, error = %error, "could not release shard leases; they expire");
        }
    }

    /// One renewal and rebalancing; returns the shards held afterwards.
    async fn round(&mut self, ready: bool) -> Result<Round, DbError> {
        let mut held = self.connection.take();
        let round = match held_or_pooled(&self.pool, &mut held).await {
            Ok(client) => self.round_on(client, ready).await,
            Err(error) => Err(error),
        };
        self.connection = held;
        round
    }

    async fn round_on(&self, client: &tokio_postgres::Client, ready: bool) -> Result<Round, DbError> {
        let (id, lease) = (self.writer_id.as_str(), self.config.lease);
        let mut owned: BTreeSet<i32> = writer_shard_renew(client, id, lease).await?.into_iter().collect();
        // Shards the acquisition skipped (another statement held their row for a
        // moment) are looked at again soon, not at the next interval. Counted before
        // any shard is given back below: those are for other writers to take.
        let mut skipped = false;
        if ready {
            owned.extend(writer_shard_acquire(client, id, lease, i64::from(SHARDS)).await?);
            skipped = writer_shard_unowned(client).await? > 0;
        }
        let others = writer_shard_other_writers(client, id).await?;
        // Fairness counts the writers that renewed within the last round (and a
        // second): one that stopped renewing has likely crashed, and shards given
        // back for it would wait for nobody.
        let live: Vec<&OtherWriterRow> =
            others.iter().filter(|other| renewed_lately(other.expires_in, self.config)).collect();
        let loads: Vec<i64> = live.iter().map(|other| other.shards).collect();
        match rebalance(ready, owned.len(), &loads) {
            Rebalance::TakeOne { share } => {
                owned.extend(writer_shard_take_over(client, id, lease, share).await?);
            }
            Rebalance::GiveOne => {
                if let (Some(&shard), Some(recipient)) = (owned.last(), recipient(&live))
                    && writer_shard_hand_over(client, id, shard, &recipient.writer_id, lease, HAND_OVER_FRESH).await?
                {
                    tracing::info!(writer.id = %self.writer_id, shard, to = %recipient.writer_id,
                        "handed a shard over for fairness");
                    owned.remove(&shard);
                }
            }
            Rebalance::Stay => {}
        }
        let mut next = next_look(self.config.interval, &others);
        if skipped {
            next = next.min(UNOWNED_RETRY);
        }
        // A ready writer below its share is the one that takes the shards others give
        // back: it looks every second while it is, so a shard given back is taken
        // within a second, not at the next interval.
        if ready && below_share(owned.len(), &loads) {
            next = next.min(BELOW_SHARE_LOOK);
        }
        Ok(Round { owned: owned.into_iter().collect(), next })
    }

    async fn release_all(&mut self) -> Result<(), DbError> {
        let client = held_or_pooled(&self.pool, &mut self.connection).await?;
        let all: Vec<i32> = (0..SHARDS).collect();
        writer_shard_release(client, &self.writer_id, &all).await
    }
}

/// Returns once `ready` is true; never, when it can no longer change.
async fn until_ready(ready: &mut watch::Receiver<bool>) {
    if ready.wait_for(|ready| *ready).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The writer a shard given for fairness goes to: the one holding the fewest, and of
/// those the one that renewed last.
fn recipient<'a>(live: &[&'a OtherWriterRow]) -> Option<&'a OtherWriterRow> {
    live.iter().copied().min_by(|a, b| a.shards.cmp(&b.shards).then(b.expires_in.cmp(&a.expires_in)))
}

/// When the keeper looks again: after `interval`, or just after the first lease of
/// another writer is due to expire, whichever comes first.
fn next_look(interval: Duration, others: &[OtherWriterRow]) -> Duration {
    others.iter().map(|other| other.expires_in + EXPIRY_MARGIN).fold(interval, Duration::min)
}

/// Whether a writer whose first lease expires in `expires_in` renewed within the
/// last interval and a second (leases are renewed every interval).
fn renewed_lately(expires_in: Duration, config: ShardConfig) -> bool {
    expires_in + config.interval + Duration::from_secs(1) >= config.lease
}

/// Whether a writer holding `owned` shards is below its share (rounded down) while
/// the other live writers hold `others` each.
fn below_share(owned: usize, others: &[i64]) -> bool {
    let live = i64::try_from(others.len()).unwrap_or(i64::MAX).saturating_add(1);
    i64::try_from(owned).unwrap_or(i64::MAX) < i64::from(SHARDS) / live
}

/// The one step towards a fair split a round takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rebalance {
    /// Take one shard from the writer holding the most, if it holds more than `share`.
    TakeOne {
        share: i64,
    },
    /// Hand one shard over: this writer holds more than its share (rounded up) and
    /// another live writer less than its share (rounded down).
    GiveOne,
    Stay,
}

/// The step for a writer holding `owned` shards while the other live writers hold
/// `others` each. Only a ready writer takes; any writer gives back its excess.
fn rebalance(ready: bool, owned: usize, others: &[i64]) -> Rebalance {
    let total = i64::from(SHARDS);
    let live = i64::try_from(others.len()).unwrap_or(i64::MAX).saturating_add(1);
    let share = (total + live - 1) / live;
    let floor = total / live;
    let owned = i64::try_from(owned).unwrap_or(i64::MAX);
    if ready && owned < floor && others.iter().any(|&held| held > share) {
        Rebalance::TakeOne { share }
    } else if owned > share && others.iter().any(|&held| held < floor) {
        Rebalance::GiveOne
    } else {
        Rebalance::Stay
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

    #[test]
    fn only_writers_that_renewed_lately_count_for_the_share() {
        let config = ShardConfig::default(); // lease 15 s, renewed every 5 s
        assert!(renewed_lately(Duration::from_secs(14), config));
        assert!(renewed_lately(Duration::from_secs(9), config), "renewed 6 s ago: within a round and a second");
        assert!(!renewed_lately(Duration::from_secs(8), config), "7 s without renewing: not counted");
    }

    #[test]
    fn a_writer_below_its_share_looks_often_for_shards_given_back() {
        assert!(below_share(10, &[30, 24]), "21 is the share of three");
        assert!(!below_share(21, &[22, 21]));
        assert!(below_share(0, &[]), "alone, 64 is the share");
        assert!(!below_share(64, &[]));
    }

    #[test]
    fn a_writer_below_its_share_takes_one_shard_from_a_writer_above_it() {
        assert_eq!(rebalance(true, 0, &[64]), Rebalance::TakeOne { share: 32 });
        assert_eq!(rebalance(true, 20, &[23, 21]), Rebalance::TakeOne { share: 22 });
        assert_eq!(rebalance(false, 0, &[64]), Rebalance::Stay, "a writer that is not ready takes nothing");
        // Nobody above the share: nothing to take, even below it.
        assert_eq!(rebalance(true, 20, &[22, 22]), Rebalance::Stay);
    }

    #[test]
    fn a_writer_gives_back_one_shard_only_while_another_is_below_its_share() {
        assert_eq!(rebalance(true, 64, &[1]), Rebalance::GiveOne);
        assert_eq!(rebalance(true, 23, &[21, 20]), Rebalance::GiveOne);
        // Every other writer at its share: the excess stays where it is served.
        assert_eq!(rebalance(true, 22, &[21, 21]), Rebalance::Stay);
        assert_eq!(rebalance(true, 40, &[]), Rebalance::Stay, "alone, every shard is its share");
        assert_eq!(rebalance(true, 32, &[32]), Rebalance::Stay);
    }

    #[test]
    fn a_shard_given_for_fairness_goes_to_the_writer_holding_fewest_that_renewed_last() {
        let other = |id: &str, shards, secs| OtherWriterRow {
            writer_id: id.into(),
            shards,
            expires_in: Duration::from_secs(secs),
        };
        let (a, b, c) = (other("a", 30, 14), other("b", 10, 12), other("c", 10, 14));
        assert_eq!(recipient(&[&a, &b, &c]).map(|r| r.writer_id.as_str()), Some("c"));
        assert_eq!(recipient(&[&a]).map(|r| r.writer_id.as_str()), Some("a"));
        assert!(recipient(&[]).is_none());
    }

    #[test]
    fn the_keeper_looks_again_just_after_the_first_lease_of_another_writer_expires() {
        let other = |expires_in| OtherWriterRow { writer_id: "w".into(), shards: 1, expires_in };
        let interval = Duration::from_secs(5);
        assert_eq!(next_look(interval, &[]), interval);
        let soon = [other(Duration::from_secs(9)), other(Duration::from_secs(2))];
        assert_eq!(next_look(interval, &soon), Duration::from_secs(2) + EXPIRY_MARGIN);
        assert_eq!(next_look(interval, &[other(Duration::from_secs(30))]), interval);
    }
}
