//! get and list. A list is an ordered range of a table, filtered by selectors,
//! cut into pages by `limit` with an opaque `continue` token (the list's
//! resourceVersion and the last key). Later pages show the list as it was at the
//! first page's resourceVersion: objects changed since then are taken back to
//! their earlier version from the resource's event history.

use std::ops::Bound;
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::errors::ApiError;
use super::resources::ResourceInfo;
use super::selector::Filter;
use super::store::{ObjectKey, State, Table, to_json};
use super::write::present;

/// A page of a list, collected under the lock and assembled after it.
pub struct ListPage {
    pub resource_version: u64,
    /// The JSON of each item.
    pub items: Vec<Bytes>,
    pub continue_token: Option<String>,
    /// `remainingItemCount`, known when the list has no selectors.
    pub remaining: Option<i64>,
}

pub fn get(state: &State, info: &ResourceInfo, namespace: &str, name: &str) -> Result<Arc<Value>, ApiError> {
    state
        .get(&info.storage_key(), namespace, name)
        .map(|object| present(info, &object))
        .ok_or_else(|| ApiError::not_found(info, name))
}

/// An item's JSON as `info`'s version shows it: the stored bytes unless the
/// apiVersion must be rewritten (a CRD version other than the storage one).
fn item_json(info: &ResourceInfo, rewrite: bool, table: &Table, key: &ObjectKey, object: &Arc<Value>) -> Bytes {
    if !rewrite && let Some(json) = table.json_of(key) {
        return json.clone();
    }
    to_json(&present(info, object))
}

/// A continue token: the snapshot's resourceVersion, the last key served, and how
/// many items of the list came before the next page (for `remainingItemCount`).
fn encode_continue(rv: u64, key: &ObjectKey, served: u64) -> String {
    let token = json!({ "v": "meta.k8s.io/v1", "rv": rv, "start": [key.0, key.1], "served": served });
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, ObjectKey, Option<u64>), ApiError> {
    let invalid = || {
        ApiError::new(
            400,
            "BadRequest",
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    let rv = value.get("rv").and_then(Value::as_u64).ok_or_else(invalid)?;
    let start = value.get("start").and_then(Value::as_array).ok_or_else(invalid)?;
    let served = value.get("served").and_then(Value::as_u64);
    match (start.first().and_then(Value::as_str), start.get(1).and_then(Value::as_str)) {
        (Some(ns), Some(name)) => Ok((rv, (ns.to_owned(), name.to_owned()), served)),
        _ => Err(invalid()),
    }
}

pub fn list(
    state: &State,
    info: &ResourceInfo,
    namespace: Option<&str>,
    filter: &Filter,
    limit: Option<usize>,
    continue_token: Option<&str>,
) -> Result<ListPage, ApiError> {
    let (rv, after, served_before) = match continue_token.filter(|t| !t.is_empty()) {
        Some(token) => {
            let (rv, key, served) = decode_continue(token)?;
            (rv, Some(key), served)
        }
        None => (state.current_rv(), None, Some(0)),
    };
    let mut page = ListPage { resource_version: rv, items: Vec::new(), continue_token: None, remaining: None };
    let Some(table) = state.table_ref(&info.storage_key()) else { return Ok(page) };
    let rewrite = info.storage_api_version() != info.api_version();
    // Later pages show the list as it was at the first page's resourceVersion.
    let earlier = if rv < state.current_rv() {
        table.changed_since(rv).map_err(|_| {
            state.count_expired_list();
            ApiError::new(410, "Expired", CONTINUE_EXPIRED)
        })?
    } else {
        Default::default()
    };
    if let (Some(name), None, true) = (filter.fields.exact_name(), &after, earlier.is_empty())
        && let Some(ns) = namespace.or((!info.namespaced).then_some(""))
    {
        let key = (ns.to_owned(), name.to_owned());
        if let Some(object) = table.objects.get(&key)
            && filter.matches(object)
        {
            page.items.push(item_json(info, rewrite, table, &key, object));
        }
        return Ok(page);
    }
    let in_scope =
        |key: &ObjectKey| namespace.is_none_or(|ns| key.0 == ns) && after.as_ref().is_none_or(|start| key > start);
    let mut replaced: Vec<(&ObjectKey, &Option<Arc<Value>>)> = earlier.iter().filter(|(k, _)| in_scope(k)).collect();
    replaced.sort_by(|a, b| a.0.cmp(b.0));
    let mut replaced = replaced.into_iter().peekable();
    // With a `key=value` requirement, only the objects indexed under its pair can
    // match: walk the smallest such set (in key order, as the table) instead of
    // every object. What changed since `rv` comes from `replaced` either way.
    let smallest = filter
        .labels
        .required_pairs()
        .map(|(label, value)| table.labelled(label, value))
        .min_by_key(|keys| keys.map_or(0, |keys| keys.len()));
    type Objects<'a> = Box<dyn Iterator<Item = (&'a ObjectKey, &'a Arc<Value>)> + 'a>;
    let current: Objects<'_> = match smallest {
        None => Box::new(table.range(namespace, after.as_ref())),
        Some(None) => Box::new(std::iter::empty()),
        Some(Some(keys)) => {
            let lower = match (&after, namespace) {
                (Some(key), _) => Bound::Excluded(key.clone()),
                (None, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
                (None, None) => Bound::Unbounded,
            };
            Box::new(
                keys.range((lower, Bound::Unbounded))
                    .take_while(move |key| namespace.is_none_or(|ns| key.0 == ns))
                    .filter_map(|key| table.objects.get_key_value(key)),
            )
        }
    };
    let mut current = current.peekable();
    let limit = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
    let count_rest = filter.labels == Default::default() && filter.fields == Default::default();
    // Without selectors the rest is counted, not walked: the list's size at `rv`
    // less what earlier pages and this one served.
    let total_at_rv = served_before.filter(|_| count_rest).map(|served| {
        let scope = |key: &ObjectKey| namespace.is_none_or(|ns| key.0 == ns);
        let (mut created, mut deleted) = (0u64, 0u64);
        for (key, before) in earlier.iter().filter(|(k, _)| scope(k)) {
            match (before.is_some(), table.objects.contains_key(key)) {
                (false, true) => created += 1,
                (true, false) => deleted += 1,
                _ => {}
            }
        }
        (served, table.count(namespace) as u64 + deleted - created)
    });
    let mut last_key: Option<ObjectKey> = None;
    let mut remaining = 0i64;
    loop {
        // The next key of the snapshot: the smaller of the two sequences.
        let take_replaced = match (current.peek(), replaced.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((ck, _)), Some((rk, _))) => rk <= ck,
        };
        let (key, object, fresh) = if take_replaced {
            let Some((key, earlier)) = replaced.next() else { break };
            if current.peek().is_some_and(|(ck, _)| *ck == key) {
                current.next();
            }
            match earlier {
                Some(object) => (key, object, true),
                None => continue,
            }
        } else {
            let Some((key, object)) = current.next() else { break };
            (key, object, false)
        };
        if !filter.matches(object) {
            continue;
        }
        if page.items.len() == limit {
            remaining += 1;
            if let Some((served, total)) = total_at_rv {
                remaining = remaining.max(total.saturating_sub(served + page.items.len() as u64) as i64);
                break;
            }
            if !count_rest {
                break;
            }
            continue;
        }
        page.items.push(if fresh {
            to_json(&present(info, object))
        } else {
            item_json(info, rewrite, table, key, object)
        });
        last_key = Some(key.clone());
    }
    if remaining > 0 {
        let served = served_before.unwrap_or(0) + page.items.len() as u64;
        page.continue_token = last_key.as_ref().map(|k| encode_continue(rv, k, served));
        page.remaining = count_rest.then_some(remaining);
    }
    Ok(page)
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// The list document, serialized item by item (no copy of the objects).
pub fn render_list(info: &ResourceInfo, page: &ListPage) -> Vec<u8> {
    let mut metadata = json!({ "resourceVersion": page.resource_version.to_string() });
    if let Some(token) = &page.continue_token {
        metadata["continue"] = json!(token);
    }
    if let Some(remaining) = page.remaining {
        metadata["remainingItemCount"] = json!(remaining);
    }
    let mut out = Vec::with_capacity(256 + page.items.iter().map(|i| i.len() + 1).sum::<usize>());
    out.extend_from_slice(b"{\"kind\":");
    out.extend_from_slice(json!(info.list_kind).to_string().as_bytes());
    out.extend_from_slice(b",\"apiVersion\":");
    out.extend_from_slice(json!(info.api_version()).to_string().as_bytes());
    out.extend_from_slice(b",\"metadata\":");
    out.extend_from_slice(metadata.to_string().as_bytes());
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    out
}
