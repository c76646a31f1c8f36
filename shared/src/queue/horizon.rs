//! Who holds back the database's xmin horizon: the oldest snapshot or transaction
//! id any session, standby, replication slot or prepared transaction still needs.
//! While it is held, no row version the queue's work left behind can be cleaned
//! up, and every scan walks them; the agent exports the holder's age and
//! `gitopsctl queue` names it, so an operator can end it.
//!
//! Only what can hold this database back counts: its own sessions (a snapshot in
//! `backend_xmin`, a written transaction in `backend_xid`), walsenders (a standby's
//! `hot_standby_feedback`), replication slots' `xmin` (not `catalog_xmin`, which
//! holds back catalogs only) and this database's prepared transactions. Without
//! `pg_read_all_stats` another role's sessions show no `state`, `client_addr` or
//! `xact_start`: the age in XIDs is still known, the age in seconds is not.

use std::time::Duration;

use tokio_postgres::Client;

use crate::db::DbError;

/// The oldest holder of the xmin horizon.
#[derive(Debug, Clone, PartialEq)]
pub struct HorizonHolder {
    /// `session`, `walsender`, `replication slot` or `prepared transaction`.
    pub kind: String,
    /// The backend's pid (sessions and walsenders).
    pub pid: Option<i32>,
    /// The session's `application_name`, the slot's name or the prepared
    /// transaction's gid.
    pub name: String,
    /// The client's address, when the server shows it.
    pub client: Option<String>,
    /// The role it runs as, when known.
    pub role: Option<String>,
    /// The session's state (`idle in transaction`, `active`, …), when shown.
    pub state: Option<String>,
    /// How many transaction ids old the horizon it holds is.
    pub age_xids: i64,
    /// How long its transaction has been open (None: not shown, or a slot).
    pub age: Option<Duration>,
}

// The same query operators run with psql.
const OLDEST: &str = include_str!("../../../sql/inspect/oldest_snapshot.sql");

/// The holder of the oldest horizon, seen from `client` (its own session excluded).
/// None when nothing holds one.
pub async fn xmin_horizon_holder(client: &Client) -> Result<Option<HorizonHolder>, DbError> {
    let action = "find the oldest snapshot";
    let row = client.query_opt(OLDEST, &[]).await.map_err(DbError::query(action))?;
    let Some(row) = row else { return Ok(None) };
    let read = || -> Result<HorizonHolder, tokio_postgres::Error> {
        Ok(HorizonHolder {
            kind: row.try_get("kind")?,
            pid: row.try_get("pid")?,
            name: row.try_get::<_, Option<String>>("name")?.unwrap_or_default(),
            client: row.try_get("client")?,
            role: row.try_get("role")?,
            state: row.try_get("state")?,
            age_xids: i64::from(row.try_get::<_, i32>("age_xids")?),
            age: row.try_get::<_, Option<f64>>("age_s")?.map(|s| Duration::from_secs_f64(s.max(0.0))),
        })
    };
    read().map(Some).map_err(DbError::query(action))
}

/// The statements of this module, for the test that prepares them all.
pub const STATEMENTS: &[&str] = &[OLDEST];
