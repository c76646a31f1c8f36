//! The writer's admission webhook as a test (or the local stack) registers it: a
//! throwaway CA and a serving certificate for 127.0.0.1, written to files the writer
//! reads, and a ValidatingWebhookConfiguration that sends the tenant resources'
//! CREATE and UPDATE to `https://127.0.0.1:PORT/validate` — a URL, never a Service,
//! so the API server dials only loopback.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// A serving certificate for 127.0.0.1 and the CA that signed it, as files.
#[derive(Debug, Clone)]
pub struct ServingCert {
    pub ca_pem: String,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Why a serving certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("generate a certificate")]
    Generate(#[from] rcgen::Error),
    #[error("write {path}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Generates a CA and a certificate for 127.0.0.1, ::1 and localhost into `dir`.
pub fn serving_cert(dir: &Path) -> Result<ServingCert, CertError> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "gitops-webhook-ca");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca = ca_params.self_signed(&ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "::1".to_owned(), "localhost".to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, "gitops-writer-webhook");
    let cert = params.signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))?;
    let cert_file = dir.join("webhook.crt");
    let key_file = dir.join("webhook.key");
    let write = |path: &Path, text: String| {
        std::fs::write(path, text).map_err(|source| CertError::Write { path: path.to_owned(), source })
    };
    write(&cert_file, cert.pem())?;
    write(&key_file, key.serialize_pem())?;
    Ok(ServingCert { ca_pem: ca.pem(), cert_file, key_file })
}

/// The configuration: GitOpsDeployments and SyncRuns (and the other two kinds),
/// CREATE and UPDATE, `failurePolicy: Fail`, 5 s, to `url`; only namespaces labelled
/// `selector` when given (tests share one API server).
pub fn configuration(
    name: &str,
    url: &str,
    ca_pem: &str,
    selector: Option<(&str, &str)>,
) -> ValidatingWebhookConfiguration {
    let rules = Rules {
        webhook: "tenant-resources.managed-gitops.redhat.com",
        group: "managed-gitops.redhat.com",
        resources: &[
            "gitopsdeployments",
            "gitopsdeploymentsyncruns",
            "gitopsdeploymentmanagedenvironments",
            "gitopsdeploymentrepositorycredentials",
        ],
        side_effects: "NoneOnDryRun",
    };
    webhook_configuration(name, url, ca_pem, selector, &rules)
}

/// The AppStudio layer's configuration (`ops/deploy/appstudio/webhook.yaml` with a
/// URL): Environments, bindings, Snapshots, PromotionRuns and DeploymentTargets.
pub fn appstudio_configuration(
    name: &str,
    url: &str,
    ca_pem: &str,
    selector: Option<(&str, &str)>,
) -> ValidatingWebhookConfiguration {
    let rules = Rules {
        webhook: "appstudio-resources.appstudio.redhat.com",
        group: "appstudio.redhat.com",
        resources: &[
            "environments",
            "snapshotenvironmentbindings",
            "snapshotenvironmentbindings/status",
            "snapshots",
            "promotionruns",
            "deploymenttargets",
        ],
        side_effects: "None",
    };
    webhook_configuration(name, url, ca_pem, selector, &rules)
}

/// What one configuration's single webhook judges.
struct Rules {
    webhook: &'static str,
    group: &'static str,
    resources: &'static [&'static str],
    side_effects: &'static str,
}

fn webhook_configuration(
    name: &str,
    url: &str,
    ca_pem: &str,
    selector: Option<(&str, &str)>,
    rules: &Rules,
) -> ValidatingWebhookConfiguration {
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let namespace_selector = match selector {
        Some((key, value)) => serde_json::json!({"matchLabels": {key: value}}),
        None => serde_json::json!({}),
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": rules.webhook,
            "clientConfig": {"url": url, "caBundle": bundle},
            "rules": [{
                "apiGroups": [rules.group],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": rules.resources,
                "scope": "Namespaced"
            }],
            "namespaceSelector": namespace_selector,
            "failurePolicy": "Fail",
            "sideEffects": rules.side_effects,
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5
        }]
    }))
    .unwrap_or_default()
}

/// Applies the configuration.
pub async fn register(kube: &kube::Client, configuration: &ValidatingWebhookConfiguration) -> Result<(), kube::Error> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(kube.clone());
    let name = configuration.metadata.name.clone().unwrap_or_default();
    api.patch(&name, &PatchParams::apply("gitops-testkit").force(), &Patch::Apply(configuration)).await.map(drop)
}

/// Removes a configuration (gone already is fine).
pub async fn unregister(kube: &kube::Client, name: &str) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(kube.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
}
