//! Repository credentials as Argo CD hands them to an Application: a repository
//! Secret (label `argocd.argoproj.io/secret-type: repository`) whose `project` key
//! is set serves only Applications of that project; one without `project` serves
//! every project. The stand-in has no Git, so it takes a repository that some
//! repository Secret in its namespace names (by normalised URL) for a private one:
//! an Application of such a repository with no Secret of its own project (or a
//! global one) cannot read it, and its comparison fails as Argo CD's does when Git
//! asks for credentials it did not get. Repositories no Secret names are public.
//!
//! Secrets are listed once and reused until one of them changes: the controller's
//! watch on repository Secrets calls [`Repositories::touched`] before it wakes the
//! Applications concerned, so a reconcile never judges by a list older than the
//! change that woke it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::ListParams;

use super::project::normalize_repo_url;

/// The label Argo CD recognises its Secrets by, and its value for repositories.
pub const REPOSITORY_SELECTOR: &str = "argocd.argoproj.io/secret-type=repository";

/// One repository Secret as far as access goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryCredential {
    /// `url`, normalised.
    pub url: String,
    /// `project`; None (or empty) serves every project.
    pub project: Option<String>,
}

impl RepositoryCredential {
    /// Reads a repository Secret; None without a `url`.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let text = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .and_then(|value| String::from_utf8(value.0.clone()).ok())
                .or_else(|| secret.string_data.as_ref().and_then(|data| data.get(key)).cloned())
                .filter(|value| !value.trim().is_empty())
        };
        Some(RepositoryCredential { url: normalize_repo_url(&text("url")?), project: text("project") })
    }
}

/// Why an Application of `project` cannot read `repo_url` given `credentials`, in
/// Argo CD's words; None when it can (public, or a Secret serves its project).
pub fn source_error(credentials: &[RepositoryCredential], repo_url: &str, project: &str) -> Option<String> {
    let url = normalize_repo_url(repo_url);
    let mut naming = credentials.iter().filter(|c| c.url == url).peekable();
    naming.peek()?;
    if naming.any(|c| c.project.as_deref().is_none_or(|p| p == project)) {
        return None;
    }
    Some(format!(
        "Failed to load target state: failed to generate manifest for source 1 of 1: rpc error: code = Unknown \
         desc = failed to list refs: authentication required: repository {repo_url} has no credentials for \
         project '{project}'"
    ))
}

/// The repository Secrets of one namespace, listed when they changed.
pub struct Repositories {
    api: Api<Secret>,
    changes: AtomicU64,
    listed: Mutex<Option<(u64, Arc<Vec<RepositoryCredential>>)>>,
}

impl Repositories {
    pub fn new(api: Api<Secret>) -> Self {
        Repositories { api, changes: AtomicU64::new(0), listed: Mutex::new(None) }
    }

    /// A repository Secret changed: the next read lists them again.
    pub fn touched(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// The repository Secrets as of the last change seen.
    pub async fn current(&self) -> Result<Arc<Vec<RepositoryCredential>>, kube::Error> {
        let changes = self.changes.load(Ordering::SeqCst);
        if let Some((at, listed)) = self.listed.lock().ok().and_then(|listed| listed.clone())
            && at == changes
        {
            return Ok(listed);
        }
        let secrets = self.api.list(&ListParams::default().labels(REPOSITORY_SELECTOR)).await?;
        let listed = Arc::new(secrets.items.iter().filter_map(RepositoryCredential::from_secret).collect::<Vec<_>>());
        if let Ok(mut slot) = self.listed.lock() {
            *slot = Some((changes, listed.clone()));
        }
        Ok(listed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential(url: &str, project: Option<&str>) -> RepositoryCredential {
        RepositoryCredential { url: normalize_repo_url(url), project: project.map(str::to_owned) }
    }

    #[test]
    fn a_project_scoped_secret_serves_its_project_only() {
        let private = "https://git.example.invalid/team-a/private.git";
        let credentials = [credential(private, Some("tenant-a"))];
        assert_eq!(source_error(&credentials, private, "tenant-a"), None);
        assert_eq!(source_error(&credentials, "HTTPS://git.example.invalid/team-a/private/", "tenant-a"), None);
        let refused = source_error(&credentials, private, "tenant-b").expect("another project gets nothing");
        assert!(refused.contains("authentication required") && refused.contains("'tenant-b'"), "{refused}");
        assert_eq!(source_error(&credentials, "https://git.example.invalid/public", "tenant-b"), None);
        let global = [credential(private, Some("tenant-a")), credential(private, None)];
        assert_eq!(source_error(&global, private, "tenant-b"), None, "a Secret without project serves every project");
    }

    #[test]
    fn secrets_are_read_from_data_or_string_data() {
        use std::collections::BTreeMap;
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "url".to_owned(),
                k8s_openapi::ByteString(b"https://git.example.invalid/A.git".to_vec()),
            )])),
            string_data: Some(BTreeMap::from([("project".to_owned(), "p".to_owned())])),
            ..Secret::default()
        };
        assert_eq!(
            RepositoryCredential::from_secret(&secret),
            Some(credential("https://git.example.invalid/a", Some("p")))
        );
        assert_eq!(RepositoryCredential::from_secret(&Secret::default()), None);
    }
}
