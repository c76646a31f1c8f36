//! The structural half of server-side apply, walking objects the way structured-merge-diff
//! does: which lists merge by key (the emulator has no per-kind schema, so the rules below
//! stand in for one), the field set of an object, the comparison of two versions, the
//! reconciling of recorded sets, the merge of an applied configuration and the pruning of
//! fields a manager gave up. `apply.rs` builds the apply and update operations on top.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::fieldpath::{FieldSet, PathElement};

/// How a list's items are identified, as structured-merge-diff's list types say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced as a whole, owned as one field (`listType: atomic`, the default).
    Atomic,
    /// A set of scalars, each item owned on its own as `v:<value>` (`listType: set`).
    Set,
    /// A list of maps keyed by these fields, each item owned as `k:{..}` (`listType: map`).
    Map(Vec<String>),
}

/// Which lists of an object are granular. The emulator has no structural schema for
/// built-in kinds, so [`DefaultListRules`] decides from the path and the items.
pub trait ListRules {
    /// The kind of the list at `path` (field names and item elements from the root).
    fn list_kind(&self, path: &[PathElement], items: &[Value]) -> ListKind;
}

/// The emulator's stand-in for schemas:
/// - `metadata.finalizers` is a set and `metadata.ownerReferences` is keyed by `uid`
///   (as `ObjectMeta` declares them) on every kind;
/// - on built-in kinds (group `""`, no dot, or ending in `.k8s.io`) a list whose items are
///   all maps with a distinct scalar `name` is keyed by `name` (containers, env, volumes,
///   ports of services, ServiceAccount secrets…), except RBAC `subjects`, which is atomic;
/// - every other list is atomic — which is what the real server does for custom resources
///   whose schema declares no `x-kubernetes-list-type` (Argo CD's and ours).
#[derive(Clone, Debug)]
pub struct DefaultListRules {
    builtin: bool,
}

impl DefaultListRules {
    /// Rules for an object of this `apiVersion` (`v1`, `apps/v1`, `argoproj.io/v1alpha1`…).
    pub fn for_api_version(api_version: &str) -> DefaultListRules {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        DefaultListRules { builtin: group.is_empty() || !group.contains('.') || group.ends_with(".k8s.io") }
    }

    /// Rules for `object`, read from its `apiVersion`.
    pub fn for_object(object: &Value) -> DefaultListRules {
        DefaultListRules::for_api_version(object.get("apiVersion").and_then(Value::as_str).unwrap_or(""))
    }
}

impl ListRules for DefaultListRules {
    fn list_kind(&self, path: &[PathElement], items: &[Value]) -> ListKind {
        let field = |name: &str| PathElement::Field(name.to_owned());
        if path == [field("metadata"), field("finalizers")] {
            return ListKind::Set;
        }
        if path == [field("metadata"), field("ownerReferences")] {
            return ListKind::Map(vec!["uid".to_owned()]);
        }
        let last = path.last();
        if self.builtin
            && last != Some(&field("subjects"))
            && !items.is_empty()
            && items.iter().all(|item| item.get("name").is_some_and(|name| !name.is_object() && !name.is_array()))
        {
            return ListKind::Map(vec!["name".to_owned()]);
        }
        ListKind::Atomic
    }
}

/// The element of each item of a granular list, or `None` when the items do not fit the
/// kind (a missing or repeated key, a non-scalar set item): the list is then atomic.
pub fn item_elements(kind: &ListKind, items: &[Value]) -> Option<Vec<PathElement>> {
    let elements: Vec<PathElement> = match kind {
        ListKind::Atomic => return None,
        ListKind::Set => {
            if items.iter().any(|item| item.is_object() || item.is_array()) {
                return None;
            }
            items.iter().map(PathElement::value).collect()
        }
        ListKind::Map(keys) => {
            let mut elements = Vec::with_capacity(items.len());
            for item in items {
                let map = item.as_object()?;
                let mut fields = Vec::with_capacity(keys.len());
                for key in keys {
                    let value = map.get(key).filter(|v| !v.is_object() && !v.is_array() && !v.is_null())?;
                    fields.push((key.as_str(), value));
                }
                elements.push(PathElement::key(&fields));
            }
            elements
        }
    };
    let mut seen = std::collections::BTreeSet::new();
    elements.iter().all(|element| seen.insert(element)).then_some(elements)
}

/// The granular elements of the list at `path`, or `None` when it is atomic.
pub fn list_elements(rules: &dyn ListRules, path: &[PathElement], items: &[Value]) -> Option<Vec<PathElement>> {
    item_elements(&rules.list_kind(path, items), items)
}

/// The elements of the items of two versions of the list at `path`, or `None` when
/// the list is atomic. An empty side takes the other side's kind (the rules may judge by
/// the items); two non-empty sides must agree.
pub fn pair_elements(
    rules: &dyn ListRules,
    path: &[PathElement],
    a: &[Value],
    b: &[Value],
) -> Option<(Vec<PathElement>, Vec<PathElement>)> {
    let kind = match (a.is_empty(), b.is_empty()) {
        (true, _) => rules.list_kind(path, b),
        (_, true) => rules.list_kind(path, a),
        _ => Some(rules.list_kind(path, a)).filter(|kind| *kind == rules.list_kind(path, b))?,
    };
    Some((item_elements(&kind, a)?, item_elements(&kind, b)?))
}

/// The paths never tracked, as kube-apiserver strips them from every field set.
pub fn stripped() -> FieldSet {
    let mut set = FieldSet::new();
    let field = |name: &str| PathElement::Field(name.to_owned());
    set.insert(&[field("apiVersion")]);
    set.insert(&[field("kind")]);
    set.insert(&[field("metadata")]);
    for name in [
        "name",
        "namespace",
        "creationTimestamp",
        "selfLink",
        "uid",
        "clusterName",
        "generation",
        "managedFields",
        "resourceVersion",
    ] {
        set.insert(&[field("metadata"), field(name)]);
    }
    set
}

/// The field set of an applied configuration, as structured-merge-diff's `ToFieldSet` in
/// kube-apiserver v1.20: every scalar, null, atomic list and item of a granular list; a
/// map is implied by what is under it, and an empty map is not owned (later versions
/// own empty maps of declared fields).
pub fn object_field_set(object: &Value, rules: &dyn ListRules) -> FieldSet {
    let mut set = FieldSet::new();
    let mut path = Vec::new();
    walk_field_set(object, &mut path, &mut set, rules);
    set.difference(&stripped())
}

fn walk_field_set(value: &Value, path: &mut Vec<PathElement>, set: &mut FieldSet, rules: &dyn ListRules) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                path.push(PathElement::Field(key.clone()));
                walk_field_set(child, path, set, rules);
                if child.is_null() {
                    set.insert(path);
                }
                path.pop();
            }
        }
        Value::Array(items) => match list_elements(rules, path, items) {
            None => set.insert(path),
            Some(elements) => {
                for (element, item) in elements.into_iter().zip(items) {
                    path.push(element);
                    if item.is_object() {
                        walk_field_set(item, path, set, rules);
                    }
                    set.insert(path);
                    path.pop();
                }
            }
        },
        Value::Null => {}
        _ => set.insert(path),
    }
}

/// structured-merge-diff's `ReconcileFieldSetWithSchema`, run on every entry before each
/// write: a member without children at a granular map or list (typically a map whose
/// children an updater lost to others) is taken as an atomic field and widened to
/// everything the live object holds under it; paths below a list that is atomic collapse
/// into the list. kube-apiserver does this (observable: an updater that lost `.data.y`
/// owns it again at the next write), so the emulator does too.
pub fn reconcile(set: &FieldSet, live: &Value, rules: &dyn ListRules) -> FieldSet {
    let mut to_remove = FieldSet::new();
    let mut to_add = FieldSet::new();
    reconcile_at(set, live, &mut Vec::new(), false, live, rules, &mut to_remove, &mut to_add);
    if to_remove.is_empty() && to_add.is_empty() {
        return set.clone();
    }
    set.recursive_difference(&to_remove).union(&to_add)
}

#[allow(clippy::too_many_arguments)]
fn reconcile_at(
    set: &FieldSet,
    value: &Value,
    path: &mut Vec<PathElement>,
    is_atomic: bool,
    root: &Value,
    rules: &dyn ListRules,
    to_remove: &mut FieldSet,
    to_add: &mut FieldSet,
) {
    let granular_children = |path: &[PathElement]| {
        let mut whole = FieldSet::new();
        walk_field_set(root, &mut Vec::new(), &mut whole, rules);
        whole.subtree(path)
    };
    match value {
        Value::Object(map) => {
            if is_atomic && !map.is_empty() {
                to_add.insert(path);
                to_add.graft(path, granular_children(path));
            }
            for element in set.elements() {
                if let PathElement::Field(name) = element
                    && let Some(child) = map.get(name)
                {
                    let below = set.child(element).cloned().unwrap_or_default();
                    let atomic = set.has_member(element) && below.is_empty();
                    path.push(element.clone());
                    reconcile_at(&below, child, path, atomic, root, rules, to_remove, to_add);
                    path.pop();
                }
            }
        }
        Value::Array(items) => {
            let Some(elements) = list_elements(rules, path, items) else {
                if !is_atomic && !set.is_empty() {
                    to_remove.insert(path);
                    to_add.insert(path);
                }
                return;
            };
            if is_atomic && !items.is_empty() {
                to_add.insert(path);
                to_add.graft(path, granular_children(path));
            }
            for (element, item) in elements.iter().zip(items) {
                if !set.touches(element) {
                    continue;
                }
                let below = set.child(element).cloned().unwrap_or_default();
                let atomic = set.has_member(element) && below.is_empty();
                path.push(element.clone());
                reconcile_at(&below, item, path, atomic, root, rules, to_remove, to_add);
                path.pop();
            }
        }
        _ => {}
    }
}

/// What changed between two versions of an object, as structured-merge-diff's `Compare`.
#[derive(Debug, Default)]
pub struct Comparison {
    pub added: FieldSet,
    pub modified: FieldSet,
    pub removed: FieldSet,
}

impl Comparison {
    pub fn is_same(&self) -> bool {
        self.added.is_empty() && self.modified.is_empty() && self.removed.is_empty()
    }
}

/// Compares `old` and `new` (whole objects; `managedFields` should be left out).
pub fn compare(old: &Value, new: &Value, rules: &dyn ListRules) -> Comparison {
    let mut out = Comparison::default();
    compare_at(&mut Vec::new(), Some(old), Some(new), rules, &mut out);
    let strip = stripped();
    Comparison {
        added: out.added.difference(&strip),
        modified: out.modified.difference(&strip),
        removed: out.removed.difference(&strip),
    }
}

#[derive(PartialEq)]
enum Shape {
    Map,
    List,
    Leaf,
}

fn shape(value: Option<&Value>) -> Option<Shape> {
    match value {
        None | Some(Value::Null) => None,
        Some(Value::Object(_)) => Some(Shape::Map),
        Some(Value::Array(_)) => Some(Shape::List),
        Some(_) => Some(Shape::Leaf),
    }
}

fn compare_at(
    path: &mut Vec<PathElement>,
    old: Option<&Value>,
    new: Option<&Value>,
    rules: &dyn ListRules,
    out: &mut Comparison,
) {
    let (old_shape, new_shape) = (shape(old), shape(new));
    if let (Some(a), Some(b)) = (&old_shape, &new_shape)
        && a != b
    {
        // A change of shape: everything below the old value went, everything below the
        // new one came, and the field itself changed.
        compare_at(path, old, None, rules, out);
        compare_at(path, None, new, rules, out);
        out.modified.insert(path);
        return;
    }
    let granular = match old_shape.or(new_shape) {
        Some(Shape::Map) => {
            let (a, b) = (old.and_then(Value::as_object), new.and_then(Value::as_object));
            if a.is_none_or(Map::is_empty) && b.is_none_or(Map::is_empty) {
                false
            } else {
                let mut keys: Vec<&String> = a.into_iter().flat_map(Map::keys).collect();
                keys.extend(b.into_iter().flat_map(Map::keys));
                keys.sort();
                keys.dedup();
                for key in keys {
                    path.push(PathElement::Field(key.clone()));
                    compare_at(path, a.and_then(|m| m.get(key)), b.and_then(|m| m.get(key)), rules, out);
                    path.pop();
                }
                true
            }
        }
        Some(Shape::List) => {
            let empty = Vec::new();
            let a = old.and_then(Value::as_array).unwrap_or(&empty);
            let b = new.and_then(Value::as_array).unwrap_or(&empty);
            match pair_elements(rules, path, a, b) {
                Some((ea, eb)) if !(a.is_empty() && b.is_empty()) => {
                    let index_a = index_items(ea, a);
                    let index_b = index_items(eb, b);
                    let mut all: Vec<&PathElement> = index_a.keys().chain(index_b.keys()).collect();
                    all.sort();
                    all.dedup();
                    for element in all {
                        path.push(element.clone());
                        compare_at(path, index_a.get(element).copied(), index_b.get(element).copied(), rules, out);
                        path.pop();
                    }
                    true
                }
                _ => false,
            }
        }
        _ => false,
    };
    match (old, new) {
        (None, Some(_)) => out.added.insert(path),
        (Some(_), None) => out.removed.insert(path),
        (Some(a), Some(b)) if !granular && a != b => out.modified.insert(path),
        _ => {}
    }
}

fn index_items(elements: Vec<PathElement>, items: &[Value]) -> BTreeMap<PathElement, &Value> {
    elements.into_iter().zip(items).collect()
}

/// structured-merge-diff's merge of an applied configuration into the live object.
pub fn merge(
    path: &mut Vec<PathElement>,
    live: Option<&Value>,
    applied: Option<&Value>,
    rules: &dyn ListRules,
) -> Option<Value> {
    let (live_value, applied_value) = match (live, applied) {
        (_, None) => return live.cloned(),
        (None, Some(applied)) => return Some(applied.clone()),
        (Some(live), Some(applied)) => (live, applied),
    };
    match (live_value, applied_value) {
        (Value::Object(_), Value::Object(_) | Value::Null) | (Value::Null, Value::Object(_)) => {
            let (a, b) = (live_value.as_object(), applied_value.as_object());
            if a.is_none_or(Map::is_empty) && b.is_none_or(Map::is_empty) {
                return Some(applied_value.clone());
            }
            let mut out = Map::new();
            let keys = a.into_iter().flat_map(Map::keys).chain(b.into_iter().flat_map(Map::keys));
            for key in keys {
                if out.contains_key(key) {
                    continue;
                }
                path.push(PathElement::Field(key.clone()));
                if let Some(value) = merge(path, a.and_then(|m| m.get(key)), b.and_then(|m| m.get(key)), rules) {
                    out.insert(key.clone(), value);
                }
                path.pop();
            }
            Some(Value::Object(out))
        }
        (Value::Array(_), Value::Array(_) | Value::Null) | (Value::Null, Value::Array(_)) => {
            let empty = Vec::new();
            let a = live_value.as_array().unwrap_or(&empty);
            let b = applied_value.as_array().unwrap_or(&empty);
            let Some((ea, eb)) = pair_elements(rules, path, a, b).filter(|_| !(a.is_empty() && b.is_empty())) else {
                return Some(applied_value.clone());
            };
            // Live items keep their order (merged with the applied item of the same key);
            // applied items that are new follow, in applied order (as v1.20 orders them).
            let mut out = Vec::with_capacity(a.len().max(b.len()));
            for (element, item) in ea.iter().zip(a) {
                let applied_item = eb.iter().position(|e| e == element).map(|i| &b[i]);
                path.push(element.clone());
                out.extend(merge(path, Some(item), applied_item, rules));
                path.pop();
            }
            for (element, item) in eb.iter().zip(b) {
                if !ea.contains(element) {
                    out.push(item.clone());
                }
            }
            Some(Value::Array(out))
        }
        _ => Some(applied_value.clone()),
    }
}

/// Removes from `value` (at `path`) what `last` holds and `keep` does not: the fields a
/// manager applied before, no longer applies, and nobody else owns. A field counts as
/// kept when anything under it is owned; a list item only when the item itself is.
pub fn prune(value: &mut Value, path: &mut Vec<PathElement>, last: &FieldSet, keep: &FieldSet, rules: &dyn ListRules) {
    let empty = FieldSet::new();
    for element in last.elements() {
        let kept = match element {
            PathElement::Field(_) => keep.touches(element),
            _ => keep.has_member(element),
        };
        let Some(index) = locate(value, path, element, rules) else { continue };
        if last.has_member(element) && !kept {
            remove_child(value, &index);
            continue;
        }
        let Some(below) = last.child(element) else { continue };
        let Some(child) = child_mut(value, &index) else { continue };
        let was_empty = is_empty_container(child);
        path.push(element.clone());
        prune(child, path, below, keep.child(element).unwrap_or(&empty), rules);
        path.pop();
        if !was_empty && is_empty_container(child) && !keep.has_member(element) {
            remove_child(value, &index);
        }
    }
}

/// Where a child of a map or list lives.
enum ChildIndex {
    Key(String),
    Position(usize),
}

fn locate(value: &Value, path: &[PathElement], element: &PathElement, rules: &dyn ListRules) -> Option<ChildIndex> {
    match (element, value) {
        (PathElement::Field(name), Value::Object(map)) => map.contains_key(name).then(|| ChildIndex::Key(name.clone())),
        (PathElement::Key(_) | PathElement::Value(_), Value::Array(items)) => {
            let elements = list_elements(rules, path, items)?;
            elements.iter().position(|e| e == element).map(ChildIndex::Position)
        }
        _ => None,
    }
}

fn child_mut<'a>(value: &'a mut Value, index: &ChildIndex) -> Option<&'a mut Value> {
    match (index, value) {
        (ChildIndex::Key(key), Value::Object(map)) => map.get_mut(key),
        (ChildIndex::Position(position), Value::Array(items)) => items.get_mut(*position),
        _ => None,
    }
}

fn remove_child(value: &mut Value, index: &ChildIndex) {
    match (index, value) {
        (ChildIndex::Key(key), Value::Object(map)) => {
            map.remove(key);
        }
        (ChildIndex::Position(position), Value::Array(items)) if *position < items.len() => {
            items.remove(*position);
        }
        _ => {}
    }
}

fn is_empty_container(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn f(name: &str) -> PathElement {
        PathElement::Field(name.to_owned())
    }

    fn core() -> DefaultListRules {
        DefaultListRules::for_api_version("v1")
    }

    #[test]
    fn list_rules_follow_the_kind() {
        let named = [json!({"name": "a"}), json!({"name": "b"})];
        let path = [f("spec"), f("containers")];
        assert_eq!(core().list_kind(&path, &named), ListKind::Map(vec!["name".into()]));
        assert_eq!(
            DefaultListRules::for_api_version("apps/v1").list_kind(&path, &named),
            ListKind::Map(vec!["name".into()])
        );
        let crd = DefaultListRules::for_api_version("argoproj.io/v1alpha1");
        assert_eq!(crd.list_kind(&path, &named), ListKind::Atomic);
        let rbac = DefaultListRules::for_api_version("rbac.authorization.k8s.io/v1");
        assert_eq!(rbac.list_kind(&[f("subjects")], &named), ListKind::Atomic);
        assert_eq!(crd.list_kind(&[f("metadata"), f("finalizers")], &[json!("x")]), ListKind::Set);
        assert_eq!(crd.list_kind(&[f("metadata"), f("ownerReferences")], &[]), ListKind::Map(vec!["uid".into()]));
        // Repeated keys make a list atomic.
        let twice = [json!({"name": "a"}), json!({"name": "a"})];
        assert_eq!(list_elements(&core(), &path, &twice), None);
        assert_eq!(item_elements(&ListKind::Set, &[json!({"a": 1})]), None);
    }

    #[test]
    fn field_set_of_an_applied_config_matches_kubernetes() {
        let applied = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}, "finalizers": ["a.io/f"]},
            "spec": {"containers": [{"name": "c", "image": "nginx", "args": ["x"], "env": [{"name": "A", "value": "1"}]}], "empty": {}}
        });
        let set = object_field_set(&applied, &core());
        assert_eq!(
            set.to_fields_v1(),
            json!({
                "f:metadata": {"f:finalizers": {"v:\"a.io/f\"": {}}, "f:labels": {"f:app": {}}},
                "f:spec": {
                    "f:containers": {"k:{\"name\":\"c\"}": {
                        ".": {}, "f:args": {}, "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}},
                        "f:image": {}, "f:name": {}
                    }}
                }
            })
        );
    }

    #[test]
    fn compare_reports_added_parents_and_children() {
        let old = json!({"metadata": {"name": "c"}});
        let new = json!({"metadata": {"name": "c", "labels": {"a": "1"}}, "data": {"x": "1"}});
        let cmp = compare(&old, &new, &core());
        assert_eq!(
            cmp.added.to_fields_v1(),
            json!({"f:data": {".": {}, "f:x": {}}, "f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
        );
        assert!(cmp.modified.is_empty() && cmp.removed.is_empty());
        let newer = json!({"metadata": {"name": "c"}, "data": {"x": "2"}});
        let cmp = compare(&new, &newer, &core());
        assert_eq!(cmp.modified.paths(), vec![vec![f("data"), f("x")]]);
        assert_eq!(cmp.removed.to_fields_v1(), json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}}));
        assert!(compare(&newer, &newer, &core()).is_same());
        // An atomic list is one field.
        let a = json!({"spec": {"tags": ["a"]}});
        let b = json!({"spec": {"tags": ["a", "b"]}});
        let crd = DefaultListRules::for_api_version("x.io/v1");
        assert_eq!(compare(&a, &b, &crd).modified.paths(), vec![vec![f("spec"), f("tags")]]);
    }
}
