//! Enqueue: the outbox insert, only ever inside the caller's transaction.

use tokio_postgres::Transaction;
use tokio_postgres::types::Type;

use crate::db::{DbError, column};
use crate::model::{EngineInstanceId, OperationId, ResourceType, TenantId};

/// What `operation_enqueue_in_txn` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// A new waiting operation; the trigger signalled the instance's agents.
    New(OperationId),
    /// The resource already had a waiting operation due now: nothing was written.
    Coalesced,
    /// The resource had a waiting operation scheduled for later (a retry) or on
    /// another instance: it was moved to now and this instance, and signalled.
    Rescheduled(OperationId),
}

// One round trip: sent with its parameter types (`query_typed`), so it is parsed and
// run in one exchange instead of being prepared first; the resource type travels as
// text and is cast here.
//
// The partial unique index allows one waiting operation per resource. A waiting
// operation that is already due and in the queue absorbs the new request without a
// write; one that waits for a retry (or whose retry time passed and no claimer gave
// it its queue key yet: see `queue::floor`), or was meant for another instance, is
// brought forward.
const ENQUEUE: &str = "
INSERT INTO operation (engine_instance_id, tenant_id, resource_type, resource_id)
VALUES ($1, $2, $3::resource_type, $4)
ON CONFLICT (resource_type, resource_id) WHERE state = 'waiting'
DO UPDATE SET run_after = LEAST(operation.run_after, now()),
              engine_instance_id = EXCLUDED.engine_instance_id,
              tenant_id = EXCLUDED.tenant_id
    WHERE operation.run_after > now()
       OR operation.queue_key IS NULL
       OR operation.engine_instance_id <> EXCLUDED.engine_instance_id
RETURNING id, (xmax = 0) AS inserted";

/// Asks for `resource` to be reconciled on `instance`, as part of `txn`: the
/// operation exists exactly when the caller's intent commits.
pub async fn operation_enqueue_in_txn(
    txn: &Transaction<'_>,
    instance: EngineInstanceId,
    tenant: TenantId,
    resource_type: ResourceType,
    resource_id: i64,
) -> Result<Enqueued, DbError> {
    let rows = txn
        .query_typed(
            ENQUEUE,
            &[
                (&instance.0, Type::INT8),
                (&tenant.0, Type::INT8),
                (&resource_type.as_str(), Type::TEXT),
                (&resource_id, Type::INT8),
            ],
        )
        .await
        .map_err(DbError::query("enqueue an operation"))?;
    let Some(row) = rows.first() else { return Ok(Enqueued::Coalesced) };
    let id = column(row, "id", "enqueue an operation")?;
    Ok(if column(row, "inserted", "enqueue an operation")? { Enqueued::New(id) } else { Enqueued::Rescheduled(id) })
}
