//! GitOpsDeploymentSyncRun rules: the deployment it names and the revision. That
//! the deployment exists, is manual and lives in the same namespace is the
//! controller's check.

use super::text::required;
use super::{Invalid, dns_subdomain, limits, reason};
use crate::api::GitOpsDeploymentSyncRunSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidSyncRun {
    pub deployment_name: String,
    pub revision: String,
}

pub fn sync_run(spec: &GitOpsDeploymentSyncRunSpec) -> Result<ValidSyncRun, Invalid> {
    let deployment_name =
        dns_subdomain("spec.gitopsDeploymentName", &spec.gitops_deployment_name, reason::INVALID_DEPLOYMENT_NAME)?;
    let revision = required("spec.revisionID", &spec.revision_id, limits::REVISION)?;
    if revision.starts_with('-') || revision.chars().any(char::is_whitespace) {
        return Err(Invalid::new(
            reason::INVALID_REVISION_ID,
            "spec.revisionID must be a branch, tag or commit: no spaces, not starting with '-'",
        ));
    }
    Ok(ValidSyncRun { deployment_name, revision: revision.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::reason::*;

    fn run(name: &str, revision: &str) -> Result<ValidSyncRun, Invalid> {
        sync_run(&GitOpsDeploymentSyncRunSpec { gitops_deployment_name: name.into(), revision_id: revision.into() })
    }

    #[test]
    fn valid_runs() {
        assert_eq!(run("web", "main"), Ok(ValidSyncRun { deployment_name: "web".into(), revision: "main".into() }));
        assert!(run("web.v2", "0123456789abcdef0123456789abcdef01234567").is_ok());
        assert_eq!(run("web", "it's;$(x)").map(|r| r.revision), Ok("it's;$(x)".to_owned()));
    }

    #[test]
    fn refusals() {
        assert_eq!(run("Web", "main").unwrap_err().reason, INVALID_DEPLOYMENT_NAME);
        assert_eq!(run("web;drop", "main").unwrap_err().reason, INVALID_DEPLOYMENT_NAME);
        assert_eq!(run("", "main").unwrap_err().reason, FIELD_REQUIRED);
        assert_eq!(run(&"a".repeat(254), "main").unwrap_err().reason, FIELD_TOO_LONG);
        assert_eq!(run("web", "").unwrap_err().reason, FIELD_REQUIRED);
        assert_eq!(run("web", &"a".repeat(256)).unwrap_err().reason, FIELD_TOO_LONG);
        assert_eq!(run("web", "ma\0in").unwrap_err().reason, INVALID_CHARACTERS);
        assert_eq!(run("web", "ma\tin").unwrap_err().reason, INVALID_CHARACTERS);
        assert_eq!(run("web", "-x").unwrap_err().reason, INVALID_REVISION_ID);
        assert_eq!(run("web", "a b").unwrap_err().reason, INVALID_REVISION_ID);
    }
}
