//! Secret encryption: AES-256-GCM with keys from configuration and the key id
//! stored beside every ciphertext, so keys can be rotated (`reencrypt`).
//!
//! A ciphertext is `nonce (12 bytes) ‖ sealed`. The associated data binds it to
//! its table and tenant, so a ciphertext copied to another tenant's row does not
//! decrypt.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use tokio_postgres::Client;

use crate::db::{DbError, in_txn_retrying};
use crate::model::TenantId;

const NONCE_LEN: usize = 12;

/// Why keys or ciphertexts were refused. No variant carries key material.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    #[error("no encryption keys configured: set GITOPS_ENCRYPTION_KEYS and GITOPS_ENCRYPTION_ACTIVE_KEY")]
    NoKeys,
    #[error("GITOPS_ENCRYPTION_KEYS entry {position} is not `id:base64key`")]
    Malformed { position: usize },
    #[error("encryption key id {id:?} is not 1–32 characters of a-z, 0-9, '-' or '_'")]
    BadKeyId { id: String },
    #[error("encryption key {id:?} is not base64 of exactly 32 bytes")]
    BadKey { id: String },
    #[error("encryption key id {id:?} appears twice")]
    DuplicateKeyId { id: String },
    #[error("the active encryption key {id:?} is not among the configured keys")]
    ActiveKeyMissing { id: String },
    #[error("no configured key has id {id:?}; it encrypted stored secrets")]
    UnknownKey { id: String },
    #[error("a stored secret failed authentication (tampered, or bound to another row)")]
    Tampered,
    #[error("could not encrypt a secret")]
    Encrypt,
}

/// The configured keys. `Debug` prints key ids only.
#[derive(Clone)]
pub struct SecretBox {
    keys: Arc<HashMap<String, Aes256Gcm>>,
    active: String,
}

impl fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("SecretBox").field("key_ids", &ids).field("active", &self.active).finish()
    }
}

/// A sealed secret as stored: which key, and the bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub ciphertext: Vec<u8>,
}

/// What a sealed secret is bound to (its associated data).
#[derive(Debug, Clone, Copy)]
pub struct SecretContext<'a> {
    pub table: &'a str,
    pub tenant: TenantId,
}

impl SecretContext<'_> {
    fn aad(&self) -> Vec<u8> {
        format!("gitops/{}/{}", self.table, self.tenant.0).into_bytes()
    }
}

impl SecretBox {
    /// Parses `id:base64key,…` and the active id. Refuses an empty list: a
    /// service that stores secrets must never start without a key.
    pub fn from_config(keys: Option<&str>, active: Option<&str>) -> Result<Self, CryptoError> {
        let keys = keys.map(str::trim).filter(|k| !k.is_empty()).ok_or(CryptoError::NoKeys)?;
        let active = active.map(str::trim).filter(|a| !a.is_empty()).ok_or(CryptoError::NoKeys)?;
        let mut parsed = HashMap::new();
        for (position, entry) in keys.split(',').enumerate() {
            let position = position + 1;
            let (id, key) = entry.trim().split_once(':').ok_or(CryptoError::Malformed { position })?;
            let valid_id = !id.is_empty()
                && id.len() <= 32
                && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
            if !valid_id {
                return Err(CryptoError::BadKeyId { id: id.chars().take(40).collect() });
            }
            let bytes = BASE64.decode(key.trim()).map_err(|_| CryptoError::BadKey { id: id.to_owned() })?;
            let cipher = Aes256Gcm::new_from_slice(&bytes).map_err(|_| CryptoError::BadKey { id: id.to_owned() })?;
            if parsed.insert(id.to_owned(), cipher).is_some() {
                return Err(CryptoError::DuplicateKeyId { id: id.to_owned() });
            }
        }
        if !parsed.contains_key(active) {
            return Err(CryptoError::ActiveKeyMissing { id: active.to_owned() });
        }
        Ok(SecretBox { keys: Arc::new(parsed), active: active.to_owned() })
    }

    /// Reads `GITOPS_ENCRYPTION_KEYS` and `GITOPS_ENCRYPTION_ACTIVE_KEY`.
    pub fn from_env() -> Result<Self, CryptoError> {
        let keys = std::env::var(crate::config::ENCRYPTION_KEYS).ok();
        let active = std::env::var(crate::config::ENCRYPTION_ACTIVE_KEY).ok();
        Self::from_config(keys.as_deref(), active.as_deref())
    }

    /// A fresh random key as `id:base64key` (for development set-ups and rotation).
    pub fn generate_key(id: &str) -> Result<String, CryptoError> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|_| CryptoError::Encrypt)?;
        Ok(format!("{id}:{}", BASE64.encode(key)))
    }

    /// The id new secrets are sealed with.
    pub fn active_key_id(&self) -> &str {
        &self.active
    }

    /// Seals `plaintext` with the active key.
    pub fn seal(&self, context: SecretContext<'_>, plaintext: &[u8]) -> Result<Sealed, CryptoError> {
        let cipher = &self.keys[&self.active];
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|_| CryptoError::Encrypt)?;
        let aad = context.aad();
        let sealed = cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: &aad })
            .map_err(|_| CryptoError::Encrypt)?;
        let mut ciphertext = nonce.to_vec();
        ciphertext.extend_from_slice(&sealed);
        Ok(Sealed { key_id: self.active.clone(), ciphertext })
    }

    /// Opens a sealed secret; refuses unknown keys and anything tampered with.
    pub fn open(&self, context: SecretContext<'_>, sealed: &Sealed) -> Result<Vec<u8>, CryptoError> {
        let cipher =
            self.keys.get(&sealed.key_id).ok_or_else(|| CryptoError::UnknownKey { id: sealed.key_id.clone() })?;
        if sealed.ciphertext.len() < NONCE_LEN {
            return Err(CryptoError::Tampered);
        }
        let (nonce, body) = sealed.ciphertext.split_at(NONCE_LEN);
        let aad = context.aad();
        cipher.decrypt(Nonce::from_slice(nonce), Payload { msg: body, aad: &aad }).map_err(|_| CryptoError::Tampered)
    }
}

/// A failure while re-encrypting stored secrets.
#[derive(Debug, thiserror::Error)]
pub enum ReencryptError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("could not re-encrypt {table} row {id}")]
    Row { table: &'static str, id: i64, source: CryptoError },
}

/// Tables holding sealed secrets: (table, select statement, update statement).
const SEALED_TABLES: &[(&str, &str, &str)] = &[
    (
        "cluster_credential",
        "SELECT id, tenant_id, key_id, ciphertext FROM cluster_credential
          WHERE key_id <> $1 ORDER BY id LIMIT 500 FOR UPDATE",
        "UPDATE cluster_credential SET key_id = $2, ciphertext = $3, updated_at = now() WHERE id = $1",
    ),
    (
        "repository_credential",
        "SELECT id, tenant_id, key_id, ciphertext FROM repository_credential
          WHERE key_id IS NOT NULL AND key_id <> $1 ORDER BY id LIMIT 500 FOR UPDATE",
        "UPDATE repository_credential SET key_id = $2, ciphertext = $3, updated_at = now() WHERE id = $1",
    ),
];

/// Moves every stored secret to the active key, in batches of 500 rows per
/// transaction. Returns how many rows changed. A row sealed with a key that is
/// not configured stops the run with that row named; rows done so far stay done.
pub async fn reencrypt_all(client: &mut Client, secrets: &SecretBox) -> Result<u64, ReencryptError> {
    let mut total = 0;
    for &(table, select, update) in SEALED_TABLES {
        loop {
            let moved = in_txn_retrying(client, |txn| {
                let secrets = secrets.clone();
                Box::pin(async move {
                    let rows = txn
                        .query(select, &[&secrets.active_key_id()])
                        .await
                        .map_err(DbError::query("read sealed secrets"))?;
                    let mut resealed = Vec::with_capacity(rows.len());
                    for row in &rows {
                        let read = DbError::query("read a sealed secret");
                        let id: i64 = row.try_get("id").map_err(read)?;
                        let tenant: TenantId =
                            row.try_get("tenant_id").map_err(DbError::query("read a sealed secret"))?;
                        let context = SecretContext { table, tenant };
                        let sealed = Sealed {
                            key_id: row.try_get("key_id").map_err(DbError::query("read a sealed secret"))?,
                            ciphertext: row.try_get("ciphertext").map_err(DbError::query("read a sealed secret"))?,
                        };
                        let outcome = secrets.open(context, &sealed).and_then(|plain| secrets.seal(context, &plain));
                        match outcome {
                            Ok(new) => resealed.push((id, new)),
                            Err(source) => return Ok(Err(ReencryptError::Row { table, id, source })),
                        }
                    }
                    for (id, new) in &resealed {
                        txn.execute(update, &[id, &new.key_id, &new.ciphertext])
                            .await
                            .map_err(DbError::query("store a re-encrypted secret"))?;
                    }
                    Ok(Ok(resealed.len() as u64))
                })
            })
            .await??;
            total += moved;
            if moved == 0 {
                break;
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secrets(keys: &str, active: &str) -> SecretBox {
        SecretBox::from_config(Some(keys), Some(active)).expect("valid keys")
    }

    const CTX: SecretContext<'static> = SecretContext { table: "repository_credential", tenant: TenantId(7) };

    #[test]
    fn round_trip_and_rotation() {
        let old = SecretBox::generate_key("k1").expect("key");
        let new = SecretBox::generate_key("k2").expect("key");
        let v1 = secrets(&old, "k1");
        let sealed = v1.seal(CTX, b"hunter2").expect("seal");
        assert_eq!(sealed.key_id, "k1");
        assert_ne!(&sealed.ciphertext[NONCE_LEN..], b"hunter2");
        let both = secrets(&format!("{old},{new}"), "k2");
        assert_eq!(both.open(CTX, &sealed).expect("open"), b"hunter2");
        assert_eq!(both.seal(CTX, b"x").expect("seal").key_id, "k2");
        let only_new = secrets(&new, "k2");
        assert_eq!(only_new.open(CTX, &sealed), Err(CryptoError::UnknownKey { id: "k1".into() }));
    }

    #[test]
    fn tampering_and_other_contexts_are_rejected() {
        let v = secrets(&SecretBox::generate_key("k1").expect("key"), "k1");
        let sealed = v.seal(CTX, b"token").expect("seal");
        let mut flipped = sealed.clone();
        let last = flipped.ciphertext.len() - 1;
        flipped.ciphertext[last] ^= 1;
        assert_eq!(v.open(CTX, &flipped), Err(CryptoError::Tampered));
        let other_tenant = SecretContext { tenant: TenantId(8), ..CTX };
        assert_eq!(v.open(other_tenant, &sealed), Err(CryptoError::Tampered));
        let short = Sealed { key_id: "k1".into(), ciphertext: vec![1, 2, 3] };
        assert_eq!(v.open(CTX, &short), Err(CryptoError::Tampered));
    }

    #[test]
    fn missing_or_bad_keys_are_refused_at_start_up() {
        assert_eq!(SecretBox::from_config(None, None).unwrap_err(), CryptoError::NoKeys);
        assert_eq!(SecretBox::from_config(Some(""), Some("k1")).unwrap_err(), CryptoError::NoKeys);
        let key = SecretBox::generate_key("k1").expect("key");
        assert_eq!(SecretBox::from_config(Some(&key), None).unwrap_err(), CryptoError::NoKeys);
        assert_eq!(
            SecretBox::from_config(Some(&key), Some("k9")).unwrap_err(),
            CryptoError::ActiveKeyMissing { id: "k9".into() }
        );
        assert_eq!(
            SecretBox::from_config(Some("k1:c2hvcnQ="), Some("k1")).unwrap_err(),
            CryptoError::BadKey { id: "k1".into() }
        );
        assert_eq!(
            SecretBox::from_config(Some("nocolon"), Some("k1")).unwrap_err(),
            CryptoError::Malformed { position: 1 }
        );
        assert_eq!(
            SecretBox::from_config(Some(&format!("{key},{key}")), Some("k1")).unwrap_err(),
            CryptoError::DuplicateKeyId { id: "k1".into() }
        );
        let debug = format!("{:?}", secrets(&key, "k1"));
        assert!(!debug.contains(key.split_once(':').map(|(_, k)| k).unwrap_or("?")));
    }
}
