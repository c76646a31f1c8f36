//! The `managed_environment` table (with its sealed `cluster_credential`), as the
//! writer reads it: environments found by name within a tenant, and the tenant's
//! *home* environment — the credentials of its home identity — with the expiry of
//! its token. (The upsert of an environment and its credentials is in
//! `credential`, which seals them.)

use std::time::SystemTime;

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Transaction};
use uuid::Uuid;

use crate::db::{DbError, Statements};
use crate::model::{ManagedEnvironmentId, TenantId};

// Tenants name their own environments; the home environment is never one of them.
const BY_NAME: &str = "
SELECT e.id FROM managed_environment e JOIN tenant t ON t.id = e.tenant_id
 WHERE t.namespace_uid = $1 AND e.resource_name = $2 AND e.row_state = 'active' AND NOT e.home";

const HOME: &str = "
SELECT e.id, c.expires_at FROM managed_environment e
  JOIN tenant t ON t.id = e.tenant_id
  LEFT JOIN cluster_credential c ON c.managed_environment_id = e.id
 WHERE t.namespace_uid = $1 AND e.home AND e.row_state = 'active'";

const LIVE_OF_RESOURCE: &str = "
SELECT id FROM managed_environment WHERE resource_uid = $1 AND tenant_id = $2 AND row_state = 'active'";

const MARK_HOME: &str = "UPDATE managed_environment SET home = true WHERE id = $1 AND NOT home";

const SET_EXPIRY: &str = "UPDATE cluster_credential SET expires_at = $2 WHERE managed_environment_id = $1";

// Home identities failover asked to replace (oldest first).
const HOME_REVOCATIONS: &str = "
SELECT e.id, t.namespace_uid, e.home_revoke_requested_at AS requested_at FROM managed_environment e
  JOIN tenant t ON t.id = e.tenant_id
 WHERE e.home_revoke_requested_at IS NOT NULL
 ORDER BY e.home_revoke_requested_at
 LIMIT $1";

// Cleared only when not asked again meanwhile.
const HOME_REVOKED: &str = "
UPDATE managed_environment SET home_revoke_requested_at = NULL
 WHERE id = $1 AND home_revoke_requested_at = $2";

const HOME_NEAR_EXPIRY: &str = "
SELECT t.namespace_name, t.namespace_uid FROM managed_environment e
  JOIN tenant t ON t.id = e.tenant_id
  JOIN cluster_credential c ON c.managed_environment_id = e.id
 WHERE e.home AND e.row_state = 'active' AND t.row_state = 'active'
   AND t.writer_shard = ANY($1) AND c.expires_at < $2
 ORDER BY c.expires_at
 LIMIT 500";

// A tenant's environment whose credentials are a token the writer requested (of a
// ServiceAccount it installed): its generation and the token's expiry.
const TOKEN_OF_RESOURCE: &str = "
SELECT e.generation, e.namespaces, e.cluster_resources, c.expires_at FROM managed_environment e
  JOIN cluster_credential c ON c.managed_environment_id = e.id
 WHERE e.resource_uid = $1 AND e.row_state = 'active' AND NOT e.home";

const TOKENS_NEAR_EXPIRY: &str = "
SELECT t.namespace_name, e.resource_name FROM managed_environment e
  JOIN tenant t ON t.id = e.tenant_id
  JOIN cluster_credential c ON c.managed_environment_id = e.id
 WHERE NOT e.home AND e.row_state = 'active' AND t.row_state = 'active'
   AND t.writer_shard = ANY($1) AND c.expires_at < $2
 ORDER BY c.expires_at
 LIMIT 500";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[
    BY_NAME,
    HOME,
    LIVE_OF_RESOURCE,
    MARK_HOME,
    SET_EXPIRY,
    HOME_NEAR_EXPIRY,
    HOME_REVOCATIONS,
    HOME_REVOKED,
    TOKEN_OF_RESOURCE,
    TOKENS_NEAR_EXPIRY,
];

fn id(row: &tokio_postgres::Row) -> Result<ManagedEnvironmentId, DbError> {
    row.try_get("id").map_err(DbError::query("read a managed environment"))
}

/// The live environment called `name` of the tenant of namespace `namespace_uid`.
pub async fn managed_environment_by_name(
    client: &Client,
    namespace_uid: Uuid,
    name: &str,
) -> Result<Option<ManagedEnvironmentId>, DbError> {
    let row = client
        .query_opt(BY_NAME, &[&namespace_uid, &name])
        .await
        .map_err(DbError::query("look up a managed environment"))?;
    row.as_ref().map(id).transpose()
}

/// The home environment of the tenant of namespace `namespace_uid` and when its
/// token expires (None: no token stored yet).
pub async fn managed_environment_home(
    client: &impl Statements,
    namespace_uid: Uuid,
) -> Result<Option<(ManagedEnvironmentId, Option<SystemTime>)>, DbError> {
    // Planned for each call (an unnamed statement, sent with its types), not kept: a
    // plan kept from while the tables were small read them whole on every later
    // call, 2,500 buffers per call at 10,000 tenants, until the next ANALYZE.
    let rows = client
        .connection()
        .query_typed(HOME, &[(&namespace_uid, Type::UUID)])
        .await
        .map_err(DbError::query("read a home environment"))?;
    rows.into_iter()
        .next()
        .map(|row| Ok((id(&row)?, row.try_get("expires_at").map_err(DbError::query("read a home environment"))?)))
        .transpose()
}

/// The live environment row of resource `resource_uid` of `tenant`.
pub async fn managed_environment_live_in_txn(
    txn: &impl Statements,
    resource_uid: Uuid,
    tenant: TenantId,
) -> Result<Option<ManagedEnvironmentId>, DbError> {
    let row = txn
        .row_opt(LIVE_OF_RESOURCE, &[&resource_uid, &tenant])
        .await
        .map_err(DbError::query("read a managed environment"))?;
    row.as_ref().map(id).transpose()
}

/// Marks an environment as its tenant's home one and records its token's expiry.
pub async fn managed_environment_set_home_in_txn(
    txn: &Transaction<'_>,
    environment: ManagedEnvironmentId,
    expires_at: SystemTime,
) -> Result<(), DbError> {
    txn.execute(MARK_HOME, &[&environment]).await.map_err(DbError::query("mark a home environment"))?;
    txn.execute(SET_EXPIRY, &[&environment, &expires_at]).await.map_err(DbError::query("record a token's expiry"))?;
    Ok(())
}

/// Records when the stored credentials of a tenant's environment expire: a
/// requested token's expiry, or None for credentials the tenant supplied.
pub async fn managed_environment_set_expiry_in_txn(
    txn: &Transaction<'_>,
    environment: ManagedEnvironmentId,
    expires_at: Option<SystemTime>,
) -> Result<(), DbError> {
    txn.execute(SET_EXPIRY, &[&environment, &expires_at]).await.map_err(DbError::query("record a token's expiry"))?;
    Ok(())
}

/// What is stored of a tenant's environment whose credentials may be a token the
/// writer requested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredToken {
    pub generation: i64,
    pub namespaces: Vec<String>,
    pub cluster_resources: bool,
    /// When the stored token expires; None: the tenant's own credentials are stored.
    pub expires_at: Option<SystemTime>,
}

/// The stored state of a tenant's environment (resource `resource_uid`); None when
/// nothing is stored.
pub async fn managed_environment_token(client: &Client, resource_uid: Uuid) -> Result<Option<StoredToken>, DbError> {
    let row = client
        .query_opt(TOKEN_OF_RESOURCE, &[&resource_uid])
        .await
        .map_err(DbError::query("read an environment's token expiry"))?;
    row.map(|row| {
        Ok(StoredToken {
            generation: row.try_get("generation")?,
            namespaces: row.try_get("namespaces")?,
            cluster_resources: row.try_get("cluster_resources")?,
            expires_at: row.try_get("expires_at")?,
        })
    })
    .transpose()
    .map_err(DbError::query("read an environment's token expiry"))
}

/// (namespace name, environment name) of the tenants' own environments in
/// `shards` whose stored token expires before `horizon`, soonest first (at most 500).
pub async fn managed_environment_tokens_near_expiry(
    client: &Client,
    shards: &[i32],
    horizon: SystemTime,
) -> Result<Vec<(String, String)>, DbError> {
    let rows = client
        .query(TOKENS_NEAR_EXPIRY, &[&shards, &horizon])
        .await
        .map_err(DbError::query("find environment tokens near expiry"))?;
    rows.iter()
        .map(|row| Ok((row.try_get("namespace_name")?, row.try_get("resource_name")?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(DbError::query("read an environment token near expiry"))
}

/// (namespace name, namespace UID) of the tenants in `shards` whose home token
/// expires before `horizon`, soonest first (at most 500).
pub async fn managed_environment_home_near_expiry(
    client: &Client,
    shards: &[i32],
    horizon: SystemTime,
) -> Result<Vec<(String, Uuid)>, DbError> {
    let rows = client
        .query(HOME_NEAR_EXPIRY, &[&shards, &horizon])
        .await
        .map_err(DbError::query("find home tokens near expiry"))?;
    rows.iter()
        .map(|row| Ok((row.try_get("namespace_name")?, row.try_get("namespace_uid")?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(DbError::query("read a home token near expiry"))
}

/// A home identity failover asked to replace: the environment, the tenant
/// namespace's UID (which names the ServiceAccount) and when it was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeRevocation {
    pub id: ManagedEnvironmentId,
    pub namespace_uid: Uuid,
    pub requested_at: SystemTime,
}

/// Up to `limit` home identities to replace, oldest request first.
pub async fn managed_environment_home_revocations(client: &Client, limit: i64) -> Result<Vec<HomeRevocation>, DbError> {
    let action = "find home identities to replace";
    let rows = client.query(HOME_REVOCATIONS, &[&limit]).await.map_err(DbError::query(action))?;
    rows.iter()
        .map(|row| {
            Ok(HomeRevocation {
                id: row.try_get("id")?,
                namespace_uid: row.try_get("namespace_uid")?,
                requested_at: row.try_get("requested_at")?,
            })
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(DbError::query(action))
}

/// Clears `revocation` once its ServiceAccount was deleted (unless asked again since).
pub async fn managed_environment_home_revoked(client: &Client, revocation: &HomeRevocation) -> Result<(), DbError> {
    client
        .execute(HOME_REVOKED, &[&revocation.id, &revocation.requested_at])
        .await
        .map_err(DbError::query("clear a home identity replacement"))?;
    Ok(())
}
