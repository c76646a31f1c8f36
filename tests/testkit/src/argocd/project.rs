//! AppProject checks as Argo CD makes them before it compares an Application: the
//! project must exist and permit the source repository and the destination. The
//! service relies on these to isolate tenants, so the stand-in refuses exactly
//! what Argo CD refuses and reports it with Argo CD's condition messages. A sync
//! also needs the project to permit each cluster-scoped resource it would create
//! (`clusterResourceWhitelist`, see [`sync_refusal`]).
//!
//! Matching follows Argo CD's: repository URLs are normalised (case, trailing
//! `/`, `.git`) on both sides; patterns are globs where `*` matches any run of
//! characters (including `/`) and `?` one character; a pattern starting with `!`
//! denies what it matches and wins over any allowing pattern. A destination entry
//! matches when its namespace pattern matches and either its server pattern
//! matches the Application's server or its name pattern matches the
//! Application's cluster name (the stand-in does not resolve cluster names to
//! servers through cluster Secrets).

use serde_json::Value;

use super::application::{AppSpec, str_at};

/// Argo CD's condition type for an Application the project refuses.
pub const INVALID_SPEC_ERROR: &str = "InvalidSpecError";

/// An AppProject's rules, read leniently from its object: missing or mistyped
/// fields count as empty lists, so an odd project refuses rather than panics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectRules {
    pub source_repos: Vec<String>,
    pub destinations: Vec<DestinationRule>,
    /// `spec.clusterResourceWhitelist` as (group, kind) patterns: the cluster-scoped
    /// resources the project permits (none when empty, as in Argo CD).
    pub cluster_resource_whitelist: Vec<(String, String)>,
    /// `spec.clusterResourceBlacklist`: cluster-scoped resources refused even when
    /// whitelisted.
    pub cluster_resource_blacklist: Vec<(String, String)>,
}

/// One `spec.destinations[]` entry; an absent field is an empty pattern.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationRule {
    pub server: String,
    pub namespace: String,
    pub name: String,
}

impl ProjectRules {
    /// Reads `spec.sourceRepos` and `spec.destinations` of an AppProject's JSON.
    pub fn from_object(project: &Value) -> Self {
        let spec = project.get("spec").unwrap_or(&Value::Null);
        let source_repos = spec
            .get("sourceRepos")
            .and_then(Value::as_array)
            .map(|repos| repos.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        let destinations = spec
            .get("destinations")
            .and_then(Value::as_array)
            .map(|entries| {
                entries
                    .iter()
                    .filter(|entry| entry.is_object())
                    .map(|entry| DestinationRule {
                        server: str_at(entry, "/server").to_owned(),
                        namespace: str_at(entry, "/namespace").to_owned(),
                        name: str_at(entry, "/name").to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let group_kinds = |field: &str| -> Vec<(String, String)> {
            spec.get(field)
                .and_then(Value::as_array)
                .map(|entries| {
                    entries
                        .iter()
                        .filter(|entry| entry.is_object())
                        .map(|entry| (str_at(entry, "/group").to_owned(), str_at(entry, "/kind").to_owned()))
                        .collect()
                })
                .unwrap_or_default()
        };
        ProjectRules {
            source_repos,
            destinations,
            cluster_resource_whitelist: group_kinds("clusterResourceWhitelist"),
            cluster_resource_blacklist: group_kinds("clusterResourceBlacklist"),
        }
    }

    /// Whether the project permits the cluster-scoped resource kind `group`/`kind`
    /// (`group` is "" for the core group), as Argo CD's `IsGroupKindPermitted`:
    /// whitelisted by a glob pair and not blacklisted.
    pub fn cluster_resource_permitted(&self, group: &str, kind: &str) -> bool {
        let matches = |(g, k): &(String, String)| glob_match(g, group) && glob_match(k, kind);
        self.cluster_resource_whitelist.iter().any(matches) && !self.cluster_resource_blacklist.iter().any(matches)
    }

    /// Whether the project permits repository `repo_url`.
    pub fn repo_permitted(&self, repo_url: &str) -> bool {
        let repo = normalize_repo_url(repo_url);
        permitted(self.source_repos.iter().map(|pattern| {
            let (deny, pattern) = split_deny(pattern);
            (deny, glob_match(&normalize_repo_url(pattern), &repo))
        }))
    }

    /// Whether the project permits deploying to `server`/`name` and `namespace`.
    pub fn destination_permitted(&self, server: &str, name: &str, namespace: &str) -> bool {
        permitted(self.destinations.iter().map(|rule| {
            let (server_deny, server_pattern) = split_deny(&rule.server);
            let (name_deny, name_pattern) = split_deny(&rule.name);
            let (namespace_deny, namespace_pattern) = split_deny(&rule.namespace);
            let cluster = (!server.is_empty() && !server_pattern.is_empty() && glob_match(server_pattern, server))
                || (!name.is_empty() && !name_pattern.is_empty() && glob_match(name_pattern, name));
            let namespace_matched = glob_match(namespace_pattern, namespace);
            (server_deny || name_deny || namespace_deny, cluster && namespace_matched)
        }))
    }
}

/// Allowed when some allowing pattern matched and no denying one did.
fn permitted(matches: impl Iterator<Item = (bool, bool)>) -> bool {
    let mut allowed = false;
    for (deny, matched) in matches {
        match (deny, matched) {
            (true, true) => return false,
            (false, true) => allowed = true,
            _ => {}
        }
    }
    allowed
}

fn split_deny(pattern: &str) -> (bool, &str) {
    match pattern.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, pattern),
    }
}

/// Argo CD's repository URL normalisation, reduced to what matters for matching:
/// lower case, no trailing `/`, no `.git` suffix.
pub fn normalize_repo_url(url: &str) -> String {
    let lower = url.trim().to_lowercase();
    let trimmed = lower.trim_end_matches('/');
    trimmed.strip_suffix(".git").unwrap_or(trimmed).to_owned()
}

/// Glob matching: `*` matches any run of characters (`/` included), `?` exactly
/// one; everything else matches itself. Linear-time with backtracking on the
/// last `*` only.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// The InvalidSpecError messages Argo CD reports for `spec` under `project`
/// (`None`: the project does not exist). Empty when the Application is valid.
pub fn spec_errors(spec: &AppSpec, project: Option<&ProjectRules>) -> Vec<String> {
    let mut errors = Vec::new();
    let Some(rules) = project else {
        errors.push(format!("Application referencing project {} which does not exist", spec.project));
        return errors;
    };
    let destination = &spec.destination;
    if destination.server.is_empty() && destination.name.is_empty() {
        errors.push("Destination server missing from app spec".to_owned());
    } else if !destination.server.is_empty() && !destination.name.is_empty() {
        errors.push(format!(
            "application destination can't have both name and server defined: {} {}",
            destination.name, destination.server
        ));
    }
    if !rules.repo_permitted(&spec.source.repo_url) {
        errors
            .push(format!("application repo {} is not permitted in project '{}'", spec.source.repo_url, spec.project));
    }
    let has_cluster = !destination.server.is_empty() || !destination.name.is_empty();
    if has_cluster && !rules.destination_permitted(&destination.server, &destination.name, &destination.namespace) {
        let server = if destination.server.is_empty() { &destination.name } else { &destination.server };
        errors.push(format!(
            "application destination server '{server}' and namespace '{}' do not match any of the allowed destinations in project '{}'",
            destination.namespace, spec.project
        ));
    }
    errors
}

/// Argo CD's message for a sync with a task its project does not permit.
pub const NOT_VALID_MESSAGE: &str = "one or more synchronization tasks are not valid";

/// Why a sync of `spec` that deploys `resource` (group, kind, namespaced) is
/// refused by project `project`: Argo CD's per-resource message, or None.
pub fn sync_refusal(spec: &AppSpec, rules: &ProjectRules, resource: (&str, &str, bool)) -> Option<String> {
    let (group, kind, namespaced) = resource;
    (!namespaced && !rules.cluster_resource_permitted(group, kind))
        .then(|| format!("resource {group}:{kind} is not permitted in project {}", spec.project))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::argocd::application::AppSpec;

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("*", "https://a/b"));
        assert!(glob_match("https://git.example.invalid/team/*", "https://git.example.invalid/team/app"));
        assert!(glob_match("https://git.example.invalid/team/*", "https://git.example.invalid/team/x/y"));
        assert!(!glob_match("https://git.example.invalid/team/*", "https://git.example.invalid/other/app"));
        assert!(glob_match("team-?", "team-a"));
        assert!(!glob_match("team-?", "team-ab"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match("*-prod", "tenant-prod"));
        assert!(!glob_match("ns", ""));
        assert!(glob_match("", ""));
        assert!(glob_match("**", "x"));
    }

    #[test]
    fn repo_urls_are_normalised() {
        assert_eq!(
            normalize_repo_url("HTTPS://Git.Example.invalid/Team/App.git/"),
            "https://git.example.invalid/team/app"
        );
        let rules = ProjectRules {
            source_repos: vec!["https://git.example.invalid/team/app.git".into()],
            ..Default::default()
        };
        assert!(rules.repo_permitted("https://git.example.invalid/team/app"));
        assert!(rules.repo_permitted("https://GIT.example.invalid/team/app/"));
        assert!(!rules.repo_permitted("https://git.example.invalid/team/app2"));
    }

    #[test]
    fn deny_patterns_win() {
        let rules = ProjectRules {
            source_repos: vec!["*".into(), "!https://git.example.invalid/secret/*".into()],
            destinations: vec![
                DestinationRule { server: "*".into(), namespace: "*".into(), name: String::new() },
                DestinationRule { server: "*".into(), namespace: "!kube-system".into(), name: String::new() },
            ],
            ..Default::default()
        };
        assert!(rules.repo_permitted("https://git.example.invalid/team/app"));
        assert!(!rules.repo_permitted("https://git.example.invalid/secret/app"));
        assert!(rules.destination_permitted("https://cluster.example.invalid", "", "team"));
        assert!(!rules.destination_permitted("https://cluster.example.invalid", "", "kube-system"));
    }

    #[test]
    fn destinations_match_server_or_name_and_namespace() {
        let rules = ProjectRules::from_object(&json!({"spec": {"destinations": [
            {"server": "https://cluster.example.invalid?env=a", "namespace": "team-*"},
            {"name": "in-cluster", "namespace": "apps"},
            "not an object",
        ]}}));
        assert_eq!(rules.destinations.len(), 2);
        assert!(rules.destination_permitted("https://cluster.example.invalid?env=a", "", "team-x"));
        assert!(!rules.destination_permitted("https://cluster.example.invalid?env=b", "", "team-x"));
        assert!(!rules.destination_permitted("https://cluster.example.invalid?env=a", "", "other"));
        assert!(rules.destination_permitted("", "in-cluster", "apps"));
        assert!(!rules.destination_permitted("", "in-cluster", "team-x"));
        assert!(!rules.destination_permitted("", "", "apps"));
    }

    #[test]
    fn cluster_resources_need_the_whitelist() {
        let none = ProjectRules::from_object(&json!({"spec": {"clusterResourceWhitelist": []}}));
        assert!(!none.cluster_resource_permitted("rbac.authorization.k8s.io", "ClusterRole"));
        assert!(!ProjectRules::default().cluster_resource_permitted("", "Namespace"), "absent: none permitted");
        let all =
            ProjectRules::from_object(&json!({"spec": {"clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}}));
        assert!(all.cluster_resource_permitted("rbac.authorization.k8s.io", "ClusterRole"));
        assert!(all.cluster_resource_permitted("", "Namespace"));
        let some = ProjectRules::from_object(&json!({"spec": {
            "clusterResourceWhitelist": [{"group": "rbac.authorization.k8s.io", "kind": "*"}],
            "clusterResourceBlacklist": [{"group": "*", "kind": "ClusterRoleBinding"}],
        }}));
        assert!(some.cluster_resource_permitted("rbac.authorization.k8s.io", "ClusterRole"));
        assert!(!some.cluster_resource_permitted("rbac.authorization.k8s.io", "ClusterRoleBinding"));
        assert!(!some.cluster_resource_permitted("", "Namespace"));
        let app = spec("https://git.example.invalid/a", "https://c.example.invalid", "ns");
        assert_eq!(
            sync_refusal(&app, &none, ("rbac.authorization.k8s.io", "ClusterRole", false)).as_deref(),
            Some("resource rbac.authorization.k8s.io:ClusterRole is not permitted in project p")
        );
        assert_eq!(
            sync_refusal(&app, &none, ("apps", "Deployment", true)),
            None,
            "namespaced kinds are not judged here"
        );
        assert_eq!(sync_refusal(&app, &all, ("rbac.authorization.k8s.io", "ClusterRole", false)), None);
    }

    #[test]
    fn odd_projects_refuse_everything() {
        for project in [json!(null), json!({"spec": "x"}), json!({"spec": {"sourceRepos": "*", "destinations": 3}})] {
            let rules = ProjectRules::from_object(&project);
            assert!(!rules.repo_permitted("https://git.example.invalid/a"));
            assert!(!rules.destination_permitted("https://c.example.invalid", "", "ns"));
        }
    }

    fn spec(repo: &str, server: &str, namespace: &str) -> AppSpec {
        AppSpec::from_object(&json!({"spec": {
            "project": "p",
            "source": {"repoURL": repo, "path": "apps/web"},
            "destination": {"server": server, "namespace": namespace},
        }}))
    }

    #[test]
    fn argo_cd_messages() {
        let rules = ProjectRules {
            source_repos: vec!["https://git.example.invalid/team/*".into()],
            destinations: vec![DestinationRule {
                server: "https://cluster.example.invalid".into(),
                namespace: "team".into(),
                name: String::new(),
            }],
            ..Default::default()
        };
        let ok = spec("https://git.example.invalid/team/app", "https://cluster.example.invalid", "team");
        assert!(spec_errors(&ok, Some(&rules)).is_empty());
        let bad = spec("https://git.example.invalid/other/app", "https://elsewhere.example.invalid", "team");
        assert_eq!(
            spec_errors(&bad, Some(&rules)),
            [
                "application repo https://git.example.invalid/other/app is not permitted in project 'p'",
                "application destination server 'https://elsewhere.example.invalid' and namespace 'team' do not match any of the allowed destinations in project 'p'",
            ]
        );
        assert_eq!(spec_errors(&ok, None), ["Application referencing project p which does not exist"]);
        let no_cluster = spec("https://git.example.invalid/team/app", "", "team");
        assert_eq!(spec_errors(&no_cluster, Some(&rules)), ["Destination server missing from app spec"]);
    }
}
