//! `gitopsctl secrets`: key rotation for the secrets the service stores sealed.
//! Rotation is: generate a key, add it to GITOPS_ENCRYPTION_KEYS, make it active,
//! roll the services, run `reencrypt`, and only then drop the old key.

use gitops_shared::crypto::{self, SecretBox};

use crate::CtlError;

/// Re-seals every stored secret with the active key of `secrets`; returns how
/// many rows moved.
pub async fn reencrypt(database_url: &str, secrets: &SecretBox) -> Result<u64, CtlError> {
    let mut client = crate::connect(database_url).await?;
    crypto::reencrypt_all(&mut client, secrets).await.map_err(|source| CtlError::Reencrypt { source })
}

/// The keys `secrets reencrypt` uses: GITOPS_ENCRYPTION_KEYS and
/// GITOPS_ENCRYPTION_ACTIVE_KEY, never flags (the process list is public).
pub fn keys_from_env() -> Result<SecretBox, CtlError> {
    SecretBox::from_env().map_err(|source| CtlError::Keys { source })
}

/// The line `secrets reencrypt` prints.
pub fn render_reencrypt(rows: u64, secrets: &SecretBox) -> String {
    format!("{rows} secrets re-encrypted with key {:?}\n", secrets.active_key_id())
}

/// A new key as `ID:base64key`. The id is checked by parsing the result exactly as
/// the services will, so a key printed here is one they accept.
pub fn generate_key(id: &str) -> Result<String, CtlError> {
    let key = SecretBox::generate_key(id).map_err(|source| CtlError::GenerateKey { source })?;
    SecretBox::from_config(Some(&key), Some(id)).map_err(|source| CtlError::GenerateKey { source })?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_accepted_and_bad_ids_refused() {
        let key = generate_key("k2").expect("key");
        assert!(key.starts_with("k2:"));
        assert!(SecretBox::from_config(Some(&key), Some("k2")).is_ok());
        assert!(matches!(generate_key("Bad Id"), Err(CtlError::GenerateKey { .. })));
    }
}
