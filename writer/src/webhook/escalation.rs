//! "Could this person grant the home role here themselves?" — the rule Kubernetes
//! applies to RBAC escalation, asked of the API server with SubjectAccessReviews in
//! the requester's name (user, uid, groups, extra from the admission request).
//!
//! First one review: `bind` on `clusterroles/<role>` in the namespace. When that is
//! refused, one review per (verb, API group, resource, resource name) of the role's
//! rules — hundreds for `admin` — run concurrently; the person may grant the role
//! when every one is allowed. Unlike Kubernetes's own escalation check, which reads
//! only RBAC rules, these reviews ask every authorizer the API server runs.
//! Answers are cached per (user, uid, groups, extra, namespace, role and its
//! resourceVersion) for at most [`CACHE_TTL`]; a check that does not finish within
//! the deadline is refused and not cached.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, PostParams};

/// How long an answer is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(60);
/// Reviews in flight at once for one check.
const CONCURRENCY: usize = 64;
/// Checks under way at once (more wait): forged reviews cannot make the writer flood
/// the API server.
pub const MAX_CHECKS: usize = 16;
/// Most answers kept (beyond it, new answers are not cached).
pub const MAX_CACHED: usize = 10_000;
/// Most missing permissions named in a refusal.
const NAMED: usize = 5;

/// One permission, as a SubjectAccessReview asks it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Permission {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: Option<String>,
    pub name: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(sub) = &self.subresource {
            write!(f, "/{sub}")?;
        }
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(name) = &self.name {
            write!(f, " named {name:?}")?;
        }
        Ok(())
    }
}

/// Every permission a ClusterRole's rules grant in a namespace (rules of
/// non-resource URLs grant nothing through a RoleBinding). Wildcards stay `*`:
/// only someone holding the wildcard holds them.
pub fn permissions(role: &ClusterRole) -> Vec<Permission> {
    let mut out = Vec::new();
    for rule in role.rules.iter().flatten() {
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        let names: Vec<Option<String>> = match &rule.resource_names {
            Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for verb in &rule.verbs {
            for group in &groups {
                for resource in &resources {
                    let (resource, subresource) = match resource.split_once('/') {
                        Some((r, s)) => (r.to_owned(), Some(s.to_owned())),
                        None => (resource.clone(), None),
                    };
                    for name in &names {
                        out.push(Permission {
                            verb: verb.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            subresource: subresource.clone(),
                            name: name.clone(),
                        });
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Why the requester may not grant the role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    user: String,
    uid: String,
    groups: Vec<String>,
    extra: Vec<(String, Vec<String>)>,
    namespace: String,
    role: String,
    role_version: String,
}

/// An answer and when it was given.
type Cached = (Instant, Result<(), Refusal>);

/// The checker, with its cache.
pub struct Escalation {
    kube: kube::Client,
    cache: Mutex<HashMap<CacheKey, Cached>>,
    checks: tokio::sync::Semaphore,
    pub deadline: Duration,
}

impl Escalation {
    pub fn new(kube: kube::Client) -> Escalation {
        Escalation {
            kube,
            cache: Mutex::new(HashMap::new()),
            checks: tokio::sync::Semaphore::new(MAX_CHECKS),
            deadline: Duration::from_secs(4),
        }
    }

    /// Whether `user` could bind `role` in `namespace` themselves.
    pub async fn may_grant(&self, user: &UserInfo, namespace: &str, role: &ClusterRole) -> Result<(), Refusal> {
        let role_name = role.metadata.name.clone().unwrap_or_default();
        let mut groups = user.groups.clone().unwrap_or_default();
        groups.sort();
        let extra: Vec<(String, Vec<String>)> = user.extra.clone().unwrap_or_default().into_iter().collect();
        let key = CacheKey {
            user: user.username.clone().unwrap_or_default(),
            uid: user.uid.clone().unwrap_or_default(),
            groups,
            extra,
            namespace: namespace.to_owned(),
            role: role_name.clone(),
            role_version: role.metadata.resource_version.clone().unwrap_or_default(),
        };
        if let Some(answer) = self.cached(&key) {
            return answer;
        }
        let check = async {
            let _permit = self.checks.acquire().await;
            self.ask(user, namespace, role, &role_name).await
        };
        let answer = match tokio::time::timeout(self.deadline, check).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(error)) => {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "a SubjectAccessReview failed");
                return Err(Refusal("the GitOps service could not check your permissions now; try again".to_owned()));
            }
            Err(_) => {
                return Err(Refusal(
                    "the GitOps service could not check your permissions in time; try again".to_owned(),
                ));
            }
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        cache.retain(|_, (at, _)| now.duration_since(*at) < CACHE_TTL);
        if cache.len() < MAX_CACHED {
            cache.insert(key, (now, answer.clone()));
        }
        answer
    }

    fn cached(&self, key: &CacheKey) -> Option<Result<(), Refusal>> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(key).filter(|(at, _)| at.elapsed() < CACHE_TTL).map(|(_, answer)| answer.clone())
    }

    async fn ask(
        &self,
        user: &UserInfo,
        namespace: &str,
        role: &ClusterRole,
        role_name: &str,
    ) -> Result<Result<(), Refusal>, kube::Error> {
        let bind = Permission {
            verb: "bind".to_owned(),
            group: "rbac.authorization.k8s.io".to_owned(),
            resource: "clusterroles".to_owned(),
            subresource: None,
            name: Some(role_name.to_owned()),
        };
        if self.allowed(user, namespace, &bind).await? {
            return Ok(Ok(()));
        }
        let wanted = permissions(role);
        let answers: Vec<Result<(Permission, bool), kube::Error>> = futures_util::stream::iter(wanted)
            .map(|permission| async move {
                let allowed = self.allowed(user, namespace, &permission).await?;
                Ok((permission, allowed))
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut missing = Vec::new();
        for answer in answers {
            let (permission, allowed) = answer?;
            if !allowed {
                missing.push(permission);
            }
        }
        if missing.is_empty() {
            return Ok(Ok(()));
        }
        missing.sort();
        let named: Vec<String> = missing.iter().take(NAMED).map(ToString::to_string).collect();
        let more = missing.len().saturating_sub(NAMED);
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        Ok(Err(Refusal(format!(
            "deploying into namespace {namespace:?} acts with the ClusterRole {role_name:?} there, which you may not grant: \
             you hold neither bind on clusterroles/{role_name} nor all of its permissions (missing: {}{tail})",
            named.join(", ")
        ))))
    }

    async fn allowed(&self, user: &UserInfo, namespace: &str, permission: &Permission) -> Result<bool, kube::Error> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                uid: user.uid.clone(),
                groups: user.groups.clone(),
                extra: user.extra.clone().map(|extra| extra.into_iter().collect::<BTreeMap<_, _>>()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_owned()),
                    verb: Some(permission.verb.clone()),
                    group: Some(permission.group.clone()),
                    resource: Some(permission.resource.clone()),
                    subresource: permission.subresource.clone(),
                    name: permission.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.kube.clone());
        let answer = api.create(&PostParams::default(), &review).await?;
        Ok(answer.status.is_some_and(|status| status.allowed))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::rbac::v1::PolicyRule;

    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        let strings = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            resource_names: (!names.is_empty()).then(|| strings(names)),
            non_resource_urls: None,
        }
    }

    #[test]
    fn rules_expand_into_single_permissions() {
        let role = ClusterRole {
            rules: Some(vec![
                rule(&["", "apps"], &["pods", "deployments/scale"], &["get", "list"], &[]),
                rule(&[""], &["configmaps"], &["update"], &["a", "b"]),
                rule(&["*"], &["*"], &["*"], &[]),
                PolicyRule {
                    non_resource_urls: Some(vec!["/metrics".into()]),
                    verbs: vec!["get".into()],
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let all = permissions(&role);
        // 2 verbs × 2 groups × 2 resources, 1 × 1 × 1 × 2 names, and the wildcard; no URL.
        assert_eq!(all.len(), 8 + 2 + 1);
        let scale =
            all.iter().find(|p| p.subresource.as_deref() == Some("scale") && p.group == "apps" && p.verb == "get");
        assert_eq!(scale.map(|p| p.resource.as_str()), Some("deployments"));
        assert!(all.iter().any(|p| p.name.as_deref() == Some("b") && p.verb == "update"));
        assert!(all.iter().any(|p| p.verb == "*" && p.group == "*" && p.resource == "*"));
        assert_eq!(
            all.iter().find(|p| p.name.is_some()).map(ToString::to_string).as_deref(),
            Some("update configmaps named \"a\"")
        );
    }
}
