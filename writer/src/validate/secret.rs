//! Reading values out of a tenant's Secret: its type, and a key's bytes as UTF-8
//! text with a size limit. Messages name the key, never the value.

use k8s_openapi::api::core::v1::Secret;

use super::{Invalid, reason};

/// The Secret's type, `Opaque` when unset.
pub(super) fn secret_type(secret: &Secret) -> &str {
    secret.type_.as_deref().filter(|t| !t.is_empty()).unwrap_or("Opaque")
}

/// Refuses a Secret whose type is not one of `allowed`.
pub(super) fn require_type(secret: &Secret, allowed: &[&str]) -> Result<(), Invalid> {
    let found = secret_type(secret);
    if allowed.contains(&found) {
        return Ok(());
    }
    let found = super::text::text("type", found, 253).unwrap_or("(invalid)");
    Err(Invalid::new(
        reason::SECRET_WRONG_TYPE,
        format!("the Secret has type {found:?}; expected one of {}", allowed.join(", ")),
    ))
}

/// The value of `key`, None when absent or empty. Refuses non-UTF-8, NUL and
/// values over `max` bytes.
pub(super) fn secret_text(secret: &Secret, key: &str, max: usize) -> Result<Option<String>, Invalid> {
    let Some(bytes) = secret.data.as_ref().and_then(|data| data.get(key)).map(|b| b.0.as_slice()) else {
        return Ok(None);
    };
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() > max {
        return Err(Invalid::new(
            reason::FIELD_TOO_LONG,
            format!("the Secret's key {key:?} is {} bytes long; at most {max} are allowed", bytes.len()),
        ));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Invalid::new(reason::INVALID_CHARACTERS, format!("the Secret's key {key:?} is not UTF-8 text")))?;
    if text.contains('\0') {
        return Err(Invalid::new(
            reason::INVALID_CHARACTERS,
            format!("the Secret's key {key:?} contains a NUL character"),
        ));
    }
    Ok(Some(text.to_owned()))
}
