//! Kubernetes object names: DNS-1123 labels (namespaces) and subdomains (most
//! object names), as the API server defines them.

use super::{Invalid, limits, text::required};

/// A DNS-1123 label: 1–63 of `a-z`, `0-9`, `-`, starting and ending alphanumeric.
pub fn dns_label(field: &str, value: &str, reason: &'static str) -> Result<String, Invalid> {
    let value = required(field, value, limits::DNS_LABEL)?;
    if is_label(value) {
        Ok(value.to_owned())
    } else {
        Err(Invalid::new(
            reason,
            format!(
                "{field} must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit"
            ),
        ))
    }
}

/// A DNS-1123 subdomain: up to 253 characters of dot-separated labels.
pub fn dns_subdomain(field: &str, value: &str, reason: &'static str) -> Result<String, Invalid> {
    let value = required(field, value, limits::DNS_SUBDOMAIN)?;
    if value.split('.').all(is_label) {
        Ok(value.to_owned())
    } else {
        Err(Invalid::new(
            reason,
            format!(
                "{field} must be a DNS-1123 name: lower-case letters, digits, '-' and '.', starting and ending with a letter or digit"
            ),
        ))
    }
}

fn is_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= limits::DNS_LABEL
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::super::reason::INVALID_DESTINATION_NAMESPACE as R;
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert_eq!(dns_label("f", "team-a1", R), Ok("team-a1".to_owned()));
        for bad in ["Team", "-a", "a-", "a.b", "a_b", "a b", "a;b", "ä"] {
            assert_eq!(dns_label("f", bad, R).unwrap_err().reason, R, "{bad}");
        }
        assert_eq!(dns_label("f", &"a".repeat(64), R).unwrap_err().reason, super::super::reason::FIELD_TOO_LONG);
        assert_eq!(dns_label("f", "", R).unwrap_err().reason, super::super::reason::FIELD_REQUIRED);
        assert_eq!(dns_subdomain("f", "my.env-1", R), Ok("my.env-1".to_owned()));
        for bad in ["a..b", ".a", "a.", "A.b", "a/b", "$(x)"] {
            assert_eq!(dns_subdomain("f", bad, R).unwrap_err().reason, R, "{bad}");
        }
        assert_eq!(dns_subdomain("f", &"a".repeat(254), R).unwrap_err().reason, super::super::reason::FIELD_TOO_LONG);
    }
}
