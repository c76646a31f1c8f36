//! Who is a tenant. The operator decides which namespaces the service serves (a label
//! selector and/or name patterns); some namespaces are never served whatever the
//! selector says: `kube-*`, `default`, the namespaces the service's own components run
//! in, every engine instance's namespace, and any the operator adds. The writer asks
//! [`NamespacePolicy::serves`] before it writes anything for a namespace; the agent
//! asks [`Reserved::reserves`] before it points Argo CD at a namespace of the home
//! cluster, whatever the rows say.
//!
//! Plain strings in and out (no Kubernetes types), so both halves share one answer.

use std::collections::{BTreeMap, BTreeSet};

/// Namespaces that are never tenants, before the operator adds any.
pub const ALWAYS_RESERVED: &[&str] = &["kube-*", "default"];

/// Why a namespace is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotServed {
    /// A reserved namespace (`kube-*`, `default`, the service's, an engine's, or one
    /// the operator listed); the text says which rule.
    Reserved(String),
    /// Outside the operator's tenant selection (selector or name patterns).
    NotSelected,
}

impl NotServed {
    /// The condition reason a tenant resource in such a namespace gets.
    pub fn reason(&self) -> &'static str {
        match self {
            NotServed::Reserved(_) => REASON_NAMESPACE_RESERVED,
            NotServed::NotSelected => REASON_NAMESPACE_NOT_SERVED,
        }
    }

    /// A message for the tenant (names no other tenant or internal detail beyond the rule).
    pub fn message(&self, namespace: &str) -> String {
        match self {
            NotServed::Reserved(why) => {
                format!("namespace {namespace:?} is reserved ({why}) and is never served by the GitOps service")
            }
            NotServed::NotSelected => format!(
                "namespace {namespace:?} is not one of the GitOps service's tenant namespaces; ask the operator to select it"
            ),
        }
    }
}

pub const REASON_NAMESPACE_NOT_SERVED: &str = "NamespaceNotServed";
pub const REASON_NAMESPACE_RESERVED: &str = "NamespaceReserved";

/// A shell-style name pattern: `*` matches any run of characters (also none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamePattern(String);

impl NamePattern {
    pub fn new(pattern: impl Into<String>) -> NamePattern {
        NamePattern(pattern.into())
    }

    pub fn matches(&self, name: &str) -> bool {
        glob(self.0.as_bytes(), name.as_bytes())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for NamePattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let valid = !text.is_empty()
            && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'*');
        if valid {
            Ok(NamePattern(text.to_owned()))
        } else {
            Err(format!("{text:?} is not a namespace name pattern (a-z, 0-9, '-' and '*')"))
        }
    }
}

impl std::fmt::Display for NamePattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| glob(rest, &name[skip..])),
        Some((first, rest)) => name.split_first().is_some_and(|(n, tail)| n == first && glob(rest, tail)),
    }
}

/// One requirement of a label selector, as `kubectl get -l` writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A Kubernetes label selector in its string form (`tenant=true,env in (a,b),!legacy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelSelector {
    text: String,
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => labels.get(key) == Some(value),
            Requirement::NotEquals(key, value) => labels.get(key) != Some(value),
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::DoesNotExist(key) => !labels.contains_key(key),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements
                .push(requirement(part).ok_or_else(|| format!("{part:?} is not a label selector requirement"))?);
        }
        if requirements.is_empty() {
            return Err("an empty label selector selects every namespace; leave the setting unset instead".to_owned());
        }
        Ok(LabelSelector { text: text.trim().to_owned(), requirements })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn label_key(key: &str) -> Option<String> {
    let key = key.trim();
    let valid = !key.is_empty()
        && key.len() <= 316
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'));
    valid.then(|| key.to_owned())
}

fn label_value(value: &str) -> Option<String> {
    let value = value.trim();
    let valid =
        value.len() <= 63 && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    valid.then(|| value.to_owned())
}

fn requirement(part: &str) -> Option<Requirement> {
    if let Some(key) = part.strip_prefix('!') {
        return label_key(key).map(Requirement::DoesNotExist);
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Some(Requirement::NotEquals(label_key(key)?, label_value(value)?));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Some(Requirement::Equals(label_key(key)?, label_value(value)?));
    }
    let set = |rest: &str| -> Option<BTreeSet<String>> {
        let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
        inner.split(',').map(label_value).collect()
    };
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    match words.as_slice() {
        [key] => label_key(key).map(Requirement::Exists),
        [key, rest] => {
            let rest = rest.trim_start();
            if let Some(values) = rest.strip_prefix("notin") {
                Some(Requirement::NotIn(label_key(key)?, set(values)?))
            } else if let Some(values) = rest.strip_prefix("in") {
                Some(Requirement::In(label_key(key)?, set(values)?))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The namespaces never served: built-in patterns, the service's own namespaces, the
/// operator's additions and the engine instances' namespaces (read from the database).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserved {
    /// The service's own namespaces (writer, agents, home identities).
    pub service: BTreeSet<String>,
    /// The operator's additions.
    pub extra: Vec<NamePattern>,
    /// Every registered engine instance's (Argo CD's) namespace.
    pub engines: BTreeSet<String>,
}

impl Reserved {
    /// Why `namespace` is reserved, or None.
    pub fn reserves(&self, namespace: &str) -> Option<String> {
        if let Some(pattern) = ALWAYS_RESERVED.iter().find(|p| NamePattern::new(**p).matches(namespace)) {
            return Some(format!("matches {pattern}"));
        }
        if self.service.contains(namespace) {
            return Some("the GitOps service runs there".to_owned());
        }
        if self.engines.contains(namespace) {
            return Some("an Argo CD instance of the service runs there".to_owned());
        }
        self.extra.iter().find(|p| p.matches(namespace)).map(|p| format!("the operator reserved {p}"))
    }
}

/// Which namespaces the service serves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespacePolicy {
    /// Serve only namespaces whose labels match (None: any labels).
    pub selector: Option<LabelSelector>,
    /// Serve only namespaces whose name matches one of these (empty: any name).
    pub patterns: Vec<NamePattern>,
    pub reserved: Reserved,
}

impl NamespacePolicy {
    /// Whether the service serves `namespace`, whose labels are `labels`; reserved
    /// namespaces are refused first, whatever the selection says.
    pub fn serves(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Result<(), NotServed> {
        if let Some(why) = self.reserved.reserves(namespace) {
            return Err(NotServed::Reserved(why));
        }
        if !self.patterns.is_empty() && !self.patterns.iter().any(|p| p.matches(namespace)) {
            return Err(NotServed::NotSelected);
        }
        if self.selector.as_ref().is_some_and(|s| !s.matches(labels)) {
            return Err(NotServed::NotSelected);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn patterns_match_like_a_shell_glob() {
        let p: NamePattern = "team-*".parse().expect("pattern");
        assert!(p.matches("team-a") && p.matches("team-") && !p.matches("teams") && !p.matches("xteam-a"));
        assert!(NamePattern::new("*-prod").matches("a-prod") && !NamePattern::new("*-prod").matches("a-prod2"));
        assert!(NamePattern::new("a*b*c").matches("abc") && NamePattern::new("a*b*c").matches("a-b-x-c"));
        assert!("Team".parse::<NamePattern>().is_err() && "".parse::<NamePattern>().is_err());
    }

    #[test]
    fn selectors_read_like_kubectl() {
        let s: LabelSelector =
            "gitops.io/tenant=true, tier in (a, b),!legacy,env!=prod,owner".parse().expect("selector");
        assert!(s.matches(&labels(&[("gitops.io/tenant", "true"), ("tier", "a"), ("owner", "x")])));
        assert!(!s.matches(&labels(&[("gitops.io/tenant", "true"), ("tier", "c"), ("owner", "x")])));
        assert!(!s.matches(&labels(&[("gitops.io/tenant", "true"), ("tier", "a"), ("owner", "x"), ("legacy", "")])));
        assert!(!s.matches(&labels(&[("gitops.io/tenant", "true"), ("tier", "b"), ("owner", "x"), ("env", "prod")])));
        assert!(!s.matches(&labels(&[("gitops.io/tenant", "true"), ("tier", "b")])));
        let notin: LabelSelector = "env notin (prod)".parse().expect("notin");
        assert!(notin.matches(&labels(&[])) && !notin.matches(&labels(&[("env", "prod")])));
        assert!("".parse::<LabelSelector>().is_err());
        assert!("a in b".parse::<LabelSelector>().is_err());
        assert!("a=b c".parse::<LabelSelector>().is_err());
    }

    #[test]
    fn reserved_namespaces_win_over_the_selection() {
        let policy = NamespacePolicy {
            selector: Some("tenant=yes".parse().expect("selector")),
            patterns: vec![],
            reserved: Reserved {
                service: BTreeSet::from(["gitops".to_owned()]),
                extra: vec!["infra-*".parse().expect("pattern")],
                engines: BTreeSet::from(["argocd".to_owned()]),
            },
        };
        let tenant = labels(&[("tenant", "yes")]);
        for ns in ["kube-system", "kube-public", "default", "gitops", "argocd", "infra-db"] {
            assert_eq!(policy.serves(ns, &tenant).map_err(|e| e.reason()), Err(REASON_NAMESPACE_RESERVED), "{ns}");
        }
        assert_eq!(policy.serves("team-a", &tenant), Ok(()));
        assert_eq!(policy.serves("team-a", &labels(&[])), Err(NotServed::NotSelected));
        assert!(policy.serves("kubernetes", &tenant).is_ok(), "only kube-* is reserved, not every kube prefix");
    }

    #[test]
    fn name_patterns_select_too() {
        let policy = NamespacePolicy { patterns: vec!["team-*".parse().expect("p")], ..Default::default() };
        assert!(policy.serves("team-a", &labels(&[])).is_ok());
        assert_eq!(policy.serves("other", &labels(&[])), Err(NotServed::NotSelected));
        assert_eq!(NamespacePolicy::default().serves("anything", &labels(&[])), Ok(()));
    }
}
