//! GitOpsDeploymentRepositoryCredential rules: the repository URL (`https://` or
//! `ssh://`), the Secret name, and the Secret's content — `username` with
//! `password`, or `sshPrivateKey` — reduced to shared's allow-listed
//! `RepositoryCredentials`. A missing Secret is the controller's `SecretNotFound`.

use gitops_shared::db::credential::RepositoryCredentials;
use k8s_openapi::api::core::v1::Secret;

use super::secret::{require_type, secret_text, secret_type};
use super::text::text;
use super::{Invalid, credential_repository_url, dns_subdomain, limits, reason};
use crate::api::GitOpsDeploymentRepositoryCredentialSpec;

/// Secret types accepted for repository credentials.
pub const REPOSITORY_SECRET_TYPES: &[&str] = &["Opaque", "kubernetes.io/basic-auth", "kubernetes.io/ssh-auth"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidRepositoryCredential {
    pub repository: String,
    pub secret: String,
}

pub fn repository_credential(
    spec: &GitOpsDeploymentRepositoryCredentialSpec,
) -> Result<ValidRepositoryCredential, Invalid> {
    let repository = credential_repository_url("spec.repository", &spec.repository)?;
    let secret = dns_subdomain("spec.secret", &spec.secret, reason::INVALID_SECRET_NAME)?;
    Ok(ValidRepositoryCredential { repository, secret })
}

/// The credentials in the Secret. `kubernetes.io/ssh-auth` Secrets keep the key
/// under `ssh-privatekey`; others under `sshPrivateKey`.
pub fn repository_secret(secret: &Secret) -> Result<RepositoryCredentials, Invalid> {
    require_type(secret, REPOSITORY_SECRET_TYPES)?;
    let username = secret_text(secret, "username", limits::USERNAME)?;
    if let Some(username) = &username {
        text("the Secret's key \"username\"", username, limits::USERNAME)?;
    }
    let password = secret_text(secret, "password", limits::PASSWORD)?;
    let key_name = if secret_type(secret) == "kubernetes.io/ssh-auth" { "ssh-privatekey" } else { "sshPrivateKey" };
    let ssh_private_key = secret_text(secret, key_name, limits::SSH_PRIVATE_KEY)?;
    let basic = username.is_some() && password.is_some();
    if !basic && ssh_private_key.is_none() {
        let message = match (&username, &password) {
            (Some(_), None) => "the Secret has a username but no password".to_owned(),
            (None, Some(_)) => "the Secret has a password but no username".to_owned(),
            _ => format!("the Secret needs \"username\" and \"password\", or {key_name:?}"),
        };
        return Err(Invalid::new(reason::SECRET_MISSING_CREDENTIALS, message));
    }
    Ok(RepositoryCredentials {
        username: username.filter(|_| basic),
        password: password.filter(|_| basic),
        ssh_private_key,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;
    use crate::validate::reason::*;

    fn secret(type_: Option<&str>, entries: &[(&str, &str)]) -> Secret {
        let data: BTreeMap<String, ByteString> =
            entries.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec()))).collect();
        Secret { type_: type_.map(str::to_owned), data: Some(data), ..Default::default() }
    }

    #[test]
    fn specs() {
        let spec = |repository: &str, secret: &str| GitOpsDeploymentRepositoryCredentialSpec {
            repository: repository.into(),
            secret: secret.into(),
        };
        assert!(repository_credential(&spec("https://git.example.invalid/team", "creds")).is_ok());
        assert!(repository_credential(&spec("ssh://git@git.example.invalid/team", "creds")).is_ok());
        for bad in ["git@git.example.invalid:team", "http://git.example.invalid/team", "git://h/x", "https://h"] {
            assert_eq!(repository_credential(&spec(bad, "creds")).unwrap_err().reason, INVALID_REPOSITORY_URL, "{bad}");
        }
        assert_eq!(repository_credential(&spec("https://h/x", "a b")).unwrap_err().reason, INVALID_SECRET_NAME);
        assert_eq!(repository_credential(&spec("https://h/x", "")).unwrap_err().reason, FIELD_REQUIRED);
        assert_eq!(repository_credential(&spec("https://h/\u{0}", "s")).unwrap_err().reason, INVALID_CHARACTERS);
    }

    #[test]
    fn basic_auth_and_ssh_keys() {
        let basic =
            repository_secret(&secret(None, &[("username", "bot"), ("password", "it's;$(x)\n"), ("other", "x")]))
                .expect("valid");
        assert_eq!(basic.username.as_deref(), Some("bot"));
        assert_eq!(basic.password.as_deref(), Some("it's;$(x)\n"));
        assert_eq!(basic.ssh_private_key, None);
        let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n";
        let ssh = repository_secret(&secret(None, &[("sshPrivateKey", key)])).expect("valid");
        assert_eq!(ssh.ssh_private_key.as_deref(), Some(key));
        let typed =
            repository_secret(&secret(Some("kubernetes.io/ssh-auth"), &[("ssh-privatekey", key)])).expect("valid");
        assert_eq!(typed.ssh_private_key.as_deref(), Some(key));
        assert!(
            repository_secret(&secret(Some("kubernetes.io/basic-auth"), &[("username", "u"), ("password", "p")]))
                .is_ok()
        );
    }

    #[test]
    fn refusals() {
        let reason = |type_: Option<&str>, entries: &[(&str, &str)]| {
            repository_secret(&secret(type_, entries)).unwrap_err().reason
        };
        assert_eq!(
            reason(Some("kubernetes.io/dockerconfigjson"), &[("username", "u"), ("password", "p")]),
            SECRET_WRONG_TYPE
        );
        assert_eq!(reason(Some("kubernetes.io/service-account-token"), &[]), SECRET_WRONG_TYPE);
        assert_eq!(reason(None, &[]), SECRET_MISSING_CREDENTIALS);
        assert_eq!(reason(None, &[("username", "u")]), SECRET_MISSING_CREDENTIALS);
        assert_eq!(reason(None, &[("password", "p")]), SECRET_MISSING_CREDENTIALS);
        assert_eq!(reason(None, &[("username", ""), ("password", "")]), SECRET_MISSING_CREDENTIALS);
        assert_eq!(reason(None, &[("username", "u\0"), ("password", "p")]), INVALID_CHARACTERS);
        assert_eq!(reason(None, &[("username", "u\n"), ("password", "p")]), INVALID_CHARACTERS);
        assert_eq!(reason(None, &[("username", &"u".repeat(257)), ("password", "p")]), FIELD_TOO_LONG);
        assert_eq!(reason(None, &[("sshPrivateKey", &"k".repeat(limits::SSH_PRIVATE_KEY + 1))]), FIELD_TOO_LONG);
        let hidden = repository_secret(&secret(None, &[("username", "u"), ("password", &format!("{}\0", "hunter2"))]));
        assert!(!hidden.unwrap_err().message.contains("hunter2"));
    }
}
