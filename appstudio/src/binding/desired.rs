//! What a binding asks for, decided without I/O: the destination its Environment
//! gives, one GitOpsDeployment per component of `status.components`, and the labels
//! they carry.

use std::collections::BTreeMap;

use gitops_writer::api::{DeploymentDestination, DeploymentSource, GitOpsDeploymentSpec};

use crate::api::{BindingStatusComponent, DeploymentTarget, Environment, SnapshotEnvironmentBinding};
use crate::names::{
    APPLICATION_LABEL, APPSTUDIO_LABEL_MARK, COMPONENT_LABEL, ENVIRONMENT_LABEL, binding_deployment_name,
    managed_environment_name,
};

pub const CLAIM_MISSING: &str = "DeploymentTargetClaim referenced by Environment does not exist.";
pub const TARGET_MISSING: &str = "unable to locate DeploymentTarget the references DeploymentTargetClaim";
pub const TARGET_NAMESPACE_MISSING: &str = "Environment is missing a TargetNamespace field";

/// The longest label value Kubernetes accepts.
const MAX_LABEL_VALUE: usize = 63;

/// Where the Environment's deployments go, given the target its claim is bound to
/// (`None` when it has no claim or the claim could not be followed).
pub fn destination(
    env: &Environment,
    claim_found: bool,
    target: Option<&DeploymentTarget>,
) -> Result<DeploymentDestination, String> {
    let environment = Some(managed_environment_name(&env.metadata.name.clone().unwrap_or_default()));
    if env.spec.claim_name().is_some() {
        if !claim_found {
            return Err(CLAIM_MISSING.to_owned());
        }
        let target = target.ok_or_else(|| TARGET_MISSING.to_owned())?;
        let namespace = &target.spec.kubernetes_credentials.default_namespace;
        return Ok(DeploymentDestination {
            environment,
            namespace: (!namespace.is_empty()).then(|| namespace.clone()),
            ..DeploymentDestination::default()
        });
    }
    if let Some(unstable) = &env.spec.unstable_configuration_fields {
        let namespace = &unstable.kubernetes_credentials.target_namespace;
        if namespace.is_empty() {
            return Err(TARGET_NAMESPACE_MISSING.to_owned());
        }
        return Ok(DeploymentDestination {
            environment,
            namespace: Some(namespace.clone()),
            ..DeploymentDestination::default()
        });
    }
    Ok(DeploymentDestination::default())
}

/// One GitOpsDeployment the binding asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub component: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub spec: GitOpsDeploymentSpec,
}

/// The GitOpsDeployment of `component`: the repository generator's repository,
/// path and branch, synced automatically to `destination`.
pub fn expected(
    binding: &SnapshotEnvironmentBinding,
    component: &BindingStatusComponent,
    destination: &DeploymentDestination,
) -> Result<Expected, String> {
    let spec = &binding.spec;
    let binding_name = binding.metadata.name.clone().unwrap_or_default();
    let repository = &component.gitops_repository;
    Ok(Expected {
        component: component.name.clone(),
        name: binding_deployment_name(&binding_name, &spec.application, &spec.environment, &component.name),
        labels: labels(binding.metadata.labels.as_ref(), &spec.application, &component.name, &spec.environment)?,
        spec: GitOpsDeploymentSpec {
            source: DeploymentSource {
                repo_url: repository.url.clone(),
                path: repository.path.clone(),
                target_revision: (!repository.branch.is_empty()).then(|| repository.branch.clone()),
            },
            destination: destination.clone(),
            type_: "automated".to_owned(),
            sync_policy: None,
            project: None,
        },
    })
}

/// The binding's labels whose key contains `appstudio.openshift.io`, and the
/// application, component and environment labels. A value over 63 characters is
/// refused.
pub fn labels(
    binding_labels: Option<&BTreeMap<String, String>>,
    application: &str,
    component: &str,
    environment: &str,
) -> Result<BTreeMap<String, String>, String> {
    let mut labels: BTreeMap<String, String> = binding_labels
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.contains(APPSTUDIO_LABEL_MARK))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    labels.insert(APPLICATION_LABEL.to_owned(), application.to_owned());
    labels.insert(COMPONENT_LABEL.to_owned(), component.to_owned());
    labels.insert(ENVIRONMENT_LABEL.to_owned(), environment.to_owned());
    if let Some((key, _)) = labels.iter().find(|(_, value)| value.len() > MAX_LABEL_VALUE) {
        return Err(format!("label {key} would be longer than {MAX_LABEL_VALUE} characters"));
    }
    Ok(labels)
}

/// The `appstudio.openshift.io` labels of a live object (compared with the expected).
pub fn appstudio_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels.iter().filter(|(key, _)| key.contains(APPSTUDIO_LABEL_MARK)).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The first component name given twice.
pub fn duplicate_component(components: &[BindingStatusComponent]) -> Option<&str> {
    let mut seen = std::collections::BTreeSet::new();
    components.iter().map(|c| c.name.as_str()).find(|name| !seen.insert(*name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        BindingComponentGitOpsRepository, DeploymentTargetSpec, EnvironmentSpec, KubernetesClusterCredentials,
        SnapshotEnvironmentBindingSpec, UnstableEnvironmentConfiguration,
    };

    fn env_with(unstable: Option<&str>, claim: Option<&str>) -> Environment {
        let mut env = Environment::new("staging", EnvironmentSpec::default());
        env.spec.unstable_configuration_fields = unstable.map(|ns| UnstableEnvironmentConfiguration {
            cluster_type: None,
            kubernetes_credentials: KubernetesClusterCredentials {
                target_namespace: ns.to_owned(),
                ..KubernetesClusterCredentials::default()
            },
        });
        env.spec.configuration.target.deployment_target_claim.claim_name = claim.unwrap_or_default().to_owned();
        env
    }

    #[test]
    fn the_three_destination_modes() {
        assert_eq!(destination(&env_with(None, None), false, None), Ok(DeploymentDestination::default()));
        let creds = destination(&env_with(Some("namespace1"), None), false, None).expect("creds");
        assert_eq!(creds.environment.as_deref(), Some("managed-environment-staging"));
        assert_eq!(creds.namespace.as_deref(), Some("namespace1"));
        assert_eq!(destination(&env_with(Some(""), None), false, None), Err(TARGET_NAMESPACE_MISSING.to_owned()));

        let claim = env_with(None, Some("dtc"));
        assert_eq!(destination(&claim, false, None), Err(CLAIM_MISSING.to_owned()));
        assert_eq!(destination(&claim, true, None), Err(TARGET_MISSING.to_owned()));
        let mut target = DeploymentTarget::new("dt", DeploymentTargetSpec::default());
        target.spec.kubernetes_credentials.default_namespace = "space".into();
        let bound = destination(&claim, true, Some(&target)).expect("bound");
        assert_eq!(
            (bound.environment.as_deref(), bound.namespace.as_deref()),
            (Some("managed-environment-staging"), Some("space"))
        );
        target.spec.kubernetes_credentials.default_namespace.clear();
        assert_eq!(destination(&claim, true, Some(&target)).expect("bound").namespace, None);
    }

    #[test]
    fn labels_keep_only_appstudio_keys_and_refuse_long_values() {
        let given = BTreeMap::from([
            ("appstudio.openshift.io".to_owned(), "testing".to_owned()),
            ("team".to_owned(), "a".to_owned()),
        ]);
        let labels = labels(Some(&given), "app", "comp", "env").expect("labels");
        assert_eq!(
            labels,
            BTreeMap::from([
                ("appstudio.openshift.io".to_owned(), "testing".to_owned()),
                (APPLICATION_LABEL.to_owned(), "app".to_owned()),
                (COMPONENT_LABEL.to_owned(), "comp".to_owned()),
                (ENVIRONMENT_LABEL.to_owned(), "env".to_owned()),
            ])
        );
        assert!(super::labels(None, &"a".repeat(64), "c", "e").is_err());
        assert_eq!(
            appstudio_labels(&given),
            BTreeMap::from([("appstudio.openshift.io".to_owned(), "testing".to_owned())])
        );
    }

    #[test]
    fn a_component_becomes_an_automated_deployment_of_its_overlay() {
        let binding = SnapshotEnvironmentBinding::new(
            "b",
            SnapshotEnvironmentBindingSpec {
                application: "app".into(),
                environment: "staging".into(),
                ..SnapshotEnvironmentBindingSpec::default()
            },
        );
        let component = BindingStatusComponent {
            name: "comp".into(),
            gitops_repository: BindingComponentGitOpsRepository {
                url: "https://git.example.invalid/repo".into(),
                branch: "main".into(),
                path: "components/comp/overlays/staging".into(),
                ..BindingComponentGitOpsRepository::default()
            },
            ..BindingStatusComponent::default()
        };
        let expected = expected(&binding, &component, &DeploymentDestination::default()).expect("expected");
        assert_eq!(expected.name, "b-app-staging-comp");
        assert_eq!(expected.spec.type_, "automated");
        assert_eq!(expected.spec.source.path, "components/comp/overlays/staging");
        assert_eq!(expected.spec.source.target_revision.as_deref(), Some("main"));
        assert_eq!(expected.labels.get(COMPONENT_LABEL).map(String::as_str), Some("comp"));
    }

    #[test]
    fn duplicates_are_found() {
        let component = |name: &str| BindingStatusComponent { name: name.into(), ..BindingStatusComponent::default() };
        assert_eq!(duplicate_component(&[component("a"), component("b")]), None);
        assert_eq!(duplicate_component(&[component("a"), component("b"), component("a")]), Some("a"));
    }
}
