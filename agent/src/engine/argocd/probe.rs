//! Whether Argo CD itself makes progress: a service-owned AppProject and
//! Application (never a tenant's) that Argo CD's application controller refreshes on
//! request, stamping `status.reconciledAt`. Each probe reads the stamp and asks for
//! the next refresh; a stamp that stops changing means a stuck or stopped
//! controller, though the API still answers. The probe Application names a
//! repository and cluster under `.invalid`, and has no sync policy: nothing is ever
//! fetched from it or deployed.

use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{ArgoCdEngine, classify};
use crate::engine::{EngineError, ProgressStamp};
use crate::names::{FIELD_MANAGER, MANAGED_BY_LABEL};

/// The probe's AppProject and Application.
pub const PROBE_NAME: &str = "gitops-service-probe";
/// Not the agent's `managed-by` value: the sweep never takes the probe for an orphan.
const PROBE_MANAGED_BY: &str = "gitops-agent-probe";
const PROBE_REPO: &str = "https://probe.gitops-service.invalid/probe.git";
const PROBE_SERVER: &str = "https://probe.gitops-service.invalid";
const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

impl ArgoCdEngine {
    /// The probe Application's `status.reconciledAt` (unstamped until Argo CD
    /// stamped it, or when the probe had to be made), after asking for the next refresh.
    pub(super) async fn probe_progress_once(&self) -> Result<ProgressStamp, EngineError> {
        let apps = self.applications();
        let existing = apps.get_opt(PROBE_NAME).await.map_err(|e| classify("read the probe Application".into(), e))?;
        let Some(app) = existing else {
            self.create_probe().await?;
            return Ok(ProgressStamp::Unstamped);
        };
        let stamp = match app.data.pointer("/status/reconciledAt").and_then(|v| v.as_str()) {
            Some(stamp) => ProgressStamp::Stamp(stamp.to_owned()),
            None => ProgressStamp::Unstamped,
        };
        let refresh = json!({"metadata": {"annotations": {REFRESH_ANNOTATION: "normal"}}});
        apps.patch(PROBE_NAME, &PatchParams::default(), &Patch::Merge(&refresh))
            .await
            .map_err(|e| classify("ask Argo CD to refresh the probe Application".into(), e))?;
        Ok(stamp)
    }

    async fn create_probe(&self) -> Result<(), EngineError> {
        let labels = json!({MANAGED_BY_LABEL: PROBE_MANAGED_BY});
        let project = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": PROBE_NAME, "namespace": self.namespace(), "labels": labels},
            "spec": {"sourceRepos": [PROBE_REPO], "destinations": [{"server": PROBE_SERVER, "namespace": "probe"}]},
        });
        let application = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": PROBE_NAME, "namespace": self.namespace(), "labels": labels,
                         "annotations": {REFRESH_ANNOTATION: "normal"}},
            "spec": {"project": PROBE_NAME,
                     "source": {"repoURL": PROBE_REPO, "path": ".", "targetRevision": "HEAD"},
                     "destination": {"server": PROBE_SERVER, "namespace": "probe"}},
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        self.projects()
            .patch(PROBE_NAME, &params, &Patch::Apply(&project))
            .await
            .map_err(|e| classify("create the probe AppProject".into(), e))?;
        self.applications()
            .patch(PROBE_NAME, &params, &Patch::Apply(&application))
            .await
            .map_err(|e| classify("create the probe Application".into(), e))?;
        Ok(())
    }
}
