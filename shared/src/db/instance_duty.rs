//! The per-instance duty lease (`engine_instance_duty`): every agent process serving
//! an instance claims its operations, but the instance's singleton duties — the
//! sweep, the health probe and heartbeat, the fence clean-up — belong to the
//! process holding this lease. One statement takes or renews it: the row's lock
//! (`ON CONFLICT DO UPDATE`) orders racing processes, and the update happens only
//! for the holder or once the lease expired, so two processes never hold it at once.

use std::time::Duration;

use tokio_postgres::Client;

use crate::db::{DbError, column};
use crate::model::EngineInstanceId;

const HOLD: &str = "
INSERT INTO engine_instance_duty (engine_instance_id, holder, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3::float8))
ON CONFLICT (engine_instance_id) DO UPDATE
   SET holder = EXCLUDED.holder,
       expires_at = EXCLUDED.expires_at,
       acquired_at = CASE WHEN engine_instance_duty.holder = EXCLUDED.holder
                          THEN engine_instance_duty.acquired_at ELSE now() END
 WHERE engine_instance_duty.holder = EXCLUDED.holder OR engine_instance_duty.expires_at < now()
RETURNING holder";

const RELEASE: &str = "DELETE FROM engine_instance_duty WHERE engine_instance_id = $1 AND holder = $2";

const HOLDER: &str = "
SELECT holder FROM engine_instance_duty WHERE engine_instance_id = $1 AND expires_at >= now()";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[HOLD, RELEASE, HOLDER];

/// Takes or renews instance `id`'s duty lease for `holder`, for `lease`; returns
/// whether `holder` holds it now (false: another process's lease has not expired).
pub async fn instance_duty_hold(
    client: &Client,
    id: EngineInstanceId,
    holder: &str,
    lease: Duration,
) -> Result<bool, DbError> {
    let row = client
        .query_opt(HOLD, &[&id, &holder, &lease.as_secs_f64()])
        .await
        .map_err(DbError::query("hold an instance's duty lease"))?;
    Ok(row.is_some())
}

/// Gives up `holder`'s lease on instance `id` (another process takes it at once).
pub async fn instance_duty_release(client: &Client, id: EngineInstanceId, holder: &str) -> Result<(), DbError> {
    client.execute(RELEASE, &[&id, &holder]).await.map_err(DbError::query("release an instance's duty lease"))?;
    Ok(())
}

/// The process holding instance `id`'s unexpired duty lease, if any.
pub async fn instance_duty_holder(client: &Client, id: EngineInstanceId) -> Result<Option<String>, DbError> {
    let action = "read an instance's duty lease";
    let row = client.query_opt(HOLDER, &[&id]).await.map_err(DbError::query(action))?;
    row.map(|row| column(&row, "holder", action)).transpose()
}
