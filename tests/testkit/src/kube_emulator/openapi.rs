//! `/openapi/v2` with a definition for every served version of every CRD (its
//! `openAPIV3Schema` published as Swagger 2.0 the way kube-apiserver does: tagged
//! with `x-kubernetes-group-version-kind`, free-form where the schema keeps unknown
//! fields, v3-only keywords left out), so `kubectl explain` and kubectl's
//! client-side validation work on custom resources. Built-in kinds have no
//! definitions: kubectl skips validating what the document does not define.
//! `/openapi/v3` is absent, as on v1.20, so kubectl falls back to v2.
//!
//! kubectl asks for gnostic's `openapi.v2.Document` protobuf and parses the answer
//! as protobuf whatever its content type, so that request gets it. The messages
//! below declare the part of gnostic's `OpenAPIv2.proto` that the document uses
//! (same names and field numbers); `prost` encodes them.

use serde_json::{Map, Value, json};

use super::resources::CRD_GROUP;
use super::store::State;

/// The Swagger 2.0 document as JSON.
pub fn v2(state: &State) -> Value {
    let mut definitions = Map::new();
    for crd in state.values(&format!("{CRD_GROUP}/customresourcedefinitions"), None) {
        let group = crd.pointer("/spec/group").and_then(Value::as_str).unwrap_or("");
        let kind = crd.pointer("/spec/names/kind").and_then(Value::as_str).unwrap_or("");
        let versions = crd.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
        for version in versions.iter().filter(|v| v.get("served").and_then(Value::as_bool) == Some(true)) {
            let name = version.get("name").and_then(Value::as_str).unwrap_or("");
            let Some(schema) = version.pointer("/schema/openAPIV3Schema") else { continue };
            let mut published = publish(schema);
            let object = published.as_object_mut().map(std::mem::take).unwrap_or_default();
            let mut definition = object;
            let properties = definition.entry("properties").or_insert_with(|| json!({}));
            if let Some(properties) = properties.as_object_mut() {
                properties.insert("apiVersion".into(), json!({"type": "string", "description": API_VERSION_DOC}));
                properties.insert("kind".into(), json!({"type": "string", "description": KIND_DOC}));
                properties.insert("metadata".into(), json!({"type": "object", "description": METADATA_DOC}));
            }
            definition.insert("type".into(), json!("object"));
            definition.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "kind": kind, "version": name}]),
            );
            definitions.insert(definition_name(group, name, kind), Value::Object(definition));
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.20.2-emulator"},
        "paths": {},
        "definitions": definitions,
    })
}

const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DOC: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// As kube-apiserver names a CRD's definition: the group reversed, version, kind.
fn definition_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// A structural schema node as v2 publishes it: `x-kubernetes-preserve-unknown-fields`
/// and `x-kubernetes-int-or-string` nodes become free-form (no type, no
/// properties), `nullable` and other v3-only keywords are dropped.
fn publish(schema: &Value) -> Value {
    let Some(node) = schema.as_object() else { return json!({}) };
    let free_form = node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        || node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || node.get("x-kubernetes-embedded-resource") == Some(&Value::Bool(true));
    let mut out = Map::new();
    for key in
        ["description", "format", "pattern", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"]
    {
        if let Some(value) = node.get(key) {
            out.insert(key.into(), value.clone());
        }
    }
    if free_form {
        return Value::Object(out);
    }
    for key in ["type", "required", "enum"] {
        if let Some(value) = node.get(key) {
            out.insert(key.into(), value.clone());
        }
    }
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        out.insert(
            "properties".into(),
            Value::Object(properties.iter().map(|(name, child)| (name.clone(), publish(child))).collect()),
        );
    }
    if let Some(items) = node.get("items") {
        out.insert("items".into(), publish(items));
    }
    match node.get("additionalProperties") {
        Some(Value::Object(_)) => {
            out.insert("additionalProperties".into(), publish(&node["additionalProperties"]));
        }
        Some(Value::Bool(allowed)) => {
            out.insert("additionalProperties".into(), json!(allowed));
        }
        _ => {}
    }
    Value::Object(out)
}

/// The same document as gnostic's `openapi.v2.Document` protobuf.
pub fn v2_protobuf(state: &State) -> Vec<u8> {
    use prost::Message as _;
    let document = v2(state);
    let definitions = document
        .get("definitions")
        .and_then(Value::as_object)
        .map(|definitions| {
            definitions
                .iter()
                .map(|(name, schema)| pb::NamedSchema { name: name.clone(), value: Some(pb_schema(schema)) })
                .collect()
        })
        .unwrap_or_default();
    pb::Document {
        swagger: "2.0".into(),
        info: Some(pb::Info { title: "Kubernetes".into(), version: "v1.20.2-emulator".into() }),
        paths: Some(pb::Paths::default()),
        definitions: Some(pb::Definitions { additional_properties: definitions }),
    }
    .encode_to_vec()
}

/// A value as gnostic carries it: YAML text (JSON is YAML).
fn pb_any(value: &Value) -> pb::Any {
    pb::Any { yaml: value.to_string() }
}

fn pb_schema(schema: &Value) -> pb::Schema {
    let text = |key: &str| schema.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
    let number = |key: &str| schema.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    let integer = |key: &str| schema.get(key).and_then(Value::as_i64).unwrap_or(0);
    let properties = schema.get("properties").and_then(Value::as_object).map(|properties| pb::Properties {
        additional_properties: properties
            .iter()
            .map(|(name, child)| pb::NamedSchema { name: name.clone(), value: Some(pb_schema(child)) })
            .collect(),
    });
    let additional_properties = match schema.get("additionalProperties") {
        Some(Value::Bool(allowed)) => {
            Some(pb::AdditionalPropertiesItem { oneof: Some(pb::additional_properties_item::Oneof::Boolean(*allowed)) })
        }
        Some(child @ Value::Object(_)) => Some(pb::AdditionalPropertiesItem {
            oneof: Some(pb::additional_properties_item::Oneof::Schema(Box::new(pb_schema(child)))),
        }),
        _ => None,
    };
    let vendor_extension = schema
        .as_object()
        .map(|node| {
            node.iter()
                .filter(|(key, _)| key.starts_with("x-"))
                .map(|(key, value)| pb::NamedAny { name: key.clone(), value: Some(pb_any(value)) })
                .collect()
        })
        .unwrap_or_default();
    pb::Schema {
        format: text("format"),
        description: text("description"),
        maximum: number("maximum"),
        minimum: number("minimum"),
        max_length: integer("maxLength"),
        min_length: integer("minLength"),
        pattern: text("pattern"),
        max_items: integer("maxItems"),
        min_items: integer("minItems"),
        required: schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default(),
        r#enum: schema
            .get("enum")
            .and_then(Value::as_array)
            .map(|e| e.iter().map(pb_any).collect())
            .unwrap_or_default(),
        additional_properties: additional_properties.map(Box::new),
        r#type: schema.get("type").and_then(Value::as_str).map(|t| pb::TypeItem { value: vec![t.to_owned()] }),
        items: schema.get("items").map(|items| pb::ItemsItem { schema: vec![pb_schema(items)] }),
        properties,
        vendor_extension,
    }
}

/// The messages of gnostic's `openapi/v2/OpenAPIv2.proto` the document uses, with
/// their field numbers (fields the emulator never sets are left out).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Document {
        #[prost(string, tag = "1")]
        pub swagger: String,
        #[prost(message, optional, tag = "2")]
        pub info: Option<Info>,
        #[prost(message, optional, tag = "8")]
        pub paths: Option<Paths>,
        #[prost(message, optional, tag = "9")]
        pub definitions: Option<Definitions>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Info {
        #[prost(string, tag = "1")]
        pub title: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Paths {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Definitions {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedSchema {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "2")]
        pub yaml: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NamedAny {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeItem {
        #[prost(string, repeated, tag = "1")]
        pub value: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ItemsItem {
        #[prost(message, repeated, tag = "1")]
        pub schema: Vec<Schema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Properties {
        #[prost(message, repeated, tag = "1")]
        pub additional_properties: Vec<NamedSchema>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AdditionalPropertiesItem {
        #[prost(oneof = "additional_properties_item::Oneof", tags = "1, 2")]
        pub oneof: Option<additional_properties_item::Oneof>,
    }

    pub mod additional_properties_item {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Oneof {
            #[prost(message, tag = "1")]
            Schema(Box<super::Schema>),
            #[prost(bool, tag = "2")]
            Boolean(bool),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Schema {
        #[prost(string, tag = "2")]
        pub format: String,
        #[prost(string, tag = "4")]
        pub description: String,
        #[prost(double, tag = "7")]
        pub maximum: f64,
        #[prost(double, tag = "9")]
        pub minimum: f64,
        #[prost(int64, tag = "11")]
        pub max_length: i64,
        #[prost(int64, tag = "12")]
        pub min_length: i64,
        #[prost(string, tag = "13")]
        pub pattern: String,
        #[prost(int64, tag = "14")]
        pub max_items: i64,
        #[prost(int64, tag = "15")]
        pub min_items: i64,
        #[prost(string, repeated, tag = "19")]
        pub required: Vec<String>,
        #[prost(message, repeated, tag = "20")]
        pub r#enum: Vec<Any>,
        #[prost(message, optional, boxed, tag = "21")]
        pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
        #[prost(message, optional, tag = "22")]
        pub r#type: Option<TypeItem>,
        #[prost(message, optional, tag = "23")]
        pub items: Option<ItemsItem>,
        #[prost(message, optional, tag = "25")]
        pub properties: Option<Properties>,
        #[prost(message, repeated, tag = "31")]
        pub vendor_extension: Vec<NamedAny>,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_schemas_are_published_as_v2() {
        let schema = json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["source"], "properties": {
                "source": {"type": "object", "nullable": true, "properties": {"path": {"type": "string"}}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}},
                "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}}});
        let published = publish(&schema);
        let spec = &published["properties"]["spec"];
        assert_eq!(spec["required"], json!(["source"]));
        assert!(spec["properties"]["source"].get("nullable").is_none());
        assert_eq!(spec["properties"]["extra"], json!({}), "free-form");
        assert_eq!(spec["properties"]["port"], json!({}), "int-or-string is free-form");
        assert_eq!(spec["properties"]["tags"]["items"]["type"], "string");
        assert_eq!(spec["properties"]["labels"]["additionalProperties"]["type"], "string");
        assert_eq!(
            definition_name("managed-gitops.redhat.com", "v1alpha1", "GitOpsDeployment"),
            "com.redhat.managed-gitops.v1alpha1.GitOpsDeployment"
        );
        let encoded = {
            use prost::Message as _;
            pb_schema(&published).encode_to_vec()
        };
        let decoded = <pb::Schema as prost::Message>::decode(&encoded[..]).expect("decodes");
        assert_eq!(decoded.r#type.map(|t| t.value), Some(vec!["object".to_owned()]));
    }
}
