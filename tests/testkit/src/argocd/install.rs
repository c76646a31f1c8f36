//! Installs the Application and AppProject CRDs and waits until the API server
//! serves them. A cluster may run a real Argo CD, whose CRDs must not be replaced
//! by our trimmed ones: a CRD that exists without this test kit's
//! `app.kubernetes.io/managed-by` label is left alone unless the caller says to
//! replace it (Argo CD's own CRDs are a superset of ours, so the stand-in works
//! with them).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use tracing::info;

use super::StandinError;
use super::crds::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, app_project_crd, application_crd};

/// Field manager of the CRD writes.
const CRD_FIELD_MANAGER: &str = "argocd-standin";

/// What to do with an `argoproj.io` CRD that this test kit did not install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignCrds {
    /// Leave it as it is and use it.
    Keep,
    /// Take it over with our shape.
    Replace,
}

/// What happened to one CRD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrdOutcome {
    /// Created or updated to our shape.
    Applied,
    /// Someone else's CRD, kept as it was.
    KeptForeign,
}

/// Creates or updates both CRDs (per `foreign`) and waits up to `timeout` for
/// each to be `Established`. Returns each CRD's name and outcome.
pub async fn install_crds(
    client: &Client,
    foreign: ForeignCrds,
    timeout: Duration,
) -> Result<Vec<(String, CrdOutcome)>, StandinError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut outcomes = Vec::new();
    for crd in [application_crd(), app_project_crd()] {
        let name = crd.name_any();
        let existing = api.get_opt(&name).await.map_err(|source| StandinError::Crd {
            action: "read",
            name: name.clone(),
            source,
        })?;
        let ours = |crd: &CustomResourceDefinition| {
            crd.labels().get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY_VALUE)
        };
        let outcome = match existing {
            Some(existing) if !ours(&existing) && foreign == ForeignCrds::Keep => CrdOutcome::KeptForeign,
            _ => {
                let params = PatchParams::apply(CRD_FIELD_MANAGER).force();
                api.patch(&name, &params, &Patch::Apply(&crd)).await.map_err(|source| StandinError::Crd {
                    action: "apply",
                    name: name.clone(),
                    source,
                })?;
                CrdOutcome::Applied
            }
        };
        match tokio::time::timeout(timeout, await_condition(api.clone(), &name, conditions::is_crd_established())).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(source)) => return Err(StandinError::CrdWait { name, source }),
            Err(_) => return Err(StandinError::CrdNotEstablished { name, timeout }),
        }
        info!(crd = %name, outcome = ?outcome, "CRD established");
        outcomes.push((name, outcome));
    }
    Ok(outcomes)
}
