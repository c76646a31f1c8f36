//! The names, labels and annotations the layer writes, exactly as the original
//! service spelled them: tenants' tooling and the original's tests find objects by
//! them.

use sha2::{Digest, Sha256};

/// The field manager of every object the layer applies.
pub const FIELD_MANAGER: &str = "gitops-appstudio";

/// The ManagedEnvironment made for Environment `environment`.
pub fn managed_environment_name(environment: &str) -> String {
    format!("managed-environment-{environment}")
}

/// The copy of a DeploymentTarget's (Opaque) Secret made for Environment `environment`.
pub fn managed_environment_secret_name(environment: &str) -> String {
    format!("managed-environment-secret-{environment}")
}

/// The type of Secret a ManagedEnvironment's credentials are copied into.
pub const MANAGED_ENVIRONMENT_SECRET_TYPE: &str = "managed-gitops.redhat.com/managed-environment";
/// Label on a copied Secret naming its Environment.
pub const ENVIRONMENT_SECRET_LABEL: &str = "appstudio.openshift.io/environment-secret";

/// Labels on every GitOpsDeployment of a binding.
pub const APPLICATION_LABEL: &str = "appstudio.openshift.io/application";
pub const COMPONENT_LABEL: &str = "appstudio.openshift.io/component";
pub const ENVIRONMENT_LABEL: &str = "appstudio.openshift.io/environment";
/// A binding label is copied to its GitOpsDeployments when its key contains this.
pub const APPSTUDIO_LABEL_MARK: &str = "appstudio.openshift.io";

/// The longest generated GitOpsDeployment name before the shorter forms are used.
const MAX_DEPLOYMENT_NAME: usize = 250;
/// How much of `<binding>-<component>` a hashed name keeps.
const HASHED_PREFIX: usize = 180;

/// The GitOpsDeployment of `component` in `binding`: `<binding>-<app>-<env>-<comp>`;
/// over 250 characters `<binding>-<comp>`; still over, the first 180 characters of
/// that, `-` and the lowercase hex SHA-256 of it.
pub fn binding_deployment_name(binding: &str, application: &str, environment: &str, component: &str) -> String {
    let long = format!("{binding}-{application}-{environment}-{component}");
    if long.len() <= MAX_DEPLOYMENT_NAME {
        return long;
    }
    let short = format!("{binding}-{component}");
    if short.len() <= MAX_DEPLOYMENT_NAME {
        return short;
    }
    let prefix: String = short.chars().take(HASHED_PREFIX).collect();
    format!("{prefix}-{}", sha256_hex(&short))
}

/// Lowercase hex SHA-256 of `text`.
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// On a claim once binding is complete (`"true"`).
pub const ANN_BIND_COMPLETED: &str = "dt.appstudio.redhat.com/bind-complete";
/// On a claim whose target the controller chose (`"true"`).
pub const ANN_BOUND_BY_CONTROLLER: &str = "dt.appstudio.redhat.com/bound-by-controller";
/// On a claim that waits for a provisioner; the value is the claim's class name.
pub const ANN_DT_PROVISIONER: &str = "provisioner.appstudio.redhat.com/dt-provisioner";
/// The binder's finalizer on claims.
pub const FINALIZER_BINDER: &str = "binder.appstudio.redhat.com/finalizer";
/// The reclaimer's finalizer on targets.
pub const FINALIZER_DT: &str = "dt.appstudio.redhat.com/finalizer";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployment_names_follow_the_three_lengths() {
        assert_eq!(binding_deployment_name("b", "app", "staging", "comp"), "b-app-staging-comp");

        // The original's test: env 63×e, app 63×a, binding 111×b.
        let (env, app, binding) = ("e".repeat(63), "a".repeat(63), "b".repeat(111));
        let name = binding_deployment_name(&binding, &app, &env, "component-a");
        assert_eq!(name, format!("{binding}-component-a"));

        // Binding `abcde`×50: the first 180 characters, `-`, the hash of the short form.
        let binding = "abcde".repeat(50);
        let short = format!("{binding}-component-a");
        let name = binding_deployment_name(&binding, "app", "staging", "component-a");
        assert_eq!(name, format!("{}-{}", &short[..180], sha256_hex(&short)));
        assert_eq!(name.len(), 180 + 1 + 64);
    }

    #[test]
    fn sha256_is_lowercase_hex() {
        assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
