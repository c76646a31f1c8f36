//! Managed environments and repository credentials with their sealed secrets: the
//! JSON shapes that are sealed (allow-listed fields only — nothing else from a
//! tenant's Secret is ever stored) and the writer's upserts, which seal them bound
//! to their table and tenant. The agent opens them only in memory.

use std::fmt;

use serde::{Deserialize, Serialize};
use tokio_postgres::Transaction;
use uuid::Uuid;

use crate::crypto::{CryptoError, SecretBox, SecretContext};
use crate::db::DbError;
use crate::model::{ManagedEnvironmentId, RepositoryCredentialId, TenantId};

/// Table names, which are also the secrets' contexts.
pub const CLUSTER_CREDENTIAL_TABLE: &str = "cluster_credential";
pub const REPOSITORY_CREDENTIAL_TABLE: &str = "repository_credential";

/// The allow-listed fields of a kubeconfig that reach Argo CD: a bearer token or a
/// client certificate, the CA and the TLS server name. Data fields are base64 of
/// PEM, as in a kubeconfig. `Debug` shows which fields are set, never their values.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterCredentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
}

impl fmt::Debug for ClusterCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterCredentials")
            .field("bearer_token", &self.bearer_token.is_some())
            .field("client_certificate_data", &self.client_certificate_data.is_some())
            .field("client_key_data", &self.client_key_data.is_some())
            .field("certificate_authority_data", &self.certificate_authority_data.is_some())
            .field("tls_server_name", &self.tls_server_name)
            .finish()
    }
}

/// Git credentials: username/password or an SSH private key. `Debug` hides values.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryCredentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_private_key: Option<String>,
}

impl fmt::Debug for RepositoryCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RepositoryCredentials")
            .field("username", &self.username.is_some())
            .field("password", &self.password.is_some())
            .field("ssh_private_key", &self.ssh_private_key.is_some())
            .finish()
    }
}

/// Why credentials could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("could not seal credentials")]
    Seal(#[source] CryptoError),
    #[error("could not encode credentials")]
    Encode(#[source] serde_json::Error),
}

/// A validated GitOpsDeploymentManagedEnvironment with its credentials.
#[derive(Debug, Clone)]
pub struct ManagedEnvironmentIntent {
    pub resource_uid: Uuid,
    pub resource_name: String,
    pub generation: i64,
    pub api_url: String,
    pub allow_insecure_skip_tls_verify: bool,
    pub namespaces: Vec<String>,
    pub cluster_resources: bool,
    pub secret_name: String,
    pub secret_resource_version: Option<String>,
    pub credentials: ClusterCredentials,
}

const ENVIRONMENT_UPSERT: &str = "
INSERT INTO managed_environment (tenant_id, resource_uid, resource_name, generation, api_url,
                                 allow_insecure_skip_tls_verify, namespaces, cluster_resources)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (resource_uid) DO UPDATE
   SET resource_name = EXCLUDED.resource_name, generation = EXCLUDED.generation,
       api_url = EXCLUDED.api_url,
       allow_insecure_skip_tls_verify = EXCLUDED.allow_insecure_skip_tls_verify,
       namespaces = EXCLUDED.namespaces, cluster_resources = EXCLUDED.cluster_resources,
       updated_at = now()
 WHERE managed_environment.generation < EXCLUDED.generation
   AND managed_environment.tenant_id = EXCLUDED.tenant_id
   AND managed_environment.row_state = 'active'
RETURNING id";

const ENVIRONMENT_ID: &str = "
SELECT id FROM managed_environment WHERE resource_uid = $1 AND tenant_id = $2 AND row_state = 'active'";

// A new Secret name or resourceVersion is a rotation; the same one changes nothing.
const CLUSTER_CREDENTIAL_UPSERT: &str = "
INSERT INTO cluster_credential (tenant_id, managed_environment_id, secret_name, secret_resource_version,
                                key_id, ciphertext)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (managed_environment_id) DO UPDATE
   SET secret_name = EXCLUDED.secret_name, secret_resource_version = EXCLUDED.secret_resource_version,
       key_id = EXCLUDED.key_id, ciphertext = EXCLUDED.ciphertext, updated_at = now()
 WHERE cluster_credential.tenant_id = EXCLUDED.tenant_id
   AND (cluster_credential.secret_name IS DISTINCT FROM EXCLUDED.secret_name
        OR cluster_credential.secret_resource_version IS DISTINCT FROM EXCLUDED.secret_resource_version)
RETURNING id";

/// Writes a managed environment and its sealed credentials. Returns the row id when
/// something changed (enqueue an operation then), None when nothing did.
pub async fn managed_environment_upsert_in_txn(
    txn: &Transaction<'_>,
    secrets: &SecretBox,
    tenant: TenantId,
    intent: &ManagedEnvironmentIntent,
) -> Result<Option<ManagedEnvironmentId>, CredentialError> {
    let changed = txn
        .query_opt(
            ENVIRONMENT_UPSERT,
            &[
                &tenant,
                &intent.resource_uid,
                &intent.resource_name,
                &intent.generation,
                &intent.api_url,
                &intent.allow_insecure_skip_tls_verify,
                &intent.namespaces,
                &intent.cluster_resources,
            ],
        )
        .await
        .map_err(DbError::query("upsert a managed environment"))?
        .is_some();
    let Some(row) = txn
        .query_opt(ENVIRONMENT_ID, &[&intent.resource_uid, &tenant])
        .await
        .map_err(DbError::query("read a managed environment"))?
    else {
        return Ok(None);
    };
    let id: ManagedEnvironmentId = row.try_get("id").map_err(DbError::query("read a managed environment"))?;
    let plain = serde_json::to_vec(&intent.credentials).map_err(CredentialError::Encode)?;
    let context = SecretContext { table: CLUSTER_CREDENTIAL_TABLE, tenant };
    let sealed = secrets.seal(context, &plain).map_err(CredentialError::Seal)?;
    let rotated = txn
        .query_opt(
            CLUSTER_CREDENTIAL_UPSERT,
            &[&tenant, &id, &intent.secret_name, &intent.secret_resource_version, &sealed.key_id, &sealed.ciphertext],
        )
        .await
        .map_err(DbError::query("store cluster credentials"))?
        .is_some();
    Ok((changed || rotated).then_some(id))
}

/// A validated GitOpsDeploymentRepositoryCredential; `credentials` is None while
/// its Secret is missing or invalid.
#[derive(Debug, Clone)]
pub struct RepositoryCredentialIntent {
    pub resource_uid: Uuid,
    pub resource_name: String,
    pub generation: i64,
    pub repo_url: String,
    pub secret_name: String,
    pub secret_resource_version: Option<String>,
    pub credentials: Option<RepositoryCredentials>,
}

// Newer generation, or the same generation with another Secret version (rotation).
const REPOSITORY_CREDENTIAL_UPSERT: &str = "
INSERT INTO repository_credential (tenant_id, resource_uid, resource_name, generation, repo_url,
                                   secret_name, secret_resource_version, key_id, ciphertext)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (resource_uid) DO UPDATE
   SET resource_name = EXCLUDED.resource_name, generation = EXCLUDED.generation,
       repo_url = EXCLUDED.repo_url, secret_name = EXCLUDED.secret_name,
       secret_resource_version = EXCLUDED.secret_resource_version,
       key_id = EXCLUDED.key_id, ciphertext = EXCLUDED.ciphertext, updated_at = now()
 WHERE repository_credential.tenant_id = EXCLUDED.tenant_id
   AND repository_credential.row_state = 'active'
   AND (repository_credential.generation < EXCLUDED.generation
        OR (repository_credential.generation = EXCLUDED.generation
            AND (repository_credential.secret_name IS DISTINCT FROM EXCLUDED.secret_name
                 OR repository_credential.secret_resource_version
                    IS DISTINCT FROM EXCLUDED.secret_resource_version)))
RETURNING id";

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] =
    &[ENVIRONMENT_UPSERT, ENVIRONMENT_ID, CLUSTER_CREDENTIAL_UPSERT, REPOSITORY_CREDENTIAL_UPSERT];

/// Writes a repository credential, sealing its secret. Returns the row id when
/// something changed.
pub async fn repository_credential_upsert_in_txn(
    txn: &Transaction<'_>,
    secrets: &SecretBox,
    tenant: TenantId,
    intent: &RepositoryCredentialIntent,
) -> Result<Option<RepositoryCredentialId>, CredentialError> {
    let sealed = match &intent.credentials {
        Some(credentials) => {
            let plain = serde_json::to_vec(credentials).map_err(CredentialError::Encode)?;
            let context = SecretContext { table: REPOSITORY_CREDENTIAL_TABLE, tenant };
            Some(secrets.seal(context, &plain).map_err(CredentialError::Seal)?)
        }
        None => None,
    };
    let row = txn
        .query_opt(
            REPOSITORY_CREDENTIAL_UPSERT,
            &[
                &tenant,
                &intent.resource_uid,
                &intent.resource_name,
                &intent.generation,
                &intent.repo_url,
                &intent.secret_name,
                &intent.secret_resource_version,
                &sealed.as_ref().map(|s| s.key_id.as_str()),
                &sealed.as_ref().map(|s| s.ciphertext.as_slice()),
            ],
        )
        .await
        .map_err(DbError::query("upsert a repository credential"))?;
    let id = row.map(|row| row.try_get("id")).transpose();
    Ok(id.map_err(DbError::query("upsert a repository credential"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_secret_values() {
        let cluster = ClusterCredentials { bearer_token: Some("s3cret-token".into()), ..Default::default() };
        let repo = RepositoryCredentials { password: Some("hunter2".into()), ..Default::default() };
        assert!(!format!("{cluster:?}").contains("s3cret"));
        assert!(!format!("{repo:?}").contains("hunter2"));
    }

    #[test]
    fn unknown_fields_are_dropped_on_read() {
        let parsed: ClusterCredentials =
            serde_json::from_str(r#"{"bearer_token":"t","exec":{"command":"rm"}}"#).expect("parse");
        assert_eq!(serde_json::to_value(&parsed).expect("encode"), serde_json::json!({"bearer_token": "t"}));
    }
}
