//! The validation of a GitOpsDeploymentRepositoryCredential against its repository,
//! as `git ls-remote` would do it with the stored credentials (smart HTTPS with the
//! username and password, SSH with the private key), reported in the original
//! service's two conditions: `ValidRepositoryURL` (the repository exists and answers)
//! and `ValidRepositoryCredential` (it accepts the credentials).
//!
//! Off by default: the writer then contacts no repository and both conditions say
//! validation is disabled. When on (`--repository-check`), only repositories the
//! egress policy allows are contacted, through [`crate::controller::egress`]: the host
//! is resolved once, every address checked, and git is told the checked address
//! (`http.curloptResolve`; for SSH `HostName` with the URL's host as `HostKeyAlias`),
//! so it cannot resolve again. The check runs on every change of the resource or its
//! Secret and again every [`REVALIDATE_EVERY`]. The `git` command itself is run with
//! everything that could widen what it does turned off (see [`git`]).
//!
//! Tenant-facing messages are fixed texts; git's own output (which may name hosts and
//! paths, never the credentials) goes to the operator's log only.

mod git;
mod url;

use std::path::PathBuf;
use std::time::Duration;

use gitops_shared::db::credential::RepositoryCredentials;

pub use self::url::{RepositoryUrl, UrlError};
use super::connection::{ConnectionPolicy, Denial};
use super::egress::{self, Refusal};
use crate::api::Condition;

/// The condition: the repository exists and answers at the URL.
pub const URL_CONDITION: &str = "ValidRepositoryURL";
/// The condition: the repository accepts the credentials.
pub const CREDENTIAL_CONDITION: &str = "ValidRepositoryCredential";

/// The repository answered (the original's reason).
pub const REASON_VALID_URL: &str = "ValidRepositoryUrl";
/// The repository does not exist, or the URL cannot be used (the original's reason).
pub const REASON_INVALID_URL: &str = "InvalidRepositoryUrl";
/// The credentials were accepted (the original's reason).
pub const REASON_CREDENTIALS_UP_TO_DATE: &str = "RepositoryCredentialUpToDate";
/// The repository refused the credentials (the original's reason).
pub const REASON_INVALID_CREDENTIALS: &str = "InvalidCredentials";
/// Repository validation is off (the default); nothing was contacted.
pub const REASON_VALIDATION_DISABLED: &str = "ValidationDisabled";
/// The egress policy does not allow contacting the repository; nothing was contacted.
pub const REASON_VALIDATION_DENIED: &str = "ValidationDenied";
/// The repository server could not be reached, or the connection failed (TLS, host
/// key, timeout, redirect).
pub const REASON_CONNECTION_FAILED: &str = "ConnectionFailed";

/// How often a stored credential is validated again.
pub const REVALIDATE_EVERY: Duration = Duration::from_secs(600);
/// How long one validation may take.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// The operator's settings for repository validation.
#[derive(Debug, Clone)]
pub struct RepositoryCheckSettings {
    /// Whom the writer may contact (the egress lists).
    pub policy: ConnectionPolicy,
    /// OpenSSH known-hosts file for SSH repositories; without it none is contacted.
    pub known_hosts: Option<PathBuf>,
    /// PEM CA bundle trusted for HTTPS repositories instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// The `git` program.
    pub git: PathBuf,
    /// The `ssh` program.
    pub ssh: PathBuf,
    /// How often a stored credential is validated again ([`REVALIDATE_EVERY`]).
    pub revalidate_every: Duration,
    /// How long one validation may take before git is killed ([`CHECK_TIMEOUT`]).
    pub timeout: Duration,
}

impl RepositoryCheckSettings {
    pub fn new(policy: ConnectionPolicy) -> Self {
        RepositoryCheckSettings {
            policy,
            known_hosts: None,
            ca_file: None,
            git: PathBuf::from("git"),
            ssh: PathBuf::from("ssh"),
            revalidate_every: REVALIDATE_EVERY,
            timeout: CHECK_TIMEOUT,
        }
    }
}

/// What the validation found: both conditions, and for the operator's log what git
/// said (never shown to the tenant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validation {
    pub url: (&'static str, &'static str, String),
    pub credential: (&'static str, &'static str, String),
    pub detail: Option<String>,
}

impl Validation {
    fn both(status: &'static str, reason: &'static str, message: &str) -> Self {
        Validation {
            url: (status, reason, message.to_owned()),
            credential: (status, reason, message.to_owned()),
            detail: None,
        }
    }

    /// Nothing validated: the Secret holds no usable credentials.
    pub fn not_validated() -> Self {
        Validation::both(
            "Unknown",
            REASON_INVALID_CREDENTIALS,
            "the repository was not contacted: the Secret holds no usable credentials",
        )
    }

    /// The two conditions, for `generation`, at `now`.
    pub fn conditions(&self, generation: Option<i64>, now: &str) -> [Condition; 2] {
        let condition = |type_: &str, (status, reason, message): &(&str, &str, String)| Condition {
            type_: type_.to_owned(),
            status: (*status).to_owned(),
            reason: Some((*reason).to_owned()),
            message: Some(message.clone()),
            last_transition_time: Some(now.to_owned()),
            observed_generation: generation,
        };
        [condition(URL_CONDITION, &self.url), condition(CREDENTIAL_CONDITION, &self.credential)]
    }
}

/// Validates `credentials` against `repository`, if `settings` (`None`: off) allow
/// contacting it.
pub async fn validate(
    settings: Option<&RepositoryCheckSettings>,
    repository: &str,
    credentials: &RepositoryCredentials,
) -> Validation {
    let Some(settings) = settings else {
        return Validation::both(
            "Unknown",
            REASON_VALIDATION_DISABLED,
            "the writer does not contact repositories; repository validation is disabled",
        );
    };
    let url = match RepositoryUrl::parse(repository) {
        Ok(url) => url,
        Err(error) => {
            let mut validation = Validation::both("False", REASON_INVALID_URL, &error.to_string());
            validation.credential = ("Unknown", REASON_INVALID_URL, "the repository URL cannot be validated".into());
            return validation;
        }
    };
    if url.is_ssh() && settings.known_hosts.is_none() {
        return Validation::both(
            "Unknown",
            REASON_VALIDATION_DENIED,
            "the writer did not contact the repository: it has no known SSH host keys to verify servers with",
        );
    }
    if url.is_ssh() && credentials.ssh_private_key.is_none() {
        return Validation {
            url: ("Unknown", REASON_INVALID_CREDENTIALS, "the repository was not contacted".into()),
            credential: (
                "False",
                REASON_INVALID_CREDENTIALS,
                "the Secret holds no SSH private key, which an SSH repository needs".into(),
            ),
            detail: None,
        };
    }
    let checked = match egress::resolve(&settings.policy, url.host(), url.port()).await {
        Ok(checked) => checked,
        Err(Refusal::Denied(denial)) => {
            return Validation::both("Unknown", REASON_VALIDATION_DENIED, denial_message(denial));
        }
        Err(Refusal::Unresolved) => {
            return Validation::both(
                "Unknown",
                REASON_CONNECTION_FAILED,
                "the host name of the repository could not be resolved",
            );
        }
    };
    let run = git::ls_remote(settings, &url, &checked, credentials);
    match tokio::time::timeout(settings.timeout, run).await {
        Err(_) => Validation::both(
            "Unknown",
            REASON_CONNECTION_FAILED,
            &format!("the repository did not answer within {} seconds", settings.timeout.as_secs_f64()),
        ),
        Ok(Err(error)) => Validation {
            detail: Some(gitops_shared::telemetry::error_chain(&error)),
            ..Validation::both("Unknown", REASON_CONNECTION_FAILED, "the writer could not run git")
        },
        Ok(Ok(answer)) => classify(&url, answer),
    }
}

fn denial_message(denial: Denial) -> &'static str {
    match denial {
        Denial::Ambiguous => {
            "the writer did not contact the repository: its host is not a plain host name or IP address"
        }
        Denial::DenyListed => "the writer did not contact the repository: it is on the writer's egress deny list",
        Denial::NoAllowList => {
            "the writer did not contact the repository: the writer's egress allow list is empty, so no repository \
             is contacted"
        }
        Denial::NotAllowed => "the writer did not contact the repository: it is not on the writer's egress allow list",
        Denial::PrivateAddress => {
            "the writer did not contact the repository: its host is or resolves to a loopback, link-local, \
             metadata or private address that the writer's egress allow list does not name"
        }
    }
}

/// Reads git's exit status and its error output (fixed phrases of git, curl and
/// OpenSSH; the C locale is set).
fn classify(url: &RepositoryUrl, answer: git::Answer) -> Validation {
    let detail = Some(answer.stderr.clone());
    let with_detail = |validation: Validation| Validation { detail: detail.clone(), ..validation };
    if answer.success {
        return with_detail(Validation {
            url: ("True", REASON_VALID_URL, "the repository answered".into()),
            credential: ("True", REASON_CREDENTIALS_UP_TO_DATE, "the repository accepted the credentials".into()),
            detail: None,
        });
    }
    let said = |phrases: &[&str]| phrases.iter().any(|p| answer.stderr.contains(p));
    if said(&["Authentication failed", "could not read Username", "could not read Password", "Permission denied ("]) {
        return with_detail(Validation {
            url: (
                "Unknown",
                REASON_INVALID_CREDENTIALS,
                "the repository could not be read with the credentials".into(),
            ),
            credential: (
                "False",
                REASON_INVALID_CREDENTIALS,
                "the repository refused the credentials in the Secret".into(),
            ),
            detail: None,
        });
    }
    if said(&["' not found", "does not appear to be a git repository"]) {
        return with_detail(Validation::both("False", REASON_INVALID_URL, "the repository does not exist"));
    }
    let message = if said(&["Host key verification failed", "host key is known", "HOST IDENTIFICATION HAS CHANGED"]) {
        "the repository server's SSH host key is not in the writer's known hosts"
    } else if said(&["error: 301", "error: 302", "error: 303", "error: 307", "error: 308"]) {
        "the repository server answered with a redirect, which the writer does not follow"
    } else if said(&["Connection refused", "Failed to connect", "Couldn't connect"]) {
        "the repository server refused the connection or could not be reached"
    } else if said(&["timed out", "Timeout"]) {
        "the connection to the repository server timed out"
    } else if said(&["SSL", "certificate", "TLS", "ssl"]) {
        "the TLS handshake with the repository server failed"
    } else if url.is_ssh() {
        "the SSH connection to the repository server failed"
    } else {
        "the repository server could not be reached or did not answer like a Git server"
    };
    with_detail(Validation::both("Unknown", REASON_CONNECTION_FAILED, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn disabled_and_denied_validations_contact_nothing() {
        let credentials = RepositoryCredentials {
            username: Some("u".into()),
            password: Some("s3cret".into()),
            ssh_private_key: None,
        };
        let off = validate(None, "https://git.example.invalid/r.git", &credentials).await;
        assert_eq!((off.url.0, off.url.1), ("Unknown", REASON_VALIDATION_DISABLED));
        assert_eq!(off.credential.1, REASON_VALIDATION_DISABLED);
        let list = |l: &[&str]| l.iter().map(|p| p.parse().expect("pattern")).collect::<Vec<_>>();
        let deny = RepositoryCheckSettings::new(ConnectionPolicy::new(list(&["*"]), list(&["*.invalid"])));
        let denied = validate(Some(&deny), "https://git.example.invalid/r.git", &credentials).await;
        assert_eq!((denied.credential.0, denied.credential.1), ("Unknown", REASON_VALIDATION_DENIED));
        let open = RepositoryCheckSettings::new(ConnectionPolicy::new(list(&["*"]), vec![]));
        for private in ["https://127.0.0.1/r.git", "https://[::ffff:127.0.0.1]/r", "https://2130706433/r"] {
            let refused = validate(Some(&open), private, &credentials).await;
            assert_eq!(refused.url.1, REASON_VALIDATION_DENIED, "{private}");
        }
        let ssh = validate(Some(&open), "ssh://git@git.example.invalid/r.git", &credentials).await;
        assert!(ssh.url.2.contains("known SSH host keys"), "{ssh:?}");
        let bad = validate(Some(&open), "http://git.example.invalid/r.git", &credentials).await;
        assert_eq!((bad.url.0, bad.url.1), ("False", REASON_INVALID_URL));
        for validation in [off, denied, ssh, bad] {
            assert!(!format!("{validation:?}").contains("s3cret"));
        }
    }

    #[test]
    fn git_output_is_classified() {
        let url = RepositoryUrl::parse("https://git.example.invalid/r.git").expect("url");
        let answer = |stderr: &str| git::Answer { success: false, stderr: stderr.to_owned() };
        let wrong = classify(&url, answer("fatal: could not read Username for 'https://x': terminal prompts disabled"));
        assert_eq!((wrong.credential.0, wrong.credential.1), ("False", REASON_INVALID_CREDENTIALS));
        let key = classify(&url, answer("git@127.0.0.1: Permission denied (publickey).\nfatal: Could not read"));
        assert_eq!(key.credential.1, REASON_INVALID_CREDENTIALS);
        let missing = classify(&url, answer("remote: Repository not found.\nfatal: repository 'x' not found"));
        assert_eq!((missing.url.0, missing.url.1), ("False", REASON_INVALID_URL));
        let redirect = classify(&url, answer("fatal: unable to access 'x': The requested URL returned error: 302"));
        assert!(redirect.url.2.contains("redirect"), "{redirect:?}");
        let ok = classify(&url, git::Answer { success: true, stderr: String::new() });
        assert_eq!((ok.url.1, ok.credential.1), (REASON_VALID_URL, REASON_CREDENTIALS_UP_TO_DATE));
    }
}
