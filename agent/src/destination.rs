//! Defence in depth for destinations: whatever the rows say, the agent never points
//! Argo CD at a reserved or engine namespace of the home cluster. Tenants are
//! hostile and rows can be wrong (a bug in the writer, a hand-edited database), and
//! an Application there could take over, or on deletion prune, what runs the
//! cluster. The writer refuses such namespaces first; this is the second check.
//!
//! A destination is *on the home cluster* when its environment is the tenant's home
//! environment (the `home` row flag) or its API URL is one of the home cluster's
//! URLs (compared after [`normalise_api_url`]; a URL that cannot be read counts as
//! home). It is *forbidden* there when its namespace is reserved
//! ([`Reserved`]: `kube-*`, `default`, the service's namespaces, the operator's
//! patterns and every registered engine instance's namespace) or empty. Environments
//! of a tenant pointing at another cluster are not limited by namespace name.
//!
//! [`DestinationPolicy`] is the pure decision, unit-tested here; [`DestinationGuard`]
//! builds one per reconcile (engine namespaces read from the database, cached
//! briefly) and makes each refusal visible: a counter by kind and a warning.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gitops_shared::db::engine_instance::engine_instance_namespaces;
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::model::TenantId;
use gitops_shared::tenancy::{NamePattern, Reserved};

use crate::metrics::Metrics;

/// The cluster Argo CD runs in, as it names it from inside: always home.
pub const IN_CLUSTER_API_URLS: &[&str] =
    &["https://kubernetes.default.svc", "https://kubernetes.default.svc.cluster.local", "https://kubernetes.default"];

/// How long the engine instances' namespaces are reused before they are read again.
pub const ENGINE_NAMESPACES_FOR: Duration = Duration::from_secs(30);

/// `url` in the form home URLs are compared in: scheme and host in lower case, the
/// port always present (443 for https, 80 for http), user info, query and fragment
/// dropped, a trailing dot of the host and trailing slashes of the path removed.
/// None when it is not such a URL (no scheme or host, a percent-escaped host, a
/// port that is not a number): callers treat that as the home cluster.
pub fn normalise_api_url(url: &str) -> Option<String> {
    let (scheme, rest) = url.trim().split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        _ => return None,
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let path = &tail[..tail.find(['?', '#']).unwrap_or(tail.len())];
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        (format!("[{}]", host.to_ascii_lowercase()), after.strip_prefix(':'))
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host.to_ascii_lowercase(), Some(port)),
            None => (host_port.to_ascii_lowercase(), None),
        }
    };
    let host = host.strip_suffix('.').unwrap_or(&host).to_owned();
    let name = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    let valid = match name {
        Some(ip) => !ip.is_empty() && ip.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.'),
        None => !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'),
    };
    if !valid {
        return None;
    }
    let port: u16 = match port {
        None | Some("") => default_port,
        Some(digits) => digits.parse().ok()?,
    };
    Some(format!("{scheme}://{host}:{port}{}", path.trim_end_matches('/')))
}

/// The home cluster's API URLs, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeClusters(BTreeSet<String>);

impl HomeClusters {
    /// The in-cluster URLs plus `extra` (those that cannot be read are refused).
    pub fn new<'a>(extra: impl IntoIterator<Item = &'a str>) -> Result<HomeClusters, String> {
        let mut urls = BTreeSet::new();
        for url in IN_CLUSTER_API_URLS.iter().copied().chain(extra) {
            urls.insert(normalise_api_url(url).ok_or_else(|| format!("{url:?} is not an http(s) API server URL"))?);
        }
        Ok(HomeClusters(urls))
    }

    /// Whether `api_url` reaches the home cluster (an unreadable URL does, to be safe).
    pub fn contains(&self, api_url: &str) -> bool {
        normalise_api_url(api_url).is_none_or(|url| self.0.contains(&url))
    }
}

impl Default for HomeClusters {
    fn default() -> Self {
        HomeClusters(IN_CLUSTER_API_URLS.iter().filter_map(|url| normalise_api_url(url)).collect())
    }
}

/// Parses one `--home-api-url` value.
pub fn parse_home_api_url(text: &str) -> Result<String, String> {
    let text = text.trim();
    normalise_api_url(text).map(|_| text.to_owned()).ok_or_else(|| format!("{text:?} is not an http(s) API server URL"))
}

/// The pure decision, for one moment's reserved namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    pub home: HomeClusters,
    pub reserved: Reserved,
}

impl DestinationPolicy {
    /// Whether an environment (flagged `home`, reached at `api_url`) is on the home cluster.
    pub fn on_home_cluster(&self, home: bool, api_url: &str) -> bool {
        home || self.home.contains(api_url)
    }

    /// Why the agent must not point Argo CD at `namespace` through that
    /// environment, or None when it may.
    pub fn refusal(&self, home: bool, api_url: &str, namespace: &str) -> Option<String> {
        if !self.on_home_cluster(home, api_url) {
            return None;
        }
        self.forbidden_namespace(namespace)
    }

    /// Why `namespace` is never a destination on the home cluster, or None.
    pub fn forbidden_namespace(&self, namespace: &str) -> Option<String> {
        if namespace.is_empty() {
            return Some("no namespace given (the manifests would choose)".to_owned());
        }
        self.reserved.reserves(namespace)
    }
}

/// What was refused (the `kind` label of `gitops_agent_destinations_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedKind {
    Application,
    ProjectDestination,
    ClusterSecret,
}

impl RefusedKind {
    pub const ALL: [RefusedKind; 3] =
        [RefusedKind::Application, RefusedKind::ProjectDestination, RefusedKind::ClusterSecret];

    pub fn as_str(self) -> &'static str {
        match self {
            RefusedKind::Application => "application",
            RefusedKind::ProjectDestination => "project_destination",
            RefusedKind::ClusterSecret => "cluster_secret",
        }
    }
}

/// The operator's settings (`--home-api-url`, `--service-namespaces`,
/// `--reserved-namespaces`). The in-cluster URLs are home whatever is set here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationConfig {
    /// Further URLs of the home cluster (its external name, its API server's IPs).
    pub home_api_urls: Vec<String>,
    /// Namespaces the service's own components run in.
    pub service_namespaces: BTreeSet<String>,
    /// The operator's patterns of namespaces that are never destinations.
    pub reserved_namespaces: Vec<NamePattern>,
}

/// Builds policies with fresh engine namespaces and reports refusals.
#[derive(Debug)]
pub struct DestinationGuard {
    home: HomeClusters,
    service: BTreeSet<String>,
    extra: Vec<NamePattern>,
    /// The served instance's namespace: reserved even when the database cannot say.
    own_engine_namespace: String,
    engines: Mutex<Option<(Instant, BTreeSet<String>)>>,
    metrics: Arc<Metrics>,
}

impl DestinationGuard {
    /// Refuses home URLs that cannot be read.
    pub fn new(config: &DestinationConfig, own_engine_namespace: &str, metrics: Arc<Metrics>) -> Result<Self, String> {
        Ok(DestinationGuard {
            home: HomeClusters::new(config.home_api_urls.iter().map(String::as_str))?,
            service: config.service_namespaces.clone(),
            extra: config.reserved_namespaces.clone(),
            own_engine_namespace: own_engine_namespace.to_owned(),
            engines: Mutex::new(None),
            metrics,
        })
    }

    /// The in-cluster URLs as the home cluster, nothing else reserved beyond the
    /// built-in rules and the engines' namespaces.
    /// The metrics it counts into (the agent's).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn with_defaults(own_engine_namespace: &str, metrics: Arc<Metrics>) -> Self {
        DestinationGuard {
            home: HomeClusters::default(),
            service: BTreeSet::new(),
            extra: Vec::new(),
            own_engine_namespace: own_engine_namespace.to_owned(),
            engines: Mutex::new(None),
            metrics,
        }
    }

    /// The policy as of now: engine namespaces from the database (read at most every
    /// [`ENGINE_NAMESPACES_FOR`]).
    pub async fn policy(&self, pool: &DbPool) -> Result<DestinationPolicy, DbError> {
        let cached = self.engines.lock().ok().and_then(|guard| {
            guard.as_ref().filter(|(at, _)| at.elapsed() < ENGINE_NAMESPACES_FOR).map(|(_, ns)| ns.clone())
        });
        let mut engines = match cached {
            Some(namespaces) => namespaces,
            None => {
                let client = pooled(pool).await?;
                let namespaces = engine_instance_namespaces(&client).await?;
                if let Ok(mut guard) = self.engines.lock() {
                    *guard = Some((Instant::now(), namespaces.clone()));
                }
                namespaces
            }
        };
        engines.insert(self.own_engine_namespace.clone());
        let reserved = Reserved { service: self.service.clone(), extra: self.extra.clone(), engines };
        Ok(DestinationPolicy { home: self.home.clone(), reserved })
    }

    /// Counts and logs one refusal; `object` names what was refused (never a secret).
    /// `tenant` is None for an object whose tenant label is missing or unreadable.
    pub fn refused(&self, kind: RefusedKind, tenant: Option<TenantId>, namespace: &str, object: &str, why: &str) {
        self.metrics.destination_refused(kind);
        tracing::warn!(
            tenant.id = tenant.map(|t| t.0),
            destination.namespace = namespace,
            refused.kind = kind.as_str(),
            argocd.object = object,
            reason = why,
            "refused a destination on the home cluster in a reserved namespace"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_normalise_case_ports_and_slashes() {
        let same = [
            "https://kubernetes.default.svc",
            "HTTPS://Kubernetes.Default.SVC",
            "https://kubernetes.default.svc:443",
            "https://kubernetes.default.svc/",
            "https://kubernetes.default.svc.//",
            "https://user@kubernetes.default.svc:443/?managed-environment=3",
            " https://kubernetes.default.svc#x ",
        ];
        for url in same {
            assert_eq!(normalise_api_url(url).as_deref(), Some("https://kubernetes.default.svc:443"), "{url}");
        }
        assert_eq!(normalise_api_url("http://a.example.invalid").as_deref(), Some("http://a.example.invalid:80"));
        assert_eq!(
            normalise_api_url("https://a.example.invalid:6443/k8s/").as_deref(),
            Some("https://a.example.invalid:6443/k8s")
        );
        assert_eq!(normalise_api_url("https://[FD00::1]:6443").as_deref(), Some("https://[fd00::1]:6443"));
        for bad in
            ["kubernetes.default.svc", "ftp://a", "https://", "https://a:port", "https://kube%72netes.default.svc"]
        {
            assert_eq!(normalise_api_url(bad), None, "{bad}");
        }
    }

    #[test]
    fn home_clusters_include_the_in_cluster_names_and_unreadable_urls() {
        let home = HomeClusters::new(["https://api.home.example.invalid:6443/"]).expect("valid");
        assert!(home.contains("https://kubernetes.default.svc.cluster.local:443/"));
        assert!(home.contains("https://API.home.example.invalid:6443"));
        assert!(home.contains("not a url"), "an unreadable URL counts as home");
        assert!(!home.contains("https://api.home.example.invalid"), "another port is another server");
        assert!(!home.contains("https://other.example.invalid"));
        assert!(HomeClusters::new(["nonsense"]).is_err());
        assert_eq!(HomeClusters::default(), HomeClusters::new([]).expect("defaults"));
    }

    fn policy() -> DestinationPolicy {
        DestinationPolicy {
            home: HomeClusters::new(["https://api.home.example.invalid"]).expect("valid"),
            reserved: Reserved {
                service: BTreeSet::from(["gitops".to_owned()]),
                extra: vec!["infra-*".parse().expect("pattern")],
                engines: BTreeSet::from(["argocd-1".to_owned()]),
            },
        }
    }

    #[test]
    fn reserved_namespaces_of_the_home_cluster_are_refused() {
        let policy = policy();
        let remote = "https://cluster.example.invalid:6443";
        for namespace in ["kube-system", "default", "gitops", "infra-db", "argocd-1", ""] {
            assert!(policy.refusal(true, remote, namespace).is_some(), "home flag: {namespace:?}");
            assert!(
                policy.refusal(false, "https://kubernetes.default.svc/", namespace).is_some(),
                "in-cluster: {namespace:?}"
            );
            assert!(
                policy.refusal(false, "https://API.home.example.invalid:443", namespace).is_some(),
                "home URL: {namespace:?}"
            );
        }
        assert_eq!(policy.refusal(true, remote, "team-a"), None);
        assert_eq!(policy.refusal(false, "https://kubernetes.default.svc", "team-a"), None);
    }

    #[test]
    fn other_clusters_are_not_limited_by_namespace_name() {
        let policy = policy();
        for namespace in ["kube-system", "default", "argocd-1", "infra-db"] {
            assert_eq!(policy.refusal(false, "https://cluster.example.invalid:6443", namespace), None, "{namespace}");
        }
        assert!(policy.refusal(false, "garbage", "kube-system").is_some(), "an unreadable URL is treated as home");
    }
}
