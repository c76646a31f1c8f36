//! What the emulator serves: one `ResourceInfo` per (group, version, resource),
//! for the built-in kinds and for every served version of every established CRD.
//! Discovery, routing, storage keys and error messages all read this table.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::meta::NameRule;
use super::schema::Structural;

/// A discovery entry beside the main resource (`serviceaccounts/token`, `namespaces/finalize`).
#[derive(Debug, Clone)]
pub struct ExtraSubresource {
    pub name: &'static str,
    pub group: Option<&'static str>,
    pub version: Option<&'static str>,
    pub kind: &'static str,
    pub verbs: &'static [&'static str],
}

/// The custom-resource part of a served CRD version.
#[derive(Debug, Clone)]
pub struct CustomResource {
    pub crd_name: String,
    pub storage_version: String,
    /// The structural schema of this version, when it has one.
    pub schema: Option<Arc<Structural>>,
}

#[derive(Debug, Clone)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub status_subresource: bool,
    /// Whether `metadata.generation` is maintained (CRs and CRDs, not ConfigMaps).
    pub uses_generation: bool,
    /// DELETE answers with the deleted object instead of a `Status`.
    pub returns_deleted_object: bool,
    pub deletecollection: bool,
    pub name_rule: NameRule,
    pub extra_subresources: Vec<ExtraSubresource>,
    pub custom: Option<CustomResource>,
    /// A review (SubjectAccessReview…): POST only, answered and never stored.
    pub create_only: bool,
}

impl ResourceInfo {
    /// `plural` or `plural.group`, as messages name a resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.clone() } else { format!("{}.{}", self.plural, self.group) }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// The key of this resource's table: independent of the version served.
    pub fn storage_key(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            return vec!["create"];
        }
        let mut verbs = vec!["create", "delete"];
        if self.deletecollection {
            verbs.push("deletecollection");
        }
        verbs.extend(["get", "list", "patch", "update", "watch"]);
        verbs
    }

    pub fn is_custom(&self) -> bool {
        self.custom.is_some()
    }

    /// The storage version's apiVersion (what objects are stored with).
    pub fn storage_api_version(&self) -> String {
        match &self.custom {
            Some(custom) if !self.group.is_empty() => format!("{}/{}", self.group, custom.storage_version),
            _ => self.api_version(),
        }
    }
}

fn builtin(
    group: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    name_rule: NameRule,
) -> ResourceInfo {
    ResourceInfo {
        group: group.to_owned(),
        version: "v1".to_owned(),
        plural: plural.to_owned(),
        singular: String::new(),
        kind: kind.to_owned(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| (*s).to_owned()).collect(),
        categories: Vec::new(),
        status_subresource: false,
        uses_generation: false,
        returns_deleted_object: false,
        deletecollection: true,
        name_rule,
        extra_subresources: Vec::new(),
        custom: None,
        create_only: false,
    }
}

pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
pub const CRD_GROUP: &str = "apiextensions.k8s.io";
pub const ADMISSION_GROUP: &str = "admissionregistration.k8s.io";
pub const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";
pub const EVENTS_GROUP: &str = "events.k8s.io";
pub const COORDINATION_GROUP: &str = "coordination.k8s.io";
pub const APPS_GROUP: &str = "apps";

/// The built-in resources, in the order kube-apiserver lists them.
pub fn builtins() -> Vec<ResourceInfo> {
    let mut configmaps = builtin("", "configmaps", "ConfigMap", true, &["cm"], NameRule::Subdomain);
    configmaps.singular = String::new();
    let mut namespaces = builtin("", "namespaces", "Namespace", false, &["ns"], NameRule::Label);
    namespaces.status_subresource = true;
    namespaces.returns_deleted_object = true;
    namespaces.deletecollection = false;
    namespaces.extra_subresources =
        vec![ExtraSubresource { name: "finalize", group: None, version: None, kind: "Namespace", verbs: &["update"] }];
    let secrets = builtin("", "secrets", "Secret", true, &[], NameRule::Subdomain);
    let mut serviceaccounts = builtin("", "serviceaccounts", "ServiceAccount", true, &["sa"], NameRule::Subdomain);
    serviceaccounts.returns_deleted_object = true;
    serviceaccounts.extra_subresources = vec![ExtraSubresource {
        name: "token",
        group: Some("authentication.k8s.io"),
        version: Some("v1"),
        kind: "TokenRequest",
        verbs: &["create"],
    }];
    let mut crds = builtin(
        CRD_GROUP,
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        &["crd", "crds"],
        NameRule::Subdomain,
    );
    crds.status_subresource = true;
    crds.uses_generation = true;
    crds.returns_deleted_object = true;
    crds.categories = vec!["api-extensions".to_owned()];
    let review = |plural: &str, kind: &str, namespaced: bool| {
        let mut info = builtin(AUTHORIZATION_GROUP, plural, kind, namespaced, &[], NameRule::Subdomain);
        info.create_only = true;
        info.deletecollection = false;
        info
    };
    let mut webhooks = builtin(
        ADMISSION_GROUP,
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        &[],
        NameRule::Subdomain,
    );
    webhooks.categories = vec!["api-extensions".to_owned()];
    // Served for what reads a StatefulSet's spec (an Argo CD's version); nothing
    // runs its pods.
    let mut statefulsets = builtin(APPS_GROUP, "statefulsets", "StatefulSet", true, &["sts"], NameRule::Subdomain);
    statefulsets.status_subresource = true;
    statefulsets.uses_generation = true;
    statefulsets.categories = vec!["all".to_owned()];
    vec![
        configmaps,
        builtin("", "events", "Event", true, &["ev"], NameRule::Subdomain),
        namespaces,
        secrets,
        serviceaccounts,
        review("localsubjectaccessreviews", "LocalSubjectAccessReview", true),
        review("selfsubjectaccessreviews", "SelfSubjectAccessReview", false),
        review("subjectaccessreviews", "SubjectAccessReview", false),
        builtin(RBAC_GROUP, "clusterrolebindings", "ClusterRoleBinding", false, &[], NameRule::PathSegment),
        builtin(RBAC_GROUP, "clusterroles", "ClusterRole", false, &[], NameRule::PathSegment),
        builtin(RBAC_GROUP, "rolebindings", "RoleBinding", true, &[], NameRule::PathSegment),
        builtin(RBAC_GROUP, "roles", "Role", true, &[], NameRule::PathSegment),
        webhooks,
        crds,
        builtin(COORDINATION_GROUP, "leases", "Lease", true, &[], NameRule::Subdomain),
        builtin(EVENTS_GROUP, "events", "Event", true, &["ev"], NameRule::Subdomain),
        statefulsets,
    ]
}

/// Kubernetes version priority: GA > beta > alpha > other; higher numbers first.
pub fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn parse(v: &str) -> (u8, u64, u64, String) {
        let rest = match v.strip_prefix('v') {
            Some(rest) => rest,
            None => return (0, 0, 0, v.to_owned()),
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(major) = digits.parse::<u64>() else { return (0, 0, 0, v.to_owned()) };
        let tail = &rest[digits.len()..];
        let (level, tail) = if tail.is_empty() {
            return (3, major, 0, String::new());
        } else if let Some(t) = tail.strip_prefix("beta") {
            (2, t)
        } else if let Some(t) = tail.strip_prefix("alpha") {
            (1, t)
        } else {
            return (0, 0, 0, v.to_owned());
        };
        match tail.parse::<u64>() {
            Ok(minor) => (level, major, minor, String::new()),
            Err(_) => (0, 0, 0, v.to_owned()),
        }
    }
    let (la, ma, na, sa) = parse(a);
    let (lb, mb, nb, sb) = parse(b);
    lb.cmp(&la).then(mb.cmp(&ma)).then(nb.cmp(&na)).then(sa.cmp(&sb))
}

/// The served resources, keyed by (group, version, plural).
#[derive(Debug, Default)]
pub struct Registry {
    entries: HashMap<(String, String, String), Arc<ResourceInfo>>,
    /// Group → versions in discovery order, with built-in groups first.
    builtin_groups: Vec<(String, Vec<String>)>,
    /// CRD name → the keys it registered.
    by_crd: BTreeMap<String, Vec<(String, String, String)>>,
}

impl Registry {
    pub fn new() -> Registry {
        let mut registry = Registry::default();
        for info in builtins() {
            if !registry.builtin_groups.iter().any(|(g, _)| *g == info.group) {
                registry.builtin_groups.push((info.group.clone(), vec![info.version.clone()]));
            }
            let key = (info.group.clone(), info.version.clone(), info.plural.clone());
            registry.entries.insert(key, Arc::new(info));
        }
        registry
    }

    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceInfo>> {
        self.entries.get(&(group.to_owned(), version.to_owned(), plural.to_owned())).cloned()
    }

    /// Any version of a resource (for storage-level work such as cascading deletes).
    pub fn by_storage_key(&self, storage_key: &str) -> Option<Arc<ResourceInfo>> {
        self.entries.values().find(|info| info.storage_key() == storage_key).cloned()
    }

    /// The storage-version entry of every resource, built-in or custom.
    pub fn storage_entries(&self) -> Vec<Arc<ResourceInfo>> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for info in self.entries.values().filter(|info| !info.create_only) {
            let storage = match &info.custom {
                Some(custom) => custom.storage_version == info.version,
                None => true,
            };
            if storage && seen.insert(info.storage_key()) {
                out.push(info.clone());
            }
        }
        out.sort_by_key(|info| info.storage_key());
        out
    }

    /// Replaces what CRD `crd_name` serves (an empty list removes it).
    pub fn set_crd(&mut self, crd_name: &str, infos: Vec<ResourceInfo>) {
        if let Some(keys) = self.by_crd.remove(crd_name) {
            for key in keys {
                self.entries.remove(&key);
            }
        }
        if infos.is_empty() {
            return;
        }
        let mut keys = Vec::new();
        for info in infos {
            let key = (info.group.clone(), info.version.clone(), info.plural.clone());
            self.entries.insert(key.clone(), Arc::new(info));
            keys.push(key);
        }
        self.by_crd.insert(crd_name.to_owned(), keys);
    }

    /// Every group (core "" included) with its versions, preferred first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut groups = self.builtin_groups.clone();
        let mut custom: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for keys in self.by_crd.values() {
            for (group, version, _) in keys {
                if groups.iter().any(|(g, _)| g == group) {
                    continue;
                }
                let versions = custom.entry(group.clone()).or_default();
                if !versions.contains(version) {
                    versions.push(version.clone());
                }
            }
        }
        for (group, mut versions) in custom {
            versions.sort_by(|a, b| version_order(a, b));
            groups.push((group, versions));
        }
        groups
    }

    /// The resources of one group version, sorted by name.
    pub fn resources_of(&self, group: &str, version: &str) -> Vec<Arc<ResourceInfo>> {
        let mut out: Vec<Arc<ResourceInfo>> =
            self.entries.values().filter(|i| i.group == group && i.version == version).cloned().collect();
        out.sort_by(|a, b| a.plural.cmp(&b.plural));
        out
    }

    /// Whether a group version is served at all.
    pub fn serves(&self, group: &str, version: &str) -> bool {
        self.entries.values().any(|i| i.group == group && i.version == version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_versions_like_kubernetes() {
        let mut versions = vec!["v1alpha1", "v1", "v2beta1", "foo", "v1beta2", "v2", "v1beta1"];
        versions.sort_by(|a, b| version_order(a, b));
        assert_eq!(versions, ["v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"]);
    }
}
