//! The ManagedEnvironment an Environment asks for, decided without I/O: from its
//! credentials, or from the DeploymentTarget its claim is bound to.

use gitops_writer::api::GitOpsDeploymentManagedEnvironmentSpec;

use crate::api::{DeploymentTarget, EnvironmentSpec, KubernetesClusterCredentials};

/// A tenant's mistake, shown in the Environment's conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

pub const INVALID_ENVIRONMENT: &str = "InvalidEnvironment";
pub const BOTH_MODES: &str =
    "Environment is invalid since it cannot have both DeploymentTargetClaim and credentials configuration set";

/// Which way the Environment reaches its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode<'a> {
    /// Through the DeploymentTarget bound to this claim.
    Claim(&'a str),
    /// With these credentials.
    Credentials(&'a KubernetesClusterCredentials),
    /// No cluster: deployments go to the namespace itself.
    None,
}

/// The Environment's mode; both set is refused.
pub fn mode(spec: &EnvironmentSpec) -> Result<Mode<'_>, Refusal> {
    match (spec.claim_name(), spec.unstable_configuration_fields.as_ref()) {
        (Some(_), Some(_)) => Err(Refusal { reason: INVALID_ENVIRONMENT, message: BOTH_MODES.to_owned() }),
        (Some(claim), None) => Ok(Mode::Claim(claim)),
        (None, Some(unstable)) => Ok(Mode::Credentials(&unstable.kubernetes_credentials)),
        (None, None) => Ok(Mode::None),
    }
}

/// From credentials: URL, Secret, TLS choice, cluster resources and namespaces.
/// (`targetNamespace` is the bindings' concern.)
pub fn from_credentials(credentials: &KubernetesClusterCredentials) -> GitOpsDeploymentManagedEnvironmentSpec {
    GitOpsDeploymentManagedEnvironmentSpec {
        api_url: credentials.api_url.clone(),
        credentials_secret: credentials.cluster_credentials_secret.clone(),
        allow_insecure_skip_tls_verify: Some(credentials.allow_insecure_skip_tls_verify),
        namespaces: (!credentials.namespaces.is_empty()).then(|| credentials.namespaces.clone()),
        cluster_resources: Some(credentials.cluster_resources),
        create_new_service_account: None,
    }
}

/// From a bound DeploymentTarget: URL, Secret (`secret`, which may be a copy) and TLS
/// choice, limited to the target's default namespace when it has one.
pub fn from_target(target: &DeploymentTarget, secret: &str) -> GitOpsDeploymentManagedEnvironmentSpec {
    let credentials = &target.spec.kubernetes_credentials;
    GitOpsDeploymentManagedEnvironmentSpec {
        api_url: credentials.api_url.clone(),
        credentials_secret: secret.to_owned(),
        allow_insecure_skip_tls_verify: Some(credentials.allow_insecure_skip_tls_verify),
        namespaces: (!credentials.default_namespace.is_empty()).then(|| vec![credentials.default_namespace.clone()]),
        cluster_resources: None,
        create_new_service_account: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        DeploymentTargetKubernetesClusterCredentials, DeploymentTargetSpec, UnstableEnvironmentConfiguration,
    };

    fn credentials() -> KubernetesClusterCredentials {
        KubernetesClusterCredentials {
            target_namespace: "team".into(),
            api_url: "https://127.0.0.1:6443".into(),
            cluster_credentials_secret: "creds".into(),
            allow_insecure_skip_tls_verify: true,
            namespaces: vec!["a".into(), "b".into()],
            cluster_resources: true,
            ..KubernetesClusterCredentials::default()
        }
    }

    #[test]
    fn both_modes_are_refused_and_neither_means_no_cluster() {
        let mut spec = EnvironmentSpec::default();
        assert_eq!(mode(&spec), Ok(Mode::None));
        spec.configuration.target.deployment_target_claim.claim_name = "claim".into();
        assert_eq!(mode(&spec), Ok(Mode::Claim("claim")));
        spec.unstable_configuration_fields =
            Some(UnstableEnvironmentConfiguration { cluster_type: None, kubernetes_credentials: credentials() });
        let refusal = mode(&spec).expect_err("both");
        assert_eq!((refusal.reason, refusal.message.as_str()), (INVALID_ENVIRONMENT, BOTH_MODES));
        spec.configuration.target.deployment_target_claim.claim_name.clear();
        assert!(matches!(mode(&spec), Ok(Mode::Credentials(c)) if c.api_url == "https://127.0.0.1:6443"));
    }

    #[test]
    fn credentials_carry_namespaces_and_cluster_resources() {
        let spec = from_credentials(&credentials());
        assert_eq!(spec.api_url, "https://127.0.0.1:6443");
        assert_eq!(spec.credentials_secret, "creds");
        assert_eq!(spec.allow_insecure_skip_tls_verify, Some(true));
        assert_eq!(spec.namespaces, Some(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(spec.cluster_resources, Some(true));
        let bare = from_credentials(&KubernetesClusterCredentials::default());
        assert_eq!((bare.namespaces, bare.cluster_resources), (None, Some(false)));
    }

    #[test]
    fn a_target_limits_to_its_default_namespace_when_it_has_one() {
        let mut target = DeploymentTarget::new(
            "dt",
            DeploymentTargetSpec {
                kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                    default_namespace: "space".into(),
                    api_url: "https://127.0.0.1:7443".into(),
                    cluster_credentials_secret: "dt-secret".into(),
                    allow_insecure_skip_tls_verify: false,
                },
                ..DeploymentTargetSpec::default()
            },
        );
        let spec = from_target(&target, "managed-environment-secret-env");
        assert_eq!(spec.credentials_secret, "managed-environment-secret-env");
        assert_eq!(spec.namespaces, Some(vec!["space".to_owned()]));
        assert_eq!(spec.allow_insecure_skip_tls_verify, Some(false));
        target.spec.kubernetes_credentials.default_namespace.clear();
        assert_eq!(from_target(&target, "s").namespaces, None);
    }
}
