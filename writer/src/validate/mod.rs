//! Semantic validation of the tenant resources: pure functions from an API type to
//! the validated domain value, or to an [`Invalid`] carrying the condition reason
//! and a message safe to show the tenant. The CRD schemas check types only, so
//! these rules alone decide, identically on every API server.
//!
//! Nothing here panics on any input, touches the database or Kubernetes, or puts
//! a secret into a message. SQL and shell metacharacters are ordinary characters:
//! values are stored as query parameters and never reach a shell.
//!
//! Length limits, in bytes of UTF-8 (see [`limits`]):
//!
//! | field | limit |
//! | --- | --- |
//! | `repoURL`, `repository`, `apiURL` | 2048 |
//! | `source.path` | 1024 |
//! | `targetRevision`, `revisionID` | 255 |
//! | `destination.environment`, `gitopsDeploymentName`, Secret names | 253 (DNS-1123 subdomain) |
//! | `destination.namespace`, each of `namespaces[]` | 63 (DNS-1123 label) |
//! | `namespaces[]` | 256 entries |
//! | `type` | 16 |
//! | `syncOptions[]` | 8 entries of 64 |
//! | kubeconfig | 256 KiB; token and each `*-data` field 64 KiB; `tls-server-name` 253 |
//! | repository Secret: `username` 256, `password` 8 KiB, `sshPrivateKey` 64 KiB | |

mod deployment;
mod environment;
mod kubeconfig;
mod name;
mod private_address;
mod repository_credential;
mod secret;
mod sync_run;
mod text;
mod url;

pub use deployment::{
    EnvironmentRef, ValidDeployment, deployment, environment_resolved, home_destination, path, sync_options, sync_type,
    target_revision,
};
pub use environment::{ValidEnvironment, environment, environment_secret};
pub use kubeconfig::{KUBECONFIG_KEY, ValidKubeconfig, kubeconfig, normalised_server};
pub use name::{dns_label, dns_subdomain};
pub use private_address::public_api_url;
pub use repository_credential::{ValidRepositoryCredential, repository_credential, repository_secret};
pub use sync_run::{ValidSyncRun, sync_run};
pub use text::text;
pub use url::{api_url, credential_repository_url, repository_url};

/// Why a resource is refused: a CamelCase condition reason and a message for the
/// tenant (clear, naming the field, never echoing secret values).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct Invalid {
    pub reason: &'static str,
    pub message: String,
}

impl Invalid {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Invalid { reason, message: message.into() }
    }
}

/// The condition reasons this module produces.
pub mod reason {
    pub const FIELD_REQUIRED: &str = "FieldRequired";
    pub const FIELD_SET_BY_SERVICE: &str = "FieldSetByService";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const FIELD_TOO_LONG: &str = "FieldTooLong";
    pub const INVALID_CHARACTERS: &str = "InvalidCharacters";
    pub const INVALID_REPOSITORY_URL: &str = "InvalidRepositoryURL";
    pub const INVALID_PATH: &str = "InvalidPath";
    pub const INVALID_TARGET_REVISION: &str = "InvalidTargetRevision";
    pub const INVALID_ENVIRONMENT_NAME: &str = "InvalidEnvironmentName";
    pub const ENVIRONMENT_NOT_FOUND: &str = "EnvironmentNotFound";
    pub const INVALID_DESTINATION_NAMESPACE: &str = "InvalidDestinationNamespace";
    pub const INVALID_DEPLOYMENT_TYPE: &str = "InvalidDeploymentType";
    pub const INVALID_SYNC_OPTION: &str = "InvalidSyncOption";
    pub const INVALID_DEPLOYMENT_NAME: &str = "InvalidDeploymentName";
    pub const INVALID_REVISION_ID: &str = "InvalidRevisionID";
    pub const INVALID_API_URL: &str = "InvalidAPIURL";
    pub const API_URL_NOT_ALLOWED: &str = "APIURLNotAllowed";
    pub const INVALID_SECRET_NAME: &str = "InvalidSecretName";
    pub const INVALID_NAMESPACES: &str = "InvalidNamespaces";
    pub const SECRET_WRONG_TYPE: &str = "SecretWrongType";
    pub const SECRET_MISSING_CREDENTIALS: &str = "SecretMissingCredentials";
    pub const KUBECONFIG_EXEC_PLUGIN_NOT_ALLOWED: &str = "KubeconfigExecPluginNotAllowed";
    pub const KUBECONFIG_AUTH_PROVIDER_NOT_ALLOWED: &str = "KubeconfigAuthProviderNotAllowed";
    pub const KUBECONFIG_FILE_PATH_NOT_ALLOWED: &str = "KubeconfigFilePathNotAllowed";
    pub const KUBECONFIG_BASIC_AUTH_NOT_ALLOWED: &str = "KubeconfigBasicAuthNotAllowed";
    pub const KUBECONFIG_PROXY_NOT_ALLOWED: &str = "KubeconfigProxyNotAllowed";
    pub const KUBECONFIG_IMPERSONATION_NOT_ALLOWED: &str = "KubeconfigImpersonationNotAllowed";
    pub const KUBECONFIG_NO_CREDENTIALS: &str = "KubeconfigNoCredentials";
    pub const KUBECONFIG_MALFORMED: &str = "KubeconfigMalformed";
    /// As the original service: no (or more than one) kubeconfig context for `apiURL`.
    pub const UNABLE_TO_LOCATE_CONTEXT: &str = "UnableToLocateContext";
}

/// Length limits in bytes; the table in this module's documentation lists them.
pub mod limits {
    pub const URL: usize = 2048;
    pub const PATH: usize = 1024;
    pub const REVISION: usize = 255;
    pub const DNS_SUBDOMAIN: usize = 253;
    pub const DNS_LABEL: usize = 63;
    pub const NAMESPACES: usize = 256;
    pub const DEPLOYMENT_TYPE: usize = 16;
    pub const SYNC_OPTIONS: usize = 8;
    pub const SYNC_OPTION: usize = 64;
    pub const KUBECONFIG: usize = 256 * 1024;
    pub const CREDENTIAL_DATA: usize = 64 * 1024;
    pub const USERNAME: usize = 256;
    pub const PASSWORD: usize = 8 * 1024;
    pub const SSH_PRIVATE_KEY: usize = 64 * 1024;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random strings over an alphabet of URL, path, YAML and
    /// multi-byte characters, NUL and control characters.
    fn inputs() -> impl Iterator<Item = String> {
        const ALPHABET: &[char] = &[
            'a',
            'Z',
            '0',
            '9',
            '-',
            '.',
            '_',
            '/',
            '\\',
            ':',
            '@',
            '[',
            ']',
            '?',
            '#',
            '%',
            '\'',
            '"',
            ';',
            '$',
            '(',
            ')',
            '`',
            '|',
            '&',
            ' ',
            '\0',
            '\n',
            '\t',
            '\u{7f}',
            'é',
            '\u{1F600}',
            '{',
            '}',
            '*',
            '!',
            '&',
            '~',
            '=',
        ];
        const PREFIXES: &[&str] =
            &["", "https://", "ssh://", "git://", "git@h:", "https://[", "ssh://u@h:", "users:\n- "];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        (0..4000).map(move |_| {
            let prefix = PREFIXES[(next() % PREFIXES.len() as u64) as usize];
            let len = (next() % 40) as usize;
            let body: String = (0..len).map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize]).collect();
            format!("{prefix}{body}")
        })
    }

    fn well_formed(result: Result<impl Sized, Invalid>) {
        if let Err(invalid) = result {
            assert!(invalid.reason.chars().next().is_some_and(|c| c.is_ascii_uppercase()), "{invalid:?}");
            assert!(invalid.reason.chars().all(|c| c.is_ascii_alphanumeric()), "{invalid:?}");
            assert!(!invalid.message.is_empty() && !invalid.message.contains('\0'), "{invalid:?}");
        }
    }

    #[test]
    fn arbitrary_input_gets_an_answer_never_a_panic() {
        let mut accepted = 0;
        for input in inputs() {
            accepted += usize::from(repository_url("f", &input).is_ok());
            well_formed(repository_url("f", &input));
            well_formed(credential_repository_url("f", &input));
            well_formed(api_url("f", &input));
            well_formed(path("f", &input));
            well_formed(target_revision("f", Some(&input)));
            well_formed(sync_type("f", &input));
            well_formed(sync_options("f", std::slice::from_ref(&input)));
            well_formed(dns_label("f", &input, reason::INVALID_NAMESPACES));
            well_formed(dns_subdomain("f", &input, reason::INVALID_NAMESPACES));
            well_formed(kubeconfig(&input, "https://api.example.invalid"));
            well_formed(text("f", &input, 16));
        }
        assert!(accepted > 0, "some generated repository URLs are valid");
    }

    /// The schemas' patterns refuse nothing these rules accept (they only refuse
    /// earlier): every accepted generated or sample value matches its pattern.
    #[test]
    fn the_schema_patterns_are_never_stricter_than_the_rules() {
        use crate::api::pattern;
        type Rule = Box<dyn Fn(&str) -> bool>;
        let re = |p: &str| regex::Regex::new(p).expect("pattern compiles");
        let checks: Vec<(regex::Regex, Rule)> = vec![
            (re(pattern::REPOSITORY_URL), Box::new(|v| repository_url("f", v).is_ok())),
            (re(pattern::CREDENTIAL_URL), Box::new(|v| credential_repository_url("f", v).is_ok())),
            (re(pattern::API_URL), Box::new(|v| api_url("f", v).is_ok())),
            (re(pattern::PATH), Box::new(|v| path("f", v).is_ok())),
            (re(pattern::REVISION_OR_EMPTY), Box::new(|v| target_revision("f", Some(v)).is_ok())),
            (re(pattern::DNS_LABEL), Box::new(|v| dns_label("f", v, reason::INVALID_NAMESPACES).is_ok())),
            (re(pattern::DNS_SUBDOMAIN), Box::new(|v| dns_subdomain("f", v, reason::INVALID_NAMESPACES).is_ok())),
        ];
        let samples = [
            "https://git.example.invalid/team/repo.git",
            "ssh://git@git.example.invalid:2222/team/repo.git",
            "git://git.example.invalid/team/repo.git",
            "git@git.example.invalid:team/repo.git",
            "git.example.invalid:/team/repo.git",
            "https://[2001:db8::1]/team/repo",
            "https://api.example.invalid:6443",
            "https://api.example.invalid/prefix",
            "apps/web",
            ".",
            "apps/it's; $(x)",
            "main",
            "v1.2.3",
            "0123456789abcdef0123456789abcdef01234567",
            "web",
            "web.v2",
        ];
        let mut accepted = 0;
        for input in inputs().chain(samples.iter().map(|s| (*s).to_owned())) {
            for (pattern, rule) in &checks {
                if rule(&input) {
                    accepted += 1;
                    assert!(pattern.is_match(&input), "{input:?} is accepted but refused by {pattern}");
                }
            }
        }
        assert!(accepted > samples.len(), "the samples and some generated values are accepted");
    }
}
