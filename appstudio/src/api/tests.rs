//! The types against their CRDs: what the Rust types send always satisfies each
//! schema's `required` lists (the original's clients always send those fields), the
//! JSON names are the original's, and the CRDs carry the short names and scope.

use kube::{CustomResourceExt, Resource};
use serde_json::{Value, json};

use super::*;

/// Every `required` property of `schema` (and of the schemas of the properties,
/// array items included) present in `value`, reporting the JSON path of the first
/// one missing.
fn check_required(schema: &Value, value: &Value, path: &str) -> Result<(), String> {
    if let (Some(required), Some(object)) = (schema.get("required").and_then(Value::as_array), value.as_object()) {
        for name in required.iter().filter_map(Value::as_str) {
            if !object.contains_key(name) {
                return Err(format!("{path}.{name} is required by the CRD but not sent"));
            }
        }
    }
    if let (Some(properties), Some(object)) = (schema.get("properties").and_then(Value::as_object), value.as_object()) {
        for (name, property) in properties {
            if let Some(inner) = object.get(name) {
                check_required(property, inner, &format!("{path}.{name}"))?;
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (index, inner) in array.iter().enumerate() {
            check_required(items, inner, &format!("{path}[{index}]"))?;
        }
    }
    Ok(())
}

fn schema_of<K: CustomResourceExt>() -> Value {
    let crd = serde_json::to_value(K::crd()).expect("a CRD serialises");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn assert_sends_required<K: CustomResourceExt + serde::Serialize>(object: &K) {
    let value = serde_json::to_value(object).expect("serialises");
    if let Err(missing) = check_required(&schema_of::<K>(), &value, "") {
        panic!("{missing}: {value}");
    }
}

#[test]
fn defaults_and_full_objects_send_every_required_field() {
    assert_sends_required(&Environment::new("e", EnvironmentSpec::default()));
    let mut environment = Environment::new("e", EnvironmentSpec::default());
    environment.spec.unstable_configuration_fields = Some(UnstableEnvironmentConfiguration::default());
    environment.spec.configuration.env.push(EnvVarPair::default());
    environment.status = Some(EnvironmentStatus { conditions: vec![Condition::default()] });
    assert_sends_required(&environment);

    let mut snapshot = Snapshot::new("s", SnapshotSpec::default());
    snapshot.spec.components.push(SnapshotComponent {
        source: Some(ComponentSource { git: Some(GitSource::default()) }),
        ..SnapshotComponent::default()
    });
    assert_sends_required(&snapshot);

    let mut binding = SnapshotEnvironmentBinding::new("b", SnapshotEnvironmentBindingSpec::default());
    binding
        .spec
        .components
        .push(BindingComponent { name: "c".into(), configuration: Some(BindingComponentConfiguration::default()) });
    binding.status = Some(SnapshotEnvironmentBindingStatus {
        components: vec![BindingStatusComponent::default()],
        gitops_repo_conditions: vec![Condition::default()],
        gitops_deployments: vec![BindingStatusGitOpsDeployment::default()],
        component_deployment_conditions: vec![Condition::default()],
        binding_conditions: vec![Condition::default()],
    });
    assert_sends_required(&binding);

    let mut run = PromotionRun::new("p", PromotionRunSpec::default());
    run.status = Some(PromotionRunStatus {
        environment_status: vec![PromotionRunEnvironmentStatus::default()],
        conditions: vec![PromotionRunCondition::default()],
        ..PromotionRunStatus::default()
    });
    assert_sends_required(&run);

    let mut target = DeploymentTarget::new("t", DeploymentTargetSpec::default());
    target.status = Some(DeploymentTargetStatus { phase: None, conditions: vec![Condition::default()] });
    assert_sends_required(&target);
    assert_sends_required(&DeploymentTargetClaim::new("c", DeploymentTargetClaimSpec::default()));
    assert_sends_required(&DeploymentTargetClass::new("k", DeploymentTargetClassSpec::default()));
    assert_sends_required(&Application::new("a", ApplicationSpec::default()));
    assert_sends_required(&Component::new("c", ComponentSpec::default()));
}

#[test]
fn the_checker_notices_a_missing_required_field() {
    let schema = schema_of::<Environment>();
    let incomplete = json!({"spec": {"displayName": ""}});
    assert_eq!(
        check_required(&schema, &incomplete, ""),
        Err(".spec.deploymentStrategy is required by the CRD but not sent".to_owned())
    );
}

#[test]
fn json_names_are_the_originals() {
    let mut environment = Environment::new("e", EnvironmentSpec::default());
    environment.spec.unstable_configuration_fields = Some(UnstableEnvironmentConfiguration {
        cluster_type: Some("Kubernetes".into()),
        kubernetes_credentials: KubernetesClusterCredentials {
            api_url: "https://127.0.0.1:6443".into(),
            cluster_resources: true,
            ..KubernetesClusterCredentials::default()
        },
    });
    let value = serde_json::to_value(&environment.spec).expect("serialises");
    assert_eq!(
        value,
        json!({
            "displayName": "", "deploymentStrategy": "",
            "configuration": {"target": {"deploymentTargetClaim": {"claimName": ""}}},
            "unstableConfigurationFields": {
                "clusterType": "Kubernetes", "targetNamespace": "", "apiURL": "https://127.0.0.1:6443",
                "clusterCredentialsSecret": "", "allowInsecureSkipTLSVerify": false, "clusterResources": true
            }
        })
    );

    let status = SnapshotEnvironmentBindingStatus {
        components: vec![BindingStatusComponent::default()],
        gitops_repo_conditions: vec![],
        gitops_deployments: vec![BindingStatusGitOpsDeployment::default()],
        ..SnapshotEnvironmentBindingStatus::default()
    };
    assert_eq!(
        serde_json::to_value(&status).expect("serialises"),
        json!({
            "components": [{"name": "", "gitopsRepository": {
                "url": "", "branch": "", "path": "", "generatedResources": [], "commitID": ""}}],
            "gitopsDeployments": [{
                "componentName": "", "gitopsDeployment": "", "syncStatus": "", "health": "", "commitID": ""}]
        })
    );
    let spec = PromotionRunSpec { snapshot: "s".into(), application: "a".into(), ..PromotionRunSpec::default() };
    assert_eq!(
        serde_json::to_value(&spec).expect("serialises"),
        json!({"snapshot": "s", "application": "a", "manualPromotion": {"targetEnvironment": ""},
               "automatedPromotion": {"initialEnvironment": ""}})
    );
}

#[test]
fn crds_have_the_short_names_and_scope() {
    let names = |crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| {
        (crd.spec.names.short_names.clone().unwrap_or_default(), crd.spec.scope.clone())
    };
    let expected: [(&str, &[&str], &str); 7] = [
        ("environments", &["env"], "Namespaced"),
        ("snapshots", &["as", "snapshot"], "Namespaced"),
        ("snapshotenvironmentbindings", &["aseb", "binding"], "Namespaced"),
        ("promotionruns", &["apr", "promotion"], "Namespaced"),
        ("deploymenttargets", &["dt"], "Namespaced"),
        ("deploymenttargetclaims", &["dtc"], "Namespaced"),
        ("deploymenttargetclasses", &["dtcls"], "Cluster"),
    ];
    let crds = crds();
    assert_eq!(crds.len(), expected.len());
    for (crd, (plural, short, scope)) in crds.iter().zip(expected) {
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(crd.spec.group, GROUP);
        let (short_names, crd_scope) = names(crd);
        assert_eq!(short_names, short, "{plural}");
        assert_eq!(crd_scope, scope, "{plural}");
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "{plural} has status");
        assert!(version.additional_printer_columns.as_ref().is_some_and(|c| c.len() >= 2), "{plural} columns");
    }
    assert_eq!(DeploymentTargetClass::api_version(&()), API_VERSION);
}

#[test]
fn objects_written_by_other_clients_read() {
    let binding: SnapshotEnvironmentBinding = serde_json::from_value(json!({
        "apiVersion": API_VERSION, "kind": "SnapshotEnvironmentBinding",
        "metadata": {"name": "b"},
        "spec": {"application": "a", "environment": "e", "snapshot": "s", "components": [{"name": "c"}]},
        "status": {"components": [{"name": "c", "gitopsRepository": {"url": "https://git.example.invalid/r",
            "branch": "main", "path": "components/c/overlays/e", "generatedResources": [], "commitID": "abc"}}]}
    }))
    .expect("reads");
    let status = binding.status.expect("status");
    assert_eq!(status.components[0].gitops_repository.commit_id, "abc");
}
