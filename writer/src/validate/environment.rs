//! GitOpsDeploymentManagedEnvironment rules: the API URL (https only), the Secret
//! name, the namespace list, and the kubeconfig in the referenced Secret. That the
//! Secret exists in the same namespace is the controller's check
//! (`SecretNotFound`); contacting `apiURL` is the connection checker's.

use gitops_shared::db::credential::ManagedEnvironmentIntent;
use k8s_openapi::api::core::v1::Secret;
use uuid::Uuid;

use super::secret::{require_type, secret_text};
use super::{Invalid, KUBECONFIG_KEY, ValidKubeconfig, api_url, dns_label, dns_subdomain, kubeconfig, limits, reason};
use crate::api::GitOpsDeploymentManagedEnvironmentSpec;

/// Secret types accepted for a managed environment's credentials.
pub const ENVIRONMENT_SECRET_TYPES: &[&str] = &["Opaque", "managed-gitops.redhat.com/managed-environment"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidEnvironment {
    pub api_url: String,
    pub credentials_secret: String,
    pub allow_insecure_skip_tls_verify: bool,
    /// Sorted, without duplicates.
    pub namespaces: Vec<String>,
    pub cluster_resources: bool,
    /// Deploy with a ServiceAccount the writer installs (see `createNewServiceAccount`).
    pub create_new_service_account: bool,
}

pub fn environment(spec: &GitOpsDeploymentManagedEnvironmentSpec) -> Result<ValidEnvironment, Invalid> {
    let api_url = api_url("spec.apiURL", &spec.api_url)?;
    let credentials_secret =
        dns_subdomain("spec.credentialsSecret", &spec.credentials_secret, reason::INVALID_SECRET_NAME)?;
    let listed = spec.namespaces.as_deref().unwrap_or_default();
    if listed.len() > limits::NAMESPACES {
        return Err(Invalid::new(
            reason::FIELD_TOO_LONG,
            format!("spec.namespaces has {} entries; at most {} are allowed", listed.len(), limits::NAMESPACES),
        ));
    }
    let mut namespaces = listed
        .iter()
        .enumerate()
        .map(|(i, ns)| dns_label(&format!("spec.namespaces[{i}]"), ns, reason::INVALID_NAMESPACES))
        .collect::<Result<Vec<_>, _>>()?;
    namespaces.sort();
    namespaces.dedup();
    let cluster_resources = spec.cluster_resources.unwrap_or(false);
    let create_new_service_account = spec.create_new_service_account.unwrap_or(false);
    if create_new_service_account && !cluster_resources && namespaces.is_empty() {
        return Err(Invalid::new(
            reason::FIELD_REQUIRED,
            "spec.namespaces is required when spec.createNewServiceAccount is true, unless spec.clusterResources \
             is true: the ServiceAccount gets a Role in each listed namespace",
        ));
    }
    Ok(ValidEnvironment {
        api_url,
        credentials_secret,
        allow_insecure_skip_tls_verify: spec.allow_insecure_skip_tls_verify.unwrap_or(false),
        namespaces,
        cluster_resources,
        create_new_service_account,
    })
}

/// The credentials in the environment's Secret for the cluster at `api_url`: its
/// `kubeconfig` key, checked by [`kubeconfig`].
pub fn environment_secret(secret: &Secret, api_url: &str) -> Result<ValidKubeconfig, Invalid> {
    require_type(secret, ENVIRONMENT_SECRET_TYPES)?;
    let text = secret_text(secret, KUBECONFIG_KEY, limits::KUBECONFIG)?.ok_or_else(|| {
        Invalid::new(reason::SECRET_MISSING_CREDENTIALS, format!("the Secret has no {KUBECONFIG_KEY:?} key"))
    })?;
    kubeconfig(&text, api_url)
}

impl ValidEnvironment {
    /// The row to write. TLS verification is skipped when the spec allows it or
    /// the kubeconfig asks for it (the tenant controls both).
    pub fn into_intent(
        self,
        resource_uid: Uuid,
        resource_name: String,
        generation: i64,
        secret_resource_version: Option<String>,
        kubeconfig: ValidKubeconfig,
    ) -> ManagedEnvironmentIntent {
        ManagedEnvironmentIntent {
            resource_uid,
            resource_name,
            generation,
            api_url: self.api_url,
            allow_insecure_skip_tls_verify: self.allow_insecure_skip_tls_verify || kubeconfig.insecure_skip_tls_verify,
            namespaces: self.namespaces,
            cluster_resources: self.cluster_resources,
            secret_name: self.credentials_secret,
            secret_resource_version,
            credentials: kubeconfig.credentials,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;

    use super::*;
    use crate::validate::reason::*;

    fn spec() -> GitOpsDeploymentManagedEnvironmentSpec {
        GitOpsDeploymentManagedEnvironmentSpec {
            api_url: "https://cluster.example.invalid:6443".into(),
            credentials_secret: "cluster-creds".into(),
            allow_insecure_skip_tls_verify: None,
            namespaces: Some(vec!["b".into(), "a".into(), "b".into()]),
            cluster_resources: Some(true),
            create_new_service_account: None,
        }
    }

    fn secret(type_: Option<&str>, entries: &[(&str, &[u8])]) -> Secret {
        let data: BTreeMap<String, ByteString> =
            entries.iter().map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec()))).collect();
        Secret { type_: type_.map(str::to_owned), data: Some(data), ..Default::default() }
    }

    const API: &str = "https://cluster.example.invalid";

    #[test]
    fn a_valid_environment() {
        let valid = environment(&spec()).expect("valid");
        assert_eq!(valid.namespaces, ["a", "b"]);
        assert!(valid.cluster_resources);
        assert!(!valid.allow_insecure_skip_tls_verify);
        let kube = environment_secret(&secret(None, &[("kubeconfig", b"users: [{name: u, user: {token: t}}]")]), API)
            .expect("valid secret");
        let intent = valid.into_intent(Uuid::nil(), "prod".into(), 2, Some("17".into()), kube);
        assert_eq!(intent.credentials.bearer_token.as_deref(), Some("t"));
        assert_eq!(intent.secret_name, "cluster-creds");
    }

    #[test]
    fn refusals() {
        let with = |change: fn(&mut GitOpsDeploymentManagedEnvironmentSpec)| {
            let mut s = spec();
            change(&mut s);
            environment(&s).expect_err("refused").reason
        };
        assert_eq!(with(|s| s.api_url = "http://cluster.example.invalid".into()), INVALID_API_URL);
        assert_eq!(with(|s| s.api_url = "https://".into()), INVALID_API_URL);
        assert_eq!(with(|s| s.api_url = String::new()), FIELD_REQUIRED);
        assert_eq!(with(|s| s.api_url = format!("https://h/{}", "a".repeat(2048))), FIELD_TOO_LONG);
        assert_eq!(with(|s| s.api_url = "https://h\0".into()), INVALID_CHARACTERS);
        assert_eq!(with(|s| s.credentials_secret = "Creds;rm".into()), INVALID_SECRET_NAME);
        assert_eq!(with(|s| s.credentials_secret = String::new()), FIELD_REQUIRED);
        assert_eq!(with(|s| s.namespaces = Some(vec!["ok".into(), "Not_OK".into()])), INVALID_NAMESPACES);
        assert_eq!(with(|s| s.namespaces = Some(vec!["n".into(); 257])), FIELD_TOO_LONG);
    }

    #[test]
    fn a_new_service_account_needs_namespaces_unless_cluster_resources() {
        let mut s = spec();
        s.create_new_service_account = Some(true);
        assert!(environment(&s).expect("cluster resources without namespaces").create_new_service_account);
        s.namespaces = None;
        assert!(environment(&s).is_ok(), "with clusterResources the namespaces may be absent");
        s.cluster_resources = Some(false);
        let refused = environment(&s).expect_err("refused");
        assert_eq!(refused.reason, FIELD_REQUIRED);
        assert!(refused.message.contains("spec.namespaces"), "{}", refused.message);
        s.namespaces = Some(vec!["apps".into()]);
        assert!(environment(&s).is_ok());
        s.create_new_service_account = None;
        s.namespaces = None;
        assert!(environment(&s).is_ok(), "only a new ServiceAccount needs namespaces");
    }

    #[test]
    fn secret_refusals() {
        let token = b"users: [{name: u, user: {token: t}}]".as_slice();
        assert!(
            environment_secret(
                &secret(Some("managed-gitops.redhat.com/managed-environment"), &[("kubeconfig", token)]),
                API
            )
            .is_ok()
        );
        let wrong =
            environment_secret(&secret(Some("kubernetes.io/tls"), &[("kubeconfig", token)]), API).expect_err("refused");
        assert_eq!(wrong.reason, SECRET_WRONG_TYPE);
        let missing = environment_secret(&secret(None, &[("config", token)]), API).expect_err("refused");
        assert_eq!(missing.reason, SECRET_MISSING_CREDENTIALS);
        let binary = environment_secret(&secret(None, &[("kubeconfig", &[0xff, 0xfe])]), API).expect_err("refused");
        assert_eq!(binary.reason, INVALID_CHARACTERS);
        let exec = environment_secret(
            &secret(None, &[("kubeconfig", b"users: [{name: u, user: {exec: {command: sh}}}]")]),
            API,
        );
        assert_eq!(exec.expect_err("refused").reason, KUBECONFIG_EXEC_PLUGIN_NOT_ALLOWED);
    }
}
