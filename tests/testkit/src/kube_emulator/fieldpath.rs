//! Field paths, field sets and the `metadata.managedFields` record, as Kubernetes'
//! structured-merge-diff models them: the vocabulary of server-side apply. A path is a
//! list of elements (`.spec`, a list item `[name="c"]`, a set value `[="x"]`, an index);
//! a set is a tree of paths and reads and writes the `fieldsV1` form
//! (`{"f:spec":{"f:replicas":{}}}`, `"."` marking a path that is itself a member); an
//! entry says which manager owns a set, by which operation, when.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::{Map, Value, json};

/// One step of a field path. The derived order (fields, then keys, then values, then
/// indices) is the order structured-merge-diff iterates and serialises in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// A map key or struct field: `f:name`.
    Field(String),
    /// An item of a list of maps, by its key fields: `k:{"name":"c"}`. Holds the
    /// canonical JSON object (keys sorted).
    Key(String),
    /// An item of a set-like list of scalars: `v:"x"`. Holds the JSON of the value.
    Value(String),
    /// An item of a list known only by position: `i:0`.
    Index(usize),
}

/// `fieldsV1` that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("invalid fieldsV1 at {at:?}: {problem}")]
pub struct FieldsError {
    pub at: String,
    pub problem: &'static str,
}

impl PathElement {
    /// The key element of a list item from its key fields (in any order).
    pub fn key(fields: &[(&str, &Value)]) -> PathElement {
        let mut fields: Vec<_> = fields.to_vec();
        fields.sort_by(|a, b| a.0.cmp(b.0));
        let mut text = String::from("{");
        for (i, (name, value)) in fields.iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            text.push_str(&Value::String((*name).to_owned()).to_string());
            text.push(':');
            text.push_str(&value.to_string());
        }
        text.push('}');
        PathElement::Key(text)
    }

    /// The value element of a set item.
    pub fn value(value: &Value) -> PathElement {
        PathElement::Value(value.to_string())
    }

    /// The `fieldsV1` key: `f:name`, `k:{..}`, `v:..`, `i:N`.
    pub fn to_fields_key(&self) -> String {
        match self {
            PathElement::Field(name) => format!("f:{name}"),
            PathElement::Key(json) => format!("k:{json}"),
            PathElement::Value(json) => format!("v:{json}"),
            PathElement::Index(index) => format!("i:{index}"),
        }
    }

    /// Parses a `fieldsV1` key.
    pub fn from_fields_key(key: &str) -> Result<PathElement, FieldsError> {
        let bad = |problem| FieldsError { at: key.to_owned(), problem };
        let (kind, rest) = key.split_at_checked(2).ok_or_else(|| bad("too short"))?;
        match kind {
            "f:" => Ok(PathElement::Field(rest.to_owned())),
            "k:" => match serde_json::from_str::<Value>(rest) {
                Ok(Value::Object(map)) => {
                    let fields: Vec<(&str, &Value)> = map.iter().map(|(k, v)| (k.as_str(), v)).collect();
                    Ok(PathElement::key(&fields))
                }
                _ => Err(bad("a k: element must hold a JSON object")),
            },
            "v:" => serde_json::from_str::<Value>(rest)
                .map(|v| PathElement::value(&v))
                .map_err(|_| bad("a v: element must hold JSON")),
            "i:" => rest.parse().map(PathElement::Index).map_err(|_| bad("an i: element must hold an index")),
            _ => Err(bad("unknown element kind")),
        }
    }

    /// The element as structured-merge-diff prints it in conflict messages:
    /// `.name`, `[name="c"]`, `[="x"]`, `[0]`.
    pub fn display(&self) -> String {
        match self {
            PathElement::Field(name) => format!(".{name}"),
            PathElement::Key(json) => {
                let mut out = String::from("[");
                if let Ok(Value::Object(map)) = serde_json::from_str::<Value>(json) {
                    for (i, (name, value)) in map.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{name}={value}");
                    }
                }
                out.push(']');
                out
            }
            PathElement::Value(json) => format!("[={json}]"),
            PathElement::Index(index) => format!("[{index}]"),
        }
    }
}

/// A path printed the way Kubernetes prints it: `.spec.containers[name="c"].image`.
pub fn display_path(path: &[PathElement]) -> String {
    path.iter().map(PathElement::display).collect()
}

/// A set of field paths, stored as a tree like structured-merge-diff's `fieldpath.Set`:
/// `members` are the paths that end here, `children` the paths that go on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSet {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    pub fn new() -> FieldSet {
        FieldSet::default()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// Adds `path` (non-empty) as a member.
    pub fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                self.members.insert(last.clone());
            }
            [first, rest @ ..] => self.children.entry(first.clone()).or_default().insert(rest),
        }
    }

    /// Whether `path` itself is a member.
    #[cfg(test)]
    pub fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|child| child.has(rest)),
        }
    }

    /// Whether `element` (one step below this node) is a member.
    pub fn has_member(&self, element: &PathElement) -> bool {
        self.members.contains(element)
    }

    /// The paths below `element` (relative to it), if any.
    pub fn child(&self, element: &PathElement) -> Option<&FieldSet> {
        self.children.get(element)
    }

    /// Whether `element` is a member or has members below it.
    pub fn touches(&self, element: &PathElement) -> bool {
        self.members.contains(element) || self.children.contains_key(element)
    }

    /// Every element that is a member or leads to members, in order.
    pub fn elements(&self) -> BTreeSet<&PathElement> {
        self.members.iter().chain(self.children.keys()).collect()
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.members.extend(other.members.iter().cloned());
        for (element, child) in &other.children {
            let merged = match out.children.get(element) {
                Some(mine) => mine.union(child),
                None => child.clone(),
            };
            out.children.insert(element.clone(), merged);
        }
        out
    }

    /// The members of `self` that are not members of `other` (path by path: a member
    /// of `other` does not remove the paths below it).
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.difference(&other.members).cloned().collect();
        for (element, child) in &self.children {
            let rest = match other.children.get(element) {
                Some(theirs) => child.difference(theirs),
                None => child.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(element.clone(), rest);
            }
        }
        out
    }

    /// The members of `self` that are neither members of `other` nor below one.
    pub fn recursive_difference(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.difference(&other.members).cloned().collect();
        for (element, child) in &self.children {
            if other.members.contains(element) {
                continue;
            }
            let rest = match other.children.get(element) {
                Some(theirs) => child.recursive_difference(theirs),
                None => child.clone(),
            };
            if !rest.is_empty() {
                out.children.insert(element.clone(), rest);
            }
        }
        out
    }

    /// The paths below `path`, relative to it.
    pub fn subtree(&self, path: &[PathElement]) -> FieldSet {
        match path {
            [] => self.clone(),
            [first, rest @ ..] => self.children.get(first).map(|child| child.subtree(rest)).unwrap_or_default(),
        }
    }

    /// Adds the paths of `below` under `path`.
    pub fn graft(&mut self, path: &[PathElement], below: FieldSet) {
        match path {
            [] => *self = self.union(&below),
            [first, rest @ ..] => {
                self.children.entry(first.clone()).or_default().graft(rest, below);
                if self.children.get(first).is_some_and(FieldSet::is_empty) {
                    self.children.remove(first);
                }
            }
        }
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let mut out = FieldSet::new();
        out.members = self.members.intersection(&other.members).cloned().collect();
        for (element, child) in &self.children {
            if let Some(theirs) = other.children.get(element) {
                let both = child.intersection(theirs);
                if !both.is_empty() {
                    out.children.insert(element.clone(), both);
                }
            }
        }
        out
    }

    /// Every member path, in structured-merge-diff's iteration order.
    pub fn paths(&self) -> Vec<Vec<PathElement>> {
        let mut out = Vec::new();
        self.collect_paths(&mut Vec::new(), &mut out);
        out
    }

    fn collect_paths(&self, prefix: &mut Vec<PathElement>, out: &mut Vec<Vec<PathElement>>) {
        for element in self.elements() {
            prefix.push(element.clone());
            if self.members.contains(element) {
                out.push(prefix.clone());
            }
            if let Some(child) = self.children.get(element) {
                child.collect_paths(prefix, out);
            }
            prefix.pop();
        }
    }

    /// The `fieldsV1` JSON form.
    pub fn to_fields_v1(&self) -> Value {
        let mut map = Map::new();
        for element in self.elements() {
            let value = match self.children.get(element) {
                Some(child) => {
                    let mut inner = child.to_fields_v1();
                    if self.members.contains(element)
                        && let Value::Object(inner) = &mut inner
                    {
                        inner.insert(".".to_owned(), Value::Object(Map::new()));
                    }
                    inner
                }
                None => Value::Object(Map::new()),
            };
            map.insert(element.to_fields_key(), value);
        }
        Value::Object(map)
    }

    /// Reads the `fieldsV1` JSON form.
    pub fn from_fields_v1(value: &Value) -> Result<FieldSet, FieldsError> {
        let Value::Object(map) = value else {
            return Err(FieldsError { at: String::new(), problem: "fieldsV1 must be an object" });
        };
        let mut set = FieldSet::new();
        for (key, inner) in map {
            if key == "." {
                continue;
            }
            let element = PathElement::from_fields_key(key)?;
            let Value::Object(inner_map) = inner else {
                return Err(FieldsError { at: key.clone(), problem: "every entry must be an object" });
            };
            if inner_map.is_empty() || inner_map.contains_key(".") {
                set.members.insert(element.clone());
            }
            let child = FieldSet::from_fields_v1(inner)?;
            if !child.is_empty() {
                set.children.insert(element, child);
            }
        }
        Ok(set)
    }
}

/// `"Apply"` or `"Update"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One entry of `metadata.managedFields`.
#[derive(Clone, Debug)]
pub struct ManagedEntry {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub time: Option<String>,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

impl ManagedEntry {
    /// Whether this entry is the one `manager` writes with `operation` (and, for updates,
    /// `api_version`) through `subresource` — kube-apiserver's manager identity.
    pub fn is(&self, manager: &str, operation: Operation, api_version: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
            && (operation == Operation::Apply || self.api_version == api_version)
    }

    fn from_json(value: &Value) -> Option<ManagedEntry> {
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        let operation = match value.get("operation").and_then(Value::as_str)? {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return None,
        };
        let fields = match value.get("fieldsV1") {
            Some(fields) => FieldSet::from_fields_v1(fields).ok()?,
            None => FieldSet::new(),
        };
        Some(ManagedEntry {
            manager: text("manager").unwrap_or_default(),
            operation,
            api_version: text("apiVersion").unwrap_or_default(),
            time: text("time"),
            subresource: text("subresource").filter(|s| !s.is_empty()),
            fields,
        })
    }

    fn to_json(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager,
            "operation": self.operation.as_str(),
            "apiVersion": self.api_version,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_fields_v1(),
        });
        if let Some(time) = &self.time {
            entry["time"] = Value::String(time.clone());
        }
        if let Some(subresource) = &self.subresource {
            entry["subresource"] = Value::String(subresource.clone());
        }
        entry
    }

    /// kube-apiserver's order: Apply before Update, then by time, manager, version,
    /// subresource.
    fn order(&self, other: &ManagedEntry) -> Ordering {
        self.operation
            .cmp(&other.operation)
            .then_with(|| self.time.cmp(&other.time))
            .then_with(|| self.manager.cmp(&other.manager))
            .then_with(|| self.api_version.cmp(&other.api_version))
            .then_with(|| self.subresource.cmp(&other.subresource))
    }

    /// How conflict messages name this manager: `"m"`, `"m" using v1` for updaters,
    /// `… with subresource "status"`.
    pub fn printed(&self) -> String {
        let mut out = format!("{:?}", self.manager);
        if let Some(subresource) = &self.subresource {
            out.push_str(&format!(" with subresource {subresource:?}"));
        }
        if self.operation == Operation::Update {
            out.push_str(&format!(" using {}", self.api_version));
        }
        out
    }
}

/// How the entries of an object came to be read.
pub enum Recorded {
    /// `metadata.managedFields` absent or null.
    Absent,
    /// `[]` or `[{}]`: the client asks for the record to be reset.
    Reset,
    /// Entries (the ones that could not be read are left out).
    Entries(Vec<ManagedEntry>),
}

/// Reads `metadata.managedFields` of `object`.
pub fn read_entries(object: &Value) -> Recorded {
    match object.pointer("/metadata/managedFields") {
        None | Some(Value::Null) => Recorded::Absent,
        Some(Value::Array(items)) if items.is_empty() => Recorded::Reset,
        Some(Value::Array(items)) if items.len() == 1 && items[0].as_object().is_some_and(Map::is_empty) => {
            Recorded::Reset
        }
        Some(Value::Array(items)) => Recorded::Entries(items.iter().filter_map(ManagedEntry::from_json).collect()),
        Some(_) => Recorded::Absent,
    }
}

/// The entries of `object`, empty when it has none.
pub fn entries_of(object: &Value) -> Vec<ManagedEntry> {
    match read_entries(object) {
        Recorded::Entries(entries) => entries,
        Recorded::Absent | Recorded::Reset => Vec::new(),
    }
}

/// Writes `entries` (sorted, empty ones dropped) into `object.metadata.managedFields`,
/// removing the field when none is left.
pub fn write_entries(object: &mut Value, mut entries: Vec<ManagedEntry>) {
    entries.retain(|entry| !entry.fields.is_empty());
    entries.sort_by(ManagedEntry::order);
    let Some(root) = object.as_object_mut() else { return };
    let metadata = root.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else { return };
    if entries.is_empty() {
        metadata.remove("managedFields");
    } else {
        metadata.insert("managedFields".to_owned(), Value::Array(entries.iter().map(ManagedEntry::to_json).collect()));
    }
}

/// `object` without `metadata.managedFields`.
pub fn without_managed_fields(object: &Value) -> Value {
    let mut copy = object.clone();
    if let Some(metadata) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.remove("managedFields");
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> PathElement {
        PathElement::Field(name.to_owned())
    }

    #[test]
    fn fields_v1_round_trips_with_dot_for_members_that_have_children() {
        let text = json!({
            "f:data": {".": {}, "f:x": {}},
            "f:metadata": {"f:finalizers": {".": {}, "v:\"x.io/f\"": {}}, "f:labels": {"f:a": {}}},
            "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}}}}
        });
        let set = FieldSet::from_fields_v1(&text).unwrap();
        assert!(set.has(&[f("data")]));
        assert!(set.has(&[f("data"), f("x")]));
        assert!(!set.has(&[f("metadata")]));
        assert!(!set.has(&[f("metadata"), f("labels")]));
        assert!(set.has(&[f("metadata"), f("labels"), f("a")]));
        assert!(set.has(&[f("metadata"), f("finalizers"), PathElement::value(&json!("x.io/f"))]));
        let key = PathElement::key(&[("name", &json!("c"))]);
        assert!(set.has(&[f("spec"), f("containers"), key.clone()]));
        assert!(set.has(&[f("spec"), f("containers"), key, f("image")]));
        assert_eq!(set.to_fields_v1(), text);
    }

    #[test]
    fn keys_are_canonical_and_printed_like_kubernetes() {
        let a = PathElement::from_fields_key("k:{\"protocol\":\"TCP\",\"containerPort\":80}").unwrap();
        let b = PathElement::key(&[("containerPort", &json!(80)), ("protocol", &json!("TCP"))]);
        assert_eq!(a, b);
        assert_eq!(b.to_fields_key(), "k:{\"containerPort\":80,\"protocol\":\"TCP\"}");
        let path = [f("spec"), f("containers"), PathElement::key(&[("name", &json!("c"))]), f("image")];
        assert_eq!(display_path(&path), ".spec.containers[name=\"c\"].image");
        assert_eq!(
            display_path(&[f("metadata"), f("finalizers"), PathElement::value(&json!("a"))]),
            ".metadata.finalizers[=\"a\"]"
        );
        assert!(PathElement::from_fields_key("x:1").is_err());
        assert!(FieldSet::from_fields_v1(&json!({"f:a": 1})).is_err());
    }

    #[test]
    fn set_algebra_is_path_by_path() {
        let mut a = FieldSet::new();
        a.insert(&[f("data")]);
        a.insert(&[f("data"), f("x")]);
        a.insert(&[f("data"), f("y")]);
        let mut b = FieldSet::new();
        b.insert(&[f("data"), f("x")]);
        let diff = a.difference(&b);
        assert!(diff.has(&[f("data")]) && diff.has(&[f("data"), f("y")]) && !diff.has(&[f("data"), f("x")]));
        let both = a.intersection(&b);
        assert_eq!(both.paths(), vec![vec![f("data"), f("x")]]);
        let mut only_parent = FieldSet::new();
        only_parent.insert(&[f("data")]);
        // Removing a parent member leaves the paths below it.
        assert_eq!(a.difference(&only_parent).paths().len(), 2);
        assert_eq!(b.union(&only_parent).paths(), vec![vec![f("data")], vec![f("data"), f("x")]]);
        assert!(a.difference(&a).is_empty());
        // A recursive difference also drops what is below a removed member.
        assert!(a.recursive_difference(&only_parent).is_empty());
        assert_eq!(a.recursive_difference(&b).paths(), vec![vec![f("data")], vec![f("data"), f("y")]]);
        assert_eq!(a.subtree(&[f("data")]).paths(), vec![vec![f("x")], vec![f("y")]]);
        let mut grafted = FieldSet::new();
        grafted.graft(&[f("spec"), f("data")], a.subtree(&[f("data")]));
        assert_eq!(grafted.paths(), vec![vec![f("spec"), f("data"), f("x")], vec![f("spec"), f("data"), f("y")]]);
        grafted.graft(&[f("other")], FieldSet::new());
        assert_eq!(grafted.paths().len(), 2);
    }

    #[test]
    fn entries_round_trip_sorted_apply_first() {
        let object = json!({"metadata": {"managedFields": [
            {"manager": "u", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}},
            {"manager": "a", "operation": "Apply", "apiVersion": "v1", "time": "2024-01-02T00:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:y": {}}}, "subresource": "status"}
        ]}});
        let entries = entries_of(&object);
        assert_eq!(entries.len(), 2);
        assert!(entries[1].is("a", Operation::Apply, "v2", Some("status")));
        assert!(!entries[0].is("u", Operation::Update, "v2", None));
        assert_eq!(entries[0].printed(), "\"u\" using v1");
        assert_eq!(entries[1].printed(), "\"a\" with subresource \"status\"");
        let mut out = json!({"metadata": {}});
        write_entries(&mut out, entries);
        assert_eq!(out["metadata"]["managedFields"][0]["manager"], "a");
        assert_eq!(out["metadata"]["managedFields"][1]["fieldsV1"], json!({"f:data": {"f:x": {}}}));
        write_entries(&mut out, Vec::new());
        assert!(out["metadata"].get("managedFields").is_none());
        assert!(matches!(read_entries(&json!({"metadata": {"managedFields": [{}]}})), Recorded::Reset));
        assert!(matches!(read_entries(&json!({"metadata": {}})), Recorded::Absent));
    }
}
