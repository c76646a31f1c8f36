//! Server-side `Table` output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`),
//! what `kubectl get` asks for so that it can print the server's columns: a CRD's
//! `additionalPrinterColumns` (its JSONPaths evaluated here, `date` columns shown
//! as ages), and for built-in kinds the columns kube-apiserver prints for the kinds
//! the emulator serves. Rows carry the object's metadata
//! (`PartialObjectMetadata`, the default `includeObject=Metadata`), `None` leaves
//! it out and `Object` carries the whole object.
//!
//! Watches keep streaming plain objects, not Table rows.

use std::sync::Arc;

use serde_json::{Value, json};

use super::errors::ApiError;
use super::meta;
use super::resources::{CRD_GROUP, ResourceInfo};
use super::store::State;

/// Whether the request's `Accept` header prefers a `Table`.
pub fn wanted(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| {
        let params: Vec<&str> = first.split(';').map(str::trim).collect();
        params.contains(&"as=Table") && params.iter().any(|p| p.starts_with("g=meta.k8s.io"))
    })
}

/// The table's version as asked (`v1` or `v1beta1`).
fn version(accept: &str) -> &'static str {
    if accept.split(',').next().is_some_and(|first| first.contains("v=v1beta1")) { "v1beta1" } else { "v1" }
}

/// One column: its definition and how to read its cell.
struct Column {
    name: String,
    kind: String,
    format: String,
    description: String,
    priority: i64,
    cell: Cell,
}

enum Cell {
    Name,
    /// A JSONPath of a CRD column.
    Path(String),
    /// A built-in kind's column, computed from the object.
    Builtin(fn(&Value) -> Value),
}

fn column(name: &str, kind: &str, format: &str, description: &str, cell: Cell) -> Column {
    Column {
        name: name.to_owned(),
        kind: kind.to_owned(),
        format: format.to_owned(),
        description: description.to_owned(),
        priority: 0,
        cell,
    }
}

fn name_column() -> Column {
    column(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: http://kubernetes.io/docs/user-guide/identifiers#names",
        Cell::Name,
    )
}

fn age_column() -> Column {
    column(
        "Age",
        "date",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        Cell::Path(".metadata.creationTimestamp".to_owned()),
    )
}

/// The columns of `info`'s objects.
fn columns(state: &State, info: &ResourceInfo) -> Vec<Column> {
    let mut columns = vec![name_column()];
    if let Some(custom) = &info.custom {
        let crd = state.get(&format!("{CRD_GROUP}/customresourcedefinitions"), "", &custom.crd_name);
        let printer = crd.as_ref().and_then(|crd| {
            crd.pointer("/spec/versions")?
                .as_array()?
                .iter()
                .find(|v| v.get("name").and_then(Value::as_str) == Some(info.version.as_str()))?
                .get("additionalPrinterColumns")?
                .as_array()
                .cloned()
        });
        match printer {
            // As the real server: no printer columns means an Age column.
            None => columns.push(age_column()),
            Some(printer) => columns.extend(printer.iter().map(|c| {
                let s = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or("").to_owned();
                Column {
                    name: s("name"),
                    kind: s("type"),
                    format: s("format"),
                    description: s("description"),
                    priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    cell: Cell::Path(s("jsonPath")),
                }
            })),
        }
        return columns;
    }
    let builtin = |name: &str, kind: &str, cell: fn(&Value) -> Value| column(name, kind, "", "", Cell::Builtin(cell));
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "namespaces") => columns.push(builtin("Status", "string", |o| json!(str_at(o, "/status/phase")))),
        ("", "secrets") => {
            columns.push(builtin("Type", "string", |o| json!(str_at(o, "/type"))));
            columns.push(builtin("Data", "string", |o| json!(count(o, "/data"))));
        }
        ("", "configmaps") => {
            columns.push(builtin("Data", "string", |o| json!(count(o, "/data") + count(o, "/binaryData"))))
        }
        ("", "serviceaccounts") => columns.push(builtin("Secrets", "string", |o| json!(count(o, "/secrets")))),
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => {
            columns.push(builtin("Role", "string", |o| {
                json!(format!("{}/{}", str_at(o, "/roleRef/kind"), str_at(o, "/roleRef/name")))
            }));
        }
        _ => {}
    }
    columns.push(age_column());
    columns
}

fn str_at<'a>(object: &'a Value, pointer: &str) -> &'a str {
    object.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn count(object: &Value, pointer: &str) -> usize {
    match object.pointer(pointer) {
        Some(Value::Object(map)) => map.len(),
        Some(Value::Array(items)) => items.len(),
        _ => 0,
    }
}

/// The table of `objects` (one for a GET, the list's items for a LIST).
pub fn render(
    state: &State,
    info: &ResourceInfo,
    objects: &[Arc<Value>],
    list_meta: Value,
    accept: &str,
    include_object: Option<&str>,
) -> Result<Value, ApiError> {
    let include = match include_object.unwrap_or("Metadata") {
        "" | "Metadata" => "Metadata",
        "None" => "None",
        "Object" => "Object",
        other => {
            return Err(ApiError::bad_request(format!(
                "includeObject: Unsupported value: \"{other}\": supported values: \"Metadata\", \"None\", \"Object\""
            )));
        }
    };
    let table_version = version(accept);
    let columns = columns(state, info);
    let now = meta::now_unix();
    let rows: Vec<Value> = objects
        .iter()
        .map(|object| {
            let cells: Vec<Value> = columns
                .iter()
                .map(|column| match &column.cell {
                    Cell::Name => json!(meta::name(object)),
                    Cell::Builtin(cell) => cell(object),
                    Cell::Path(path) => {
                        let value = jsonpath(object, path);
                        if column.kind == "date" { age(&value, now) } else { cell_value(value) }
                    }
                })
                .collect();
            let mut row = json!({"cells": cells});
            match include {
                "Metadata" => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": format!("meta.k8s.io/{table_version}"),
                        "metadata": object.get("metadata").cloned().unwrap_or(Value::Null),
                    });
                }
                "Object" => row["object"] = (**object).clone(),
                _ => {}
            }
            row
        })
        .collect();
    let definitions: Vec<Value> = columns
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.kind, "format": c.format, "description": c.description, "priority": c.priority})
        })
        .collect();
    Ok(json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{table_version}"),
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": rows,
    }))
}

/// A cell of a CRD column: `null` when the path finds nothing, a scalar as is,
/// several matches joined with commas (as kubectl's JSONPath printer does).
fn cell_value(values: Vec<Value>) -> Value {
    match values.len() {
        0 => Value::Null,
        1 => values.into_iter().next().unwrap_or(Value::Null),
        _ => json!(
            values
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

/// A `date` cell: the age of the timestamp, as kubectl shows ages (`5s`, `3m2s`, `4h`, `2d`).
fn age(values: &[Value], now: i64) -> Value {
    let Some(at) = values.first().and_then(Value::as_str).and_then(parse_time) else {
        return json!("<unknown>");
    };
    json!(human_duration(now.saturating_sub(at).max(0)))
}

fn parse_time(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>().ok().map(|at| at.as_second())
}

/// kube's `duration.HumanDuration`, to the resolution kubectl prints.
pub fn human_duration(seconds: i64) -> String {
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86400);
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        let rest = seconds % 60;
        if rest == 0 { format!("{minutes}m") } else { format!("{minutes}m{rest}s") }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        let rest = minutes % 60;
        if rest == 0 { format!("{hours}h") } else { format!("{hours}h{rest}m") }
    } else if hours < 48 {
        format!("{hours}h")
    } else if days < 8 {
        let rest = hours % 24;
        if rest == 0 { format!("{days}d") } else { format!("{days}d{rest}h") }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else {
        format!("{}y", days / 365)
    }
}

/// The values a CRD printer column's JSONPath finds: `.a.b`, `.a[0]`, `.a[*].b` and
/// filters `.a[?(@.k=="v")].b` (the forms CRDs use).
pub fn jsonpath(object: &Value, path: &str) -> Vec<Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}').trim_start_matches('$');
    let mut current = vec![object.clone()];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let key = &after[..end];
            current = current.iter().filter_map(|v| v.get(key).cloned()).collect();
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let Some(end) = closing_bracket(after) else { return Vec::new() };
            let selector = &after[..end];
            rest = &after[end + 1..];
            let items: Vec<Value> = current.iter().filter_map(Value::as_array).flatten().cloned().collect();
            current = if selector == "*" {
                items
            } else if let Ok(index) = selector.parse::<usize>() {
                current.iter().filter_map(|v| v.as_array().and_then(|a| a.get(index)).cloned()).collect()
            } else if let Some(filter) = selector.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let Some((key, wanted)) = filter.split_once("==") else { return Vec::new() };
                let wanted = wanted.trim().trim_matches('"').trim_matches('\'');
                items
                    .into_iter()
                    .filter(|item| {
                        item.get(key.trim())
                            .is_some_and(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned) == wanted)
                    })
                    .collect()
            } else {
                return Vec::new();
            };
        } else {
            return Vec::new();
        }
    }
    current
}

fn closing_bracket(text: &str) -> Option<usize> {
    let mut quoted = None;
    for (index, c) in text.char_indices() {
        match (quoted, c) {
            (None, '"' | '\'') => quoted = Some(c),
            (Some(q), c) if c == q => quoted = None,
            (None, ']') => return Some(index),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpaths_of_printer_columns() {
        let object = json!({"status": {"sync": {"status": "Synced"}, "conditions": [
            {"type": "Reconciling", "status": "False"}, {"type": "Ready", "status": "True"}]}, "spec": {"n": 3}});
        assert_eq!(jsonpath(&object, ".status.sync.status"), vec![json!("Synced")]);
        assert_eq!(jsonpath(&object, ".status.conditions[?(@.type==\"Ready\")].status"), vec![json!("True")]);
        assert_eq!(jsonpath(&object, ".status.conditions[0].type"), vec![json!("Reconciling")]);
        assert_eq!(jsonpath(&object, ".status.conditions[*].status").len(), 2);
        assert_eq!(jsonpath(&object, ".spec.n"), vec![json!(3)]);
        assert!(jsonpath(&object, ".status.health.status").is_empty());
        assert!(jsonpath(&object, ".status.conditions[?(@.type==\"Gone\")].status").is_empty());
    }

    #[test]
    fn ages_as_kubectl_prints_them() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(182), "3m2s");
        assert_eq!(human_duration(60 * 45), "45m");
        assert_eq!(human_duration(3600 * 5 + 60 * 7), "5h7m");
        assert_eq!(human_duration(3600 * 30), "30h");
        assert_eq!(human_duration(86400 * 3), "3d");
    }

    #[test]
    fn only_table_requests_get_tables() {
        assert!(wanted(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        ));
        assert!(!wanted("application/json"));
        assert!(!wanted("application/json, */*"));
        assert_eq!(version("application/json;as=Table;v=v1beta1;g=meta.k8s.io"), "v1beta1");
    }
}
