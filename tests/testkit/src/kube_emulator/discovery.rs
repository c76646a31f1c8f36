//! Discovery in the legacy (pre-aggregated) format kube-apiserver v1.20 serves:
//! `/version`, `/api` (APIVersions), `/apis` (APIGroupList), `/apis/{group}`
//! (APIGroup), `/api/v1` and `/apis/{group}/{version}` (APIResourceList with
//! verbs, shortNames, categories and subresources). Clients that ask for
//! aggregated discovery get these documents with `Content-Type:
//! application/json` and fall back, as they do against a v1.20 server.

use serde_json::{Value, json};

use super::resources::{Registry, ResourceInfo};

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "20",
        "gitVersion": "v1.20.2-emulator",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2021-01-13T13:20:00Z",
        "goVersion": "go1.15.5",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_address }]
    })
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let list: Vec<Value> =
        versions.iter().map(|v| json!({ "groupVersion": format!("{group}/{v}"), "version": v })).collect();
    let preferred = list.first().cloned().unwrap_or(Value::Null);
    json!({ "name": group, "versions": list, "preferredVersion": preferred })
}

pub fn api_group_list(registry: &Registry) -> Value {
    let groups: Vec<Value> = registry
        .groups()
        .iter()
        .filter(|(group, _)| !group.is_empty())
        .map(|(group, versions)| group_entry(group, versions))
        .collect();
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups })
}

pub fn api_group(registry: &Registry, group: &str) -> Option<Value> {
    let (name, versions) = registry.groups().into_iter().find(|(g, _)| g == group && !g.is_empty())?;
    let mut entry = group_entry(&name, &versions);
    entry["kind"] = json!("APIGroup");
    entry["apiVersion"] = json!("v1");
    Some(entry)
}

fn resource_entries(info: &ResourceInfo) -> Vec<Value> {
    let verbs: Vec<&str> = if info.is_custom() {
        vec!["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
    } else {
        info.verbs()
    };
    let mut main = json!({
        "name": info.plural,
        "singularName": info.singular,
        "namespaced": info.namespaced,
        "kind": info.kind,
        "verbs": verbs,
    });
    if !info.short_names.is_empty() {
        main["shortNames"] = json!(info.short_names);
    }
    if !info.categories.is_empty() {
        main["categories"] = json!(info.categories);
    }
    let mut entries = vec![main];
    for extra in &info.extra_subresources {
        let mut entry = json!({
            "name": format!("{}/{}", info.plural, extra.name),
            "singularName": "",
            "namespaced": info.namespaced,
            "kind": extra.kind,
            "verbs": extra.verbs,
        });
        if let (Some(group), Some(version)) = (extra.group, extra.version) {
            entry["group"] = json!(group);
            entry["version"] = json!(version);
        }
        entries.push(entry);
    }
    if info.status_subresource {
        entries.push(json!({
            "name": format!("{}/status", info.plural),
            "singularName": "",
            "namespaced": info.namespaced,
            "kind": info.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    entries
}

pub fn api_resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    if !registry.serves(group, version) {
        return None;
    }
    let mut resources: Vec<Value> =
        registry.resources_of(group, version).iter().flat_map(|info| resource_entries(info)).collect();
    resources.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    let group_version = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    let mut list = json!({ "kind": "APIResourceList", "groupVersion": group_version, "resources": resources });
    if !group.is_empty() {
        list["apiVersion"] = json!("v1");
    }
    Some(list)
}
