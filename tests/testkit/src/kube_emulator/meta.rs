//! Object metadata helpers shared by every verb: RFC 3339 timestamps (no date
//! crate in the testkit), uids, `generateName` suffixes, name validation with the
//! API server's messages, and small accessors on `serde_json::Value` objects.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::errors::Cause;

/// Seconds since the Unix epoch.
pub fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

/// `2006-01-02T15:04:05Z` for the current second.
pub fn now_rfc3339() -> String {
    rfc3339(now_unix())
}

/// `2006-01-02T15:04:05Z` for `unix` seconds.
pub fn rfc3339(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Five characters from the alphabet kube-apiserver uses for `generateName`.
pub fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut bytes = [0u8; 5];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = uuid::Uuid::new_v4().as_bytes()[..5].try_into().unwrap_or([0; 5]);
    }
    bytes.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

const SUBDOMAIN_MESSAGE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

fn is_label(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// As Kubernetes' IsDNS1123Subdomain: the regex and at most 253 characters in all;
/// a part between dots may be longer than a label's 63.
fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label_chars)
}

fn is_label_chars(s: &str) -> bool {
    let bytes = s.as_bytes();
    !bytes.is_empty()
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// How a kind's names are validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most kinds).
    Subdomain,
    /// RFC 1123 label (namespaces).
    Label,
    /// Path segment: anything but `.`, `..`, `/` and `%` (RBAC kinds).
    PathSegment,
}

/// The causes for an invalid `metadata.name`.
pub fn validate_name(name: &str, rule: NameRule) -> Vec<Cause> {
    let message = match rule {
        NameRule::Subdomain if !is_subdomain(name) => Some(SUBDOMAIN_MESSAGE.to_owned()),
        NameRule::Label if !is_label(name) => Some(LABEL_MESSAGE.to_owned()),
        NameRule::PathSegment if name == "." || name == ".." => Some(format!("may not be '{name}'")),
        NameRule::PathSegment if name.contains('/') => Some("may not contain '/'".to_owned()),
        NameRule::PathSegment if name.contains('%') => Some("may not contain '%'".to_owned()),
        _ => None,
    };
    match message {
        Some(message) => {
            vec![Cause::new("FieldValueInvalid", "metadata.name", format!("Invalid value: \"{name}\": {message}"))]
        }
        None => Vec::new(),
    }
}

/// `object.metadata` as a map, created when missing.
pub fn metadata_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.get("metadata").is_some_and(Value::is_object) {
        object["metadata"] = Value::Object(Map::new());
    }
    match object.get_mut("metadata") {
        Some(Value::Object(map)) => map,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// A string field of `object.metadata`, or "".
pub fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str).unwrap_or("")
}

pub fn name(object: &Value) -> &str {
    meta_str(object, "name")
}

pub fn uid(object: &Value) -> &str {
    meta_str(object, "uid")
}

pub fn resource_version(object: &Value) -> &str {
    meta_str(object, "resourceVersion")
}

pub fn finalizers(object: &Value) -> Vec<String> {
    object
        .get("metadata")
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

pub fn is_deleting(object: &Value) -> bool {
    object.get("metadata").and_then(|m| m.get("deletionTimestamp")).is_some_and(|v| !v.is_null())
}

pub fn labels(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata").and_then(|m| m.get("labels")).and_then(Value::as_object)
}

/// The user-agent prefix kube-apiserver takes as the default field manager.
pub fn manager_from_user_agent(user_agent: &str) -> String {
    let prefix = user_agent.split('/').next().unwrap_or("").trim();
    if prefix.is_empty() { "unknown".to_owned() } else { prefix.chars().take(128).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn validates_names() {
        assert!(validate_name("a-b.c", NameRule::Subdomain).is_empty());
        assert_eq!(validate_name("Bad_Name", NameRule::Subdomain).len(), 1);
        assert_eq!(validate_name("a.b", NameRule::Label).len(), 1);
        assert!(validate_name("system:masters", NameRule::PathSegment).is_empty());
        assert_eq!(random_suffix().len(), 5);
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn a_subdomain_part_may_exceed_a_labels_length_as_in_kubernetes() {
        assert!(validate_name(&"b".repeat(111), NameRule::Subdomain).is_empty());
        assert!(!validate_name(&"b".repeat(254), NameRule::Subdomain).is_empty());
        assert!(!validate_name(&"b".repeat(64), NameRule::Label).is_empty());
        assert!(!validate_name("a..b", NameRule::Subdomain).is_empty());
        assert!(!validate_name("-a", NameRule::Subdomain).is_empty());
    }
}
