//! The intent transaction every controller writes through: fence the shard, then
//! find the namespace's tenant under its row lock and record its shard, then store
//! the intent (`Controllers::in_tenant_txn`).
//!
//! A tenant seen for the first time is placed on an engine instance in a short
//! transaction of its own, before the intent's. Placing counts the tenant on the
//! instance, which locks the instance's row until commit (that is how two placements
//! racing for its last slot are told apart): inside the intent transaction, every new
//! tenant's intent waited for the one before it to commit, and so did the agents'
//! heartbeats on that row.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use gitops_shared::db::credential::CredentialError;
use gitops_shared::db::placement::{Unplaced, placement_choose_in_txn};
use gitops_shared::db::tenant::{
    tenant_of_namespace_locked_in_txn, tenant_place_in_txn, tenant_set_shard_in_txn, tenant_upsert_locked_in_txn,
};
use gitops_shared::db::{DbError, PooledTransaction};
use gitops_shared::model::{EngineInstanceId, RowState, TenantId};
use uuid::Uuid;

use super::Controllers;
use crate::shard::{shard_fence_in_txn, shard_of};

/// What an intent transaction did.
pub(super) enum Placed<T> {
    /// The intent's own outcome.
    Stored(T),
    /// This writer does not hold the namespace's shard (nothing written).
    NotOwner,
    /// No engine instance can take the tenant now, and why.
    NoEngine(Unplaced),
    /// The tenant is being cleaned up (its namespace went): nothing written.
    Gone,
}

impl Controllers {
    /// Runs `body` (retried on conflicts) in a transaction that first places and
    /// locks the tenant of `namespace`, under the shard fence; `body` gets the tenant
    /// and its engine instance.
    pub(super) async fn in_tenant_txn<T, F>(
        &self,
        namespace: &str,
        namespace_uid: Uuid,
        body: F,
    ) -> Result<Placed<T>, DbError>
    where
        T: Send + 'static,
        F: for<'t> Fn(&'t PooledTransaction<'t>, TenantId, EngineInstanceId) -> BoxFuture<'t, Result<T, DbError>>
            + Send
            + Sync
            + 'static,
    {
        let body = Arc::new(body);
        let (shard, healthy_within) = (shard_of(namespace), self.settings.healthy_within);
        let (writer_id, namespace) = (Arc::new(self.ctx.writer_id.clone()), Arc::new(namespace.to_owned()));
        let mut client = gitops_shared::db::pooled(&self.ctx.pool).await?;
        let mut rounds = 0;
        let placed = loop {
            rounds += 1;
            // Should the tenant be unplaced again each time (moved away between the two
            // transactions), the last round places it inside the intent's.
            let may_place = rounds >= PLACING_ROUNDS;
            let stored = self
                .in_txn(&mut client, |txn| {
                    let (body, writer_id, namespace) = (body.clone(), writer_id.clone(), namespace.clone());
                    Box::pin(async move {
                        let of = TenantOf { uid: namespace_uid, name: &namespace, shard, writer_id: &writer_id };
                        let tenancy = tenant_placed_in_txn(txn, &of, healthy_within, may_place).await?;
                        match tenancy {
                            Tenancy::Placed(tenant, instance) => {
                                body(txn, tenant, instance).await.map(|stored| Some(Placed::Stored(stored)))
                            }
                            Tenancy::Unplaced => Ok(None),
                            Tenancy::NotOwner => Ok(Some(Placed::NotOwner)),
                            Tenancy::NoEngine(why) => Ok(Some(Placed::NoEngine(why))),
                            Tenancy::Gone => Ok(Some(Placed::Gone)),
                        }
                    })
                })
                .await?;
            if let Some(placed) = stored {
                break placed;
            }
            let placing = self
                .in_txn(&mut client, |txn| {
                    let (writer_id, namespace) = (writer_id.clone(), namespace.clone());
                    Box::pin(async move {
                        let of = TenantOf { uid: namespace_uid, name: &namespace, shard, writer_id: &writer_id };
                        tenant_placing_txn(txn, &of, healthy_within).await
                    })
                })
                .await?;
            match placing {
                Placing::Placed => {}
                Placing::NotOwner => break Placed::NotOwner,
                Placing::NoEngine(why) => break Placed::NoEngine(why),
            }
        };
        if let Placed::NoEngine(why) = &placed {
            self.ctx.metrics.unplaced(why.as_str());
        }
        Ok(placed)
    }
}

/// Rounds of "intent transaction, then placing transaction" before the intent
/// transaction places the tenant itself.
const PLACING_ROUNDS: u32 = 3;

/// Where the intent goes, or why it cannot be written now.
enum Tenancy {
    Placed(TenantId, EngineInstanceId),
    /// The tenant has no engine instance, and this transaction was not to place it
    /// (nothing written).
    Unplaced,
    NotOwner,
    NoEngine(Unplaced),
    /// The tenant is being cleaned up (its namespace went): write nothing.
    Gone,
}

/// The namespace whose tenant a transaction writes for, and the shard and writer
/// that fence it.
#[derive(Clone, Copy)]
struct TenantOf<'a> {
    uid: Uuid,
    name: &'a str,
    shard: i32,
    writer_id: &'a str,
}

/// The intent transaction's first steps: the shard fence, then the namespace's tenant
/// under its row lock, with its shard recorded. A tenant without an instance is
/// placed here only when `may_place`.
async fn tenant_placed_in_txn(
    txn: &impl gitops_shared::db::Statements,
    of: &TenantOf<'_>,
    healthy_within: Duration,
    may_place: bool,
) -> Result<Tenancy, DbError> {
    let TenantOf { uid: namespace_uid, name: namespace, shard, writer_id } = *of;
    if !shard_fence_in_txn(txn, shard, writer_id).await? {
        return Ok(Tenancy::NotOwner);
    }
    let (tenant, recorded_shard) = match tenant_of_namespace_locked_in_txn(txn, namespace_uid).await? {
        Some(locked) if locked.tenant.engine_instance_id.is_some() || locked.tenant.row_state != RowState::Active => {
            (locked.tenant, locked.writer_shard)
        }
        _ if !may_place => return Ok(Tenancy::Unplaced),
        _ => match placement_choose_in_txn(txn, healthy_within).await? {
            Ok(instance) => (tenant_upsert_locked_in_txn(txn, namespace_uid, namespace, Some(instance)).await?, None),
            Err(why) => return Ok(Tenancy::NoEngine(why)),
        },
    };
    if tenant.row_state != RowState::Active {
        return Ok(Tenancy::Gone);
    }
    let Some(instance) = tenant.engine_instance_id else { return Ok(Tenancy::NoEngine(Unplaced::Unavailable)) };
    if recorded_shard != Some(shard) {
        tenant_set_shard_in_txn(txn, tenant.id, shard).await?;
    }
    Ok(Tenancy::Placed(tenant.id, instance))
}

/// The placing transaction: under the shard fence, places the namespace's tenant
/// (creating its row) on the instance placement chooses, and writes nothing else,
/// so that the instance's row is locked only until the commit right after.
/// `Placed` means placed by now (by this call or another), not which instance.
async fn tenant_placing_txn(
    txn: &impl gitops_shared::db::Statements,
    of: &TenantOf<'_>,
    healthy_within: Duration,
) -> Result<Placing, DbError> {
    let TenantOf { uid: namespace_uid, name: namespace, shard, writer_id } = *of;
    if !shard_fence_in_txn(txn, shard, writer_id).await? {
        return Ok(Placing::NotOwner);
    }
    match placement_choose_in_txn(txn, healthy_within).await? {
        Ok(instance) => {
            tenant_place_in_txn(txn, namespace_uid, namespace, instance).await?;
            Ok(Placing::Placed)
        }
        Err(why) => Ok(Placing::NoEngine(why)),
    }
}

/// What a placing transaction did.
enum Placing {
    /// The tenant is placed now (by it, or by someone before it).
    Placed,
    NotOwner,
    NoEngine(Unplaced),
}

/// A credential upsert's error as the transaction's; the message never carries
/// secret material.
pub(super) fn credential_error(error: CredentialError) -> DbError {
    match error {
        CredentialError::Db(error) => error,
        other => DbError::Credentials { source: Box::new(other) },
    }
}
