//! Structural schemas of CRD versions (`openAPIV3Schema`): defaulting, pruning of
//! unknown fields and validation with kube-apiserver v1.20's messages.
//!
//! Implemented: `type` (object, array, string, integer, number, boolean),
//! `properties`, `additionalProperties` (schema or bool), `items`, `required`,
//! `enum`, `nullable`, `default`, `x-kubernetes-preserve-unknown-fields` (any
//! level), `x-kubernetes-int-or-string`, `x-kubernetes-embedded-resource`,
//! `minimum`/`maximum`, `minLength`/`maxLength`, `minItems`/`maxItems`, `pattern`
//! (the `regex` crate, whose syntax agrees with Go's RE2 on what CRDs use). Not
//! implemented: `format`, `oneOf`/`anyOf`/`allOf`/`not` (accepted and
//! ignored), CEL rules (not in v1.20 either). `metadata` is never pruned at the
//! root or in embedded resources; array item errors carry the array's path
//! without an index, as v1.20 reports them.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::errors::Cause;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Structural {
    pub type_: Option<String>,
    pub properties: BTreeMap<String, Structural>,
    /// `Some(None)`: `additionalProperties: true`; `Some(Some(s))`: a schema.
    pub additional: Option<Option<Box<Structural>>>,
    pub items: Option<Box<Structural>>,
    pub required: Vec<String>,
    pub enum_values: Vec<Value>,
    pub nullable: bool,
    pub default: Option<Value>,
    pub preserve_unknown: bool,
    pub int_or_string: bool,
    pub embedded: bool,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub pattern: Option<Pattern>,
}

/// A `pattern`, compiled once when the schema is read (a CRD's patterns are checked
/// on every write of its objects). One that does not compile refuses nothing (the
/// real server refuses such a CRD when it is created).
#[derive(Debug, Clone)]
pub struct Pattern {
    pub source: String,
    compiled: Option<regex::Regex>,
}

impl Pattern {
    pub fn new(source: &str) -> Pattern {
        Pattern { source: source.to_owned(), compiled: regex::Regex::new(source).ok() }
    }

    /// Whether `value` is refused: it does not match a pattern that compiled.
    pub fn refuses(&self, value: &str) -> bool {
        self.compiled.as_ref().is_some_and(|re| !re.is_match(value))
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Pattern) -> bool {
        self.source == other.source
    }
}

impl Structural {
    pub fn from_json(schema: &Value) -> Structural {
        let get_bool = |key: &str| schema.get(key).and_then(Value::as_bool).unwrap_or(false);
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| props.iter().map(|(k, v)| (k.clone(), Structural::from_json(v))).collect())
            .unwrap_or_default();
        let additional = match schema.get("additionalProperties") {
            Some(Value::Bool(true)) => Some(None),
            Some(v @ Value::Object(_)) => Some(Some(Box::new(Structural::from_json(v)))),
            _ => None,
        };
        Structural {
            type_: schema.get("type").and_then(Value::as_str).map(str::to_owned),
            properties,
            additional,
            items: schema.get("items").filter(|v| v.is_object()).map(|v| Box::new(Structural::from_json(v))),
            required: schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
                .unwrap_or_default(),
            enum_values: schema.get("enum").and_then(Value::as_array).cloned().unwrap_or_default(),
            nullable: get_bool("nullable"),
            default: schema.get("default").cloned(),
            preserve_unknown: get_bool("x-kubernetes-preserve-unknown-fields"),
            int_or_string: get_bool("x-kubernetes-int-or-string"),
            embedded: get_bool("x-kubernetes-embedded-resource"),
            minimum: schema.get("minimum").and_then(Value::as_f64),
            maximum: schema.get("maximum").and_then(Value::as_f64),
            min_length: schema.get("minLength").and_then(Value::as_u64),
            max_length: schema.get("maxLength").and_then(Value::as_u64),
            min_items: schema.get("minItems").and_then(Value::as_u64),
            max_items: schema.get("maxItems").and_then(Value::as_u64),
            pattern: schema.get("pattern").and_then(Value::as_str).map(Pattern::new),
        }
    }

    /// Fills absent object fields that declare a `default`.
    pub fn apply_defaults(&self, value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, schema) in &self.properties {
                    if !map.contains_key(key)
                        && let Some(default) = &schema.default
                    {
                        map.insert(key.clone(), default.clone());
                    }
                    if let Some(child) = map.get_mut(key) {
                        schema.apply_defaults(child);
                    }
                }
                if let Some(Some(schema)) = &self.additional {
                    for child in map.values_mut() {
                        schema.apply_defaults(child);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(schema) = &self.items {
                    for item in items {
                        schema.apply_defaults(item);
                    }
                }
            }
            _ => {}
        }
    }

    /// Removes fields the schema does not know. `root` keeps apiVersion, kind and metadata.
    pub fn prune(&self, value: &mut Value, root: bool) {
        match value {
            Value::Object(map) => {
                let keep_meta = root || self.embedded;
                if !self.preserve_unknown && self.additional.is_none() {
                    map.retain(|key, _| {
                        self.properties.contains_key(key)
                            || (keep_meta && matches!(key.as_str(), "apiVersion" | "kind" | "metadata"))
                    });
                }
                for (key, child) in map.iter_mut() {
                    if keep_meta && key == "metadata" {
                        continue;
                    }
                    if let Some(schema) = self.properties.get(key) {
                        schema.prune(child, false);
                    } else if let Some(Some(schema)) = &self.additional {
                        schema.prune(child, false);
                    }
                }
            }
            Value::Array(items) => {
                if let Some(schema) = &self.items {
                    for item in items {
                        schema.prune(item, false);
                    }
                }
            }
            _ => {}
        }
    }

    /// Validates `value` at the root of an object; causes come back ordered as
    /// the real server lists them (type errors, then required, then the rest).
    pub fn validate_root(&self, value: &Value) -> Vec<Cause> {
        let mut found = Found::default();
        if let Value::Object(map) = value {
            self.validate_object(map, "", true, &mut found);
        }
        let mut causes = found.types;
        causes.extend(found.required);
        causes.extend(found.other);
        causes
    }

    fn validate(&self, value: &Value, path: &str, found: &mut Found) {
        if value.is_null() {
            if !self.nullable && (self.type_.is_some() || self.int_or_string) {
                let expected = self.type_.as_deref().unwrap_or("string");
                found.types.push(type_error(path, expected, "null"));
            }
            return;
        }
        let actual = json_type(value);
        if self.int_or_string {
            if !matches!(actual, "integer" | "string") {
                found.types.push(type_error(path, "integer or string", actual));
                return;
            }
        } else if let Some(expected) = self.type_.as_deref() {
            let ok = actual == expected || (expected == "number" && actual == "integer");
            if !ok {
                found.types.push(type_error(path, expected, actual));
                return;
            }
        }
        if !self.enum_values.is_empty() && !self.enum_values.contains(value) {
            let supported: Vec<String> = self.enum_values.iter().map(quote_value).collect();
            found.other.push(Cause::new(
                "FieldValueNotSupported",
                path,
                format!("Unsupported value: {}: supported values: {}", quote_value(value), supported.join(", ")),
            ));
        }
        self.validate_bounds(value, path, found);
        match value {
            Value::Object(map) => self.validate_object(map, path, false, found),
            Value::Array(items) => {
                if let Some(schema) = &self.items {
                    for item in items {
                        schema.validate(item, path, found);
                    }
                }
            }
            _ => {}
        }
    }

    fn validate_bounds(&self, value: &Value, path: &str, found: &mut Found) {
        let mut invalid = |message: String| {
            found.other.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!("Invalid value: {}: {message}", quote_value(value)),
            ));
        };
        if let Some(n) = value.as_f64() {
            if let Some(min) = self.minimum.filter(|min| n < *min) {
                invalid(format!("{path} in body should be greater than or equal to {min}"));
            }
            if let Some(max) = self.maximum.filter(|max| n > *max) {
                invalid(format!("{path} in body should be less than or equal to {max}"));
            }
        }
        if let Some(s) = value.as_str() {
            let len = s.chars().count() as u64;
            if let Some(min) = self.min_length.filter(|min| len < *min) {
                invalid(format!("{path} in body should be at least {min} chars long"));
            }
            if let Some(max) = self.max_length.filter(|max| len > *max) {
                invalid(format!("{path} in body may not be longer than {max}"));
            }
            if let Some(pattern) = self.pattern.as_ref().filter(|pattern| pattern.refuses(s)) {
                invalid(format!("{path} in body should match '{}'", pattern.source));
            }
        }
        if let Some(items) = value.as_array() {
            let len = items.len() as u64;
            if let Some(min) = self.min_items.filter(|min| len < *min) {
                invalid(format!("{path} in body should have at least {min} items"));
            }
            if let Some(max) = self.max_items.filter(|max| len > *max) {
                invalid(format!("{path} in body should have at most {max} items"));
            }
        }
    }

    fn validate_object(&self, map: &Map<String, Value>, path: &str, root: bool, found: &mut Found) {
        let child_path = |key: &str| if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
        for key in &self.required {
            if !map.contains_key(key) {
                found.required.push(Cause::new("FieldValueRequired", child_path(key), "Required value"));
            }
        }
        for (key, child) in map {
            if (root || self.embedded) && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(schema) = self.properties.get(key) {
                schema.validate(child, &child_path(key), found);
            } else if let Some(Some(schema)) = &self.additional {
                schema.validate(child, &child_path(key), found);
            }
        }
    }
}

#[derive(Default)]
struct Found {
    types: Vec<Cause>,
    required: Vec<Cause>,
    other: Vec<Cause>,
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_error(path: &str, expected: &str, actual: &str) -> Cause {
    Cause::new(
        "FieldValueInvalid",
        path,
        format!("Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""),
    )
}

fn quote_value(value: &Value) -> String {
    match value {
        Value::String(s) => format!("\"{s}\""),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn widget_schema() -> Structural {
        Structural::from_json(&json!({
            "type": "object",
            "properties": {
                "spec": {"type": "object", "required": ["size"], "properties": {
                    "size": {"type": "integer"},
                    "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "ratio": {"type": "number"}
                }},
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
            }
        }))
    }

    #[test]
    fn prunes_unknown_fields_but_keeps_metadata_and_preserved_subtrees() {
        let schema = widget_schema();
        let mut object = json!({
            "apiVersion": "x/v1", "kind": "W", "metadata": {"name": "w", "whatever": 1},
            "spec": {"size": 1, "junk": 2, "free": {"any": {"x": 1}}, "labels": {"a": "b"}},
            "extra": true
        });
        schema.prune(&mut object, true);
        schema.apply_defaults(&mut object);
        assert_eq!(
            object,
            json!({
                "apiVersion": "x/v1", "kind": "W", "metadata": {"name": "w", "whatever": 1},
                "spec": {"size": 1, "color": "red", "free": {"any": {"x": 1}}, "labels": {"a": "b"}}
            })
        );
    }

    #[test]
    fn reports_type_required_and_enum_errors_like_the_real_server() {
        let schema = widget_schema();
        let object = json!({"spec": {"size": "string", "color": "green", "tags": [1], "ratio": 2, "labels": {"a": 1}}});
        let causes = schema.validate_root(&object);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.labels.a", "spec.size", "spec.tags", "spec.color"]);
        assert_eq!(
            causes[1].message,
            "Invalid value: \"string\": spec.size in body must be of type integer: \"string\""
        );
        assert_eq!(causes[3].message, "Unsupported value: \"green\": supported values: \"red\", \"blue\"");
        let missing = schema.validate_root(&json!({"spec": {}}));
        assert_eq!(missing, vec![Cause::new("FieldValueRequired", "spec.size", "Required value")]);
    }
}

#[cfg(test)]
mod pattern_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_string_that_does_not_match_its_pattern_is_refused_as_the_real_server_words_it() {
        let schema = Structural::from_json(&json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "name": {"type": "string", "pattern": "^[a-z]+$"},
            }}},
        }));
        assert!(schema.validate_root(&json!({"spec": {"name": "abc"}})).is_empty());
        let causes = schema.validate_root(&json!({"spec": {"name": "Abc"}}));
        assert_eq!(
            causes,
            vec![Cause::new(
                "FieldValueInvalid",
                "spec.name",
                "Invalid value: \"Abc\": spec.name in body should match '^[a-z]+$'"
            )]
        );
    }
}
