//! The writer's rules on the spec of an admission request, before anything is
//! stored: the object is read as its Rust type and given to `crate::validate`, the
//! same functions the controllers run, so a refusal here says what the condition
//! would have said. Only rules that need nothing but the object itself run here;
//! whether a named environment or Secret exists stays the controllers' business
//! (they may come in the same apply, after the object naming them).

use kube::api::DynamicObject;
use kube::core::admission::AdmissionRequest;
use serde::de::DeserializeOwned;

use crate::api::{
    GitOpsDeployment, GitOpsDeploymentManagedEnvironment, GitOpsDeploymentRepositoryCredential, GitOpsDeploymentSyncRun,
};
use crate::validate::{self, Invalid, reason};

/// The request's object as `T`; a shape the schema should have refused is refused.
fn read<T: DeserializeOwned>(request: &AdmissionRequest<DynamicObject>) -> Result<T, Invalid> {
    let unreadable = || Invalid::new(reason::INVALID_SPEC, format!("the {} could not be read", request.kind.kind));
    let object = request.object.as_ref().ok_or_else(unreadable)?;
    let value = serde_json::to_value(object).map_err(|_| unreadable())?;
    serde_json::from_value(value).map_err(|_| unreadable())
}

/// Checks a created or changed tenant resource in `namespace`; kinds other than
/// the four pass. `allow_private`: `--api-url-allow-private`.
pub fn check(request: &AdmissionRequest<DynamicObject>, namespace: &str, allow_private: bool) -> Result<(), Invalid> {
    match request.kind.kind.as_str() {
        "GitOpsDeployment" => {
            let object: GitOpsDeployment = read(request)?;
            let valid = validate::deployment(&object.spec)?;
            validate::home_destination(&valid, namespace)
        }
        "GitOpsDeploymentSyncRun" => validate::sync_run(&read::<GitOpsDeploymentSyncRun>(request)?.spec).map(drop),
        "GitOpsDeploymentManagedEnvironment" => {
            let valid = validate::environment(&read::<GitOpsDeploymentManagedEnvironment>(request)?.spec)?;
            if allow_private { Ok(()) } else { validate::public_api_url("spec.apiURL", &valid.api_url) }
        }
        "GitOpsDeploymentRepositoryCredential" => {
            validate::repository_credential(&read::<GitOpsDeploymentRepositoryCredential>(request)?.spec).map(drop)
        }
        _ => Ok(()),
    }
}
