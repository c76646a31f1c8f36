//! Branch heads a test can move. The stand-in has no Git: a branch resolves to a
//! made-up commit (see `revision`) that never changes, so nothing could be tested
//! about a deployment reaching a *new* commit. A test playing whoever pushes to the
//! repository (the repository generator) sets the head of a branch instead, with a
//! ConfigMap in the stand-in's namespace labelled [`HEAD_LABEL`] whose data says
//! `url` (the repository, compared normalised), `branch` (an Application's
//! `targetRevision`; empty: `HEAD`) and `commit` (40 hex digits). Changing `commit`
//! is a push: the Applications tracking that repository and branch resolve it to
//! the new commit, so automated ones sync again and manual ones go `OutOfSync`
//! until synced. Without such a ConfigMap everything resolves as before.
//!
//! A ConfigMap rather than an annotation: a head belongs to a repository, not to
//! one Application (the agent owns those), and a labelled ConfigMap is watched the
//! same way on the emulator and on any API server. Heads are listed once and reused
//! until one of them changes, as repository Secrets are (see `repository`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tracing::warn;

use super::project::normalize_repo_url;
use super::revision::{fake_revision, is_commit_sha};

/// The label a head's ConfigMap carries (any value); also its list selector.
pub const HEAD_LABEL: &str = "standin.gitops.test/head";
/// The branch a head without `branch` moves, as Argo CD defaults `targetRevision`.
const DEFAULT_BRANCH: &str = "HEAD";
/// The field manager of [`push`].
const PUSH_MANAGER: &str = "standin-head";

/// One branch head, read from its ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// `url`, normalised.
    pub url: String,
    pub branch: String,
    /// `commit`, lower-cased.
    pub commit: String,
}

impl Head {
    /// Reads a head's ConfigMap; Err says why it is ignored.
    pub fn from_config_map(config_map: &ConfigMap) -> Result<Head, String> {
        let data = config_map.data.clone().unwrap_or_default();
        let text = |key: &str| data.get(key).map(|value| value.trim().to_owned()).filter(|value| !value.is_empty());
        let url = text("url").ok_or("no `url`")?;
        let commit = text("commit").ok_or("no `commit`")?;
        if !is_commit_sha(&commit) {
            return Err(format!("`commit` {commit:?} is not 40 hex digits"));
        }
        Ok(Head {
            url: normalize_repo_url(&url),
            branch: text("branch").unwrap_or_else(|| DEFAULT_BRANCH.to_owned()),
            commit: commit.to_ascii_lowercase(),
        })
    }
}

/// The heads of one namespace, by (normalised repository, branch).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Heads {
    by_branch: BTreeMap<(String, String), String>,
}

impl Heads {
    /// No heads: every branch resolves to its made-up commit.
    #[cfg(test)]
    pub const NONE: Heads = Heads { by_branch: BTreeMap::new() };

    /// The heads of `heads`, in order: of two for the same branch the first wins.
    pub fn new(heads: impl IntoIterator<Item = Head>) -> Self {
        let mut by_branch = BTreeMap::new();
        for head in heads {
            by_branch.entry((head.url, head.branch)).or_insert(head.commit);
        }
        Heads { by_branch }
    }

    /// The commit `branch` of `repo_url` is at, when a test set it.
    pub fn head(&self, repo_url: &str, branch: &str) -> Option<&str> {
        self.by_branch.get(&(normalize_repo_url(repo_url), branch.to_owned())).map(String::as_str)
    }

    /// The commit Argo CD would resolve `revision` of `repo_url`/`path` to: a commit
    /// SHA is itself, a branch with a head is at its head, anything else is made up
    /// (see `fake_revision`).
    pub fn resolve(&self, repo_url: &str, path: &str, revision: &str) -> String {
        match self.head(repo_url, revision) {
            Some(commit) if !is_commit_sha(revision) => commit.to_owned(),
            _ => fake_revision(repo_url, path, revision),
        }
    }
}

/// The heads' ConfigMaps of one namespace, listed when they changed.
pub struct HeadStore {
    api: Api<ConfigMap>,
    changes: AtomicU64,
    listed: Mutex<Option<(u64, Arc<Heads>)>>,
}

impl HeadStore {
    pub fn new(api: Api<ConfigMap>) -> Self {
        HeadStore { api, changes: AtomicU64::new(0), listed: Mutex::new(None) }
    }

    /// A head's ConfigMap changed: the next read lists them again.
    pub fn touched(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The heads as of the last change seen. ConfigMaps that say no head are
    /// skipped with a warning.
    pub async fn current(&self) -> Result<Arc<Heads>, kube::Error> {
        let changes = self.changes.load(Ordering::SeqCst);
        if let Some((at, listed)) = self.listed.lock().ok().and_then(|listed| listed.clone())
            && at == changes
        {
            return Ok(listed);
        }
        let mut config_maps = self.api.list(&ListParams::default().labels(HEAD_LABEL)).await?.items;
        config_maps.sort_by_key(ResourceExt::name_any);
        let heads = config_maps.iter().filter_map(|config_map| match Head::from_config_map(config_map) {
            Ok(head) => Some(head),
            Err(reason) => {
                warn!(config_map = %config_map.name_any(), %reason, "ignoring a branch head ConfigMap");
                None
            }
        });
        let listed = Arc::new(Heads::new(heads));
        if let Ok(mut slot) = self.listed.lock() {
            *slot = Some((changes, listed.clone()));
        }
        Ok(listed)
    }
}

/// The name of the ConfigMap [`push`] keeps for `branch` of `repo_url`.
pub fn head_name(repo_url: &str, branch: &str) -> String {
    let url = normalize_repo_url(repo_url);
    format!("head-{}", &fake_revision(&url, "\u{0}head", &format!("{branch}\u{0}"))[..20])
}

/// Moves `branch` of `repo_url` to `commit` for the stand-in serving `namespace`,
/// as a push would: server-side applies the head's ConfigMap ([`head_name`]).
pub async fn push(
    client: &Client,
    namespace: &str,
    repo_url: &str,
    branch: &str,
    commit: &str,
) -> Result<ConfigMap, kube::Error> {
    let name = head_name(repo_url, branch);
    let config_map = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {HEAD_LABEL: "true"}},
        "data": {"url": repo_url, "branch": branch, "commit": commit},
    });
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(&name, &PatchParams::apply(PUSH_MANAGER).force(), &Patch::Apply(config_map))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPO: &str = "https://git.example.invalid/team/gitops.git";
    const X: &str = "1111111111111111111111111111111111111111";
    const Y: &str = "2222222222222222222222222222222222222222";

    fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {HEAD_LABEL: "true"}},
            "data": data.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
        }))
        .expect("a ConfigMap")
    }

    #[test]
    fn reads_a_head_and_refuses_what_is_not_one() {
        let head = Head::from_config_map(&config_map(
            "h",
            &[("url", "HTTPS://git.example.invalid/team/gitops/"), ("branch", "main"), ("commit", &X.to_uppercase())],
        ))
        .expect("a head");
        assert_eq!(head, Head { url: normalize_repo_url(REPO), branch: "main".into(), commit: X.into() });
        let default = Head::from_config_map(&config_map("h", &[("url", REPO), ("commit", X)])).expect("a head");
        assert_eq!(default.branch, "HEAD");
        for (data, why) in [
            (vec![("commit", X)], "no `url`"),
            (vec![("url", REPO)], "no `commit`"),
            (vec![("url", REPO), ("commit", "main")], "not 40 hex digits"),
        ] {
            let refused = Head::from_config_map(&config_map("h", &data)).expect_err("not a head");
            assert!(refused.contains(why), "{refused}");
        }
    }

    #[test]
    fn a_head_moves_its_branch_only() {
        let none = Heads::default();
        assert_eq!(none.resolve(REPO, "apps/web", "main"), fake_revision(REPO, "apps/web", "main"), "as without heads");
        let head = |branch: &str, commit: &str| Head {
            url: normalize_repo_url(REPO),
            branch: branch.into(),
            commit: commit.into(),
        };
        let heads = Heads::new([head("main", X)]);
        // Every path of the repository is at the branch's commit, as in Git.
        assert_eq!(heads.resolve(REPO, "apps/web", "main"), X);
        assert_eq!(heads.resolve("https://git.example.invalid/team/gitops", "apps/api", "main"), X);
        assert_eq!(heads.resolve(REPO, "apps/web", "v2"), fake_revision(REPO, "apps/web", "v2"), "another branch");
        let other = "https://git.example.invalid/team/other.git";
        assert_eq!(heads.resolve(other, "apps/web", "main"), fake_revision(other, "apps/web", "main"));
        assert_eq!(heads.resolve(REPO, "apps/web", Y), Y, "a commit is itself");
        assert_eq!(Heads::new([head("main", X), head("main", Y)]).head(REPO, "main"), Some(X), "the first wins");
    }

    #[test]
    fn head_names_are_per_repository_and_branch() {
        let name = head_name(REPO, "main");
        assert!(name.starts_with("head-") && name.len() == 25, "{name}");
        assert_eq!(name, head_name("https://git.example.invalid/team/gitops", "main"), "normalised");
        assert_ne!(name, head_name(REPO, "v2"));
        assert_ne!(name, head_name("https://git.example.invalid/team/other", "main"));
    }
}
