//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists, `>`, `<`)
//! and the field selectors every resource supports (`metadata.name`,
//! `metadata.namespace`), parsed once per request and matched per object.

use serde_json::{Map, Value};

use super::errors::ApiError;
use super::meta;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_set(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

fn bad(requirement: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: found '{}', expected: identifier", requirement.trim()))
}

fn valid_key(key: &str) -> bool {
    !key.is_empty() && !key.contains(char::is_whitespace) && !key.contains(['=', '!', '(', ')', ','])
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, ApiError> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(LabelSelector(requirements));
        }
        for raw in split_top_level(text) {
            let part = raw.trim();
            let requirement = if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, set)) = part.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), parse_set(set).ok_or_else(|| bad(part))?)
            } else if let Some((key, set)) = part.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), parse_set(set).ok_or_else(|| bad(part))?)
            } else if let Some((key, n)) = part.split_once('>') {
                Requirement::GreaterThan(key.trim().to_owned(), n.trim().parse().map_err(|_| bad(part))?)
            } else if let Some((key, n)) = part.split_once('<') {
                Requirement::LessThan(key.trim().to_owned(), n.trim().parse().map_err(|_| bad(part))?)
            } else {
                Requirement::Exists(part.to_owned())
            };
            let key = match &requirement {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k)
                | Requirement::GreaterThan(k, _)
                | Requirement::LessThan(k, _) => k,
            };
            if !valid_key(key) {
                return Err(bad(part));
            }
            requirements.push(requirement);
        }
        Ok(LabelSelector(requirements))
    }

    /// The `key=value` pairs every match must carry (from `=`, `==` and a one-value
    /// `in`): a list can start from the objects indexed under one of them instead
    /// of walking the whole table.
    pub fn required_pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().filter_map(|requirement| match requirement {
            Requirement::Equals(k, v) => Some((k.as_str(), v.as_str())),
            Requirement::In(k, set) if set.len() == 1 => Some((k.as_str(), set[0].as_str())),
            _ => None,
        })
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.matches_labels(meta::labels(object))
    }

    /// Whether an object carrying `labels` (None: no labels) is selected.
    pub fn matches_labels(&self, labels: Option<&Map<String, Value>>) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, set) => get(k).is_some_and(|value| set.iter().any(|s| s == value)),
            Requirement::NotIn(k, set) => get(k).is_none_or(|value| !set.iter().any(|s| s == value)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
            Requirement::GreaterThan(k, n) => get(k).and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
            Requirement::LessThan(k, n) => get(k).and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    field: Field,
    value: String,
    equal: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Field {
    Name,
    Namespace,
}

/// A parsed `fieldSelector` (only the metadata fields every resource supports).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    /// `custom`: the resource is a custom resource (its error message differs).
    pub fn parse(text: &str, custom: bool) -> Result<FieldSelector, ApiError> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Ok(FieldSelector(requirements));
        }
        for part in text.split(',') {
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{text}'; can't understand '{part}'")));
            };
            let field = match field.trim() {
                "metadata.name" => Field::Name,
                "metadata.namespace" => Field::Namespace,
                other if custom => return Err(ApiError::bad_request(format!("field label not supported: {other}"))),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "\"{other}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    )));
                }
            };
            requirements.push(FieldRequirement { field, value: value.trim().to_owned(), equal });
        }
        Ok(FieldSelector(requirements))
    }

    /// The single name an `metadata.name=` selector pins, for a direct lookup.
    pub fn exact_name(&self) -> Option<&str> {
        self.0.iter().find(|r| r.field == Field::Name && r.equal).map(|r| r.value.as_str())
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = match r.field {
                Field::Name => meta::name(object),
                Field::Namespace => meta::meta_str(object, "namespace"),
            };
            (actual == r.value) == r.equal
        })
    }
}

/// Both selectors of a list or watch.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "n", "labels": labels}})
    }

    #[test]
    fn label_selectors() {
        let o = obj(json!({"app": "web", "tier": "front", "n": "5"}));
        let cases = [
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (web, db)", true),
            ("app notin (web,db)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("n>4,n<6", true),
            ("tier in (back),app=web", false),
            ("", true),
        ];
        for (text, expected) in cases {
            assert_eq!(LabelSelector::parse(text).expect(text).matches(&o), expected, "{text}");
        }
        assert!(LabelSelector::parse("a in b").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=a,metadata.namespace==n", false).expect("parse").matches(&o));
        assert!(!FieldSelector::parse("metadata.name!=a", false).expect("parse").matches(&o));
        assert!(FieldSelector::parse("spec.x=1", true).is_err());
    }
}
