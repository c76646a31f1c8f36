//! The layer's apply-time rules, decided without I/O: what the admission webhook
//! refuses, in the original's words where its tests match them, and what the
//! controllers check again when no webhook is installed. A refusal is the message
//! the client prints.
//!
//! Go's `%+v` dumps in the original's messages are rendered for the value fields
//! (strings and nested structs); pointers, which Go prints as addresses, are left
//! out.

use crate::api::{
    DeploymentTargetSpec, EnvironmentSpec, PromotionRunSpec, SnapshotComponent, SnapshotEnvironmentBindingSpec,
    SnapshotSpec,
};

/// The sentence the original's Environment webhook attaches to a bad API URL.
pub const API_URL_SENTENCE: &str = "API URL must be an absolute URL starting with an 'https' scheme";

/// Whether `value` is a DNS-1123 label: 1–63 lower-case alphanumerics or '-',
/// starting and ending with an alphanumeric.
pub fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// Whether `value` is a DNS-1123 subdomain: at most 253 characters of labels joined by '.'.
pub fn is_dns_subdomain(value: &str) -> bool {
    value.len() <= 253 && value.split('.').all(is_dns_label)
}

/// The name of a new Environment.
pub fn environment_name(name: &str) -> Result<(), String> {
    if is_dns_label(name) {
        return Ok(());
    }
    Err(format!(
        "invalid environment name: {name}, an environment resource name must start with a lower case alphabetical \
         character, be under 63 characters, and can only consist of lower case alphanumeric characters or ‘-’"
    ))
}

/// An API URL the GitOps engine may be pointed at: absolute, `https`, and (unless
/// `allow_private`, the core's `--api-url-allow-private`) not a loopback,
/// link-local or metadata address — the core's own rules, so what passes here
/// passes the ManagedEnvironment's checks too.
pub fn api_url(field: &str, url: &str, allow_private: bool) -> Result<(), String> {
    let valid = gitops_writer::validate::api_url(field, url)
        .map_err(|invalid| format!("{}: {API_URL_SENTENCE}", invalid.message))?;
    if !allow_private {
        gitops_writer::validate::public_api_url(field, &valid).map_err(|invalid| invalid.message)?;
    }
    Ok(())
}

/// An Environment's fields (its name is checked on create only, as the original).
pub fn environment(spec: &EnvironmentSpec, allow_private: bool) -> Result<(), String> {
    let Some(unstable) = &spec.unstable_configuration_fields else { return Ok(()) };
    let ingress = unstable.kubernetes_credentials.ingress_domain.as_deref().unwrap_or_default();
    if unstable.cluster_type.as_deref() == Some("Kubernetes") && ingress.is_empty() {
        return Err("ingress domain cannot be empty if cluster is of type Kubernetes".to_owned());
    }
    if !ingress.is_empty() && !is_dns_subdomain(ingress) {
        return Err(format!(
            "invalid ingress domain: {ingress}, it must consist of lower case alphanumeric characters, '-' or '.', \
             and must start and end with an alphanumeric character"
        ));
    }
    let url = &unstable.kubernetes_credentials.api_url;
    if !url.is_empty() {
        api_url("spec.unstableConfigurationFields.apiURL", url, allow_private)?;
    }
    Ok(())
}

/// A DeploymentTarget's credentials (the original left it unchecked).
pub fn deployment_target(spec: &DeploymentTargetSpec, allow_private: bool) -> Result<(), String> {
    api_url("spec.kubernetesCredentials.apiURL", &spec.kubernetes_credentials.api_url, allow_private)
}

/// The refusal of a binding that repeats an older one's (application, environment).
pub fn duplicate_binding(spec: &SnapshotEnvironmentBindingSpec, other: &str) -> String {
    format!(
        "invalid SnapshotEnvironmentBinding: duplicate combination of Application ({}) and Environment ({}). \
         Duplicated by: {other}",
        spec.application, spec.environment
    )
}

/// A binding's change: its application and environment are fixed at creation.
pub fn binding_update(
    old: &SnapshotEnvironmentBindingSpec,
    new: &SnapshotEnvironmentBindingSpec,
) -> Result<(), String> {
    if old.application != new.application {
        return Err(format!("application field cannot be updated to {}", new.application));
    }
    if old.environment != new.environment {
        return Err(format!("environment field cannot be updated to {}", new.environment));
    }
    Ok(())
}

/// A Snapshot's change: its application and components are fixed at creation.
pub fn snapshot_update(old: &SnapshotSpec, new: &SnapshotSpec) -> Result<(), String> {
    if old.application != new.application {
        return Err(format!("application field cannot be updated to {}", new.application));
    }
    if old.components != new.components {
        return Err(format!("components cannot be updated to {}", go_components(&new.components)));
    }
    Ok(())
}

/// A PromotionRun's change: its spec is fixed at creation.
pub fn promotion_update(old: &PromotionRunSpec, new: &PromotionRunSpec) -> Result<(), String> {
    if old == new {
        return Ok(());
    }
    Err(format!(
        "spec cannot be updated to {{Snapshot:{} Application:{} ManualPromotion:{{TargetEnvironment:{}}} \
         AutomatedPromotion:{{InitialEnvironment:{}}}}}",
        new.snapshot,
        new.application,
        new.manual_promotion.target_environment,
        new.automated_promotion.initial_environment
    ))
}

/// Whether following `parentEnvironment` from `start` (an Environment named `name`
/// whose parent is `start`) comes back to `name`; `parent_of` looks an
/// Environment's parent up. Returns the cycle's path when it does.
pub fn parent_cycle(name: &str, start: Option<&str>, parent_of: impl Fn(&str) -> Option<String>) -> Option<String> {
    let mut path = vec![name.to_owned()];
    let mut next = start.filter(|p| !p.is_empty()).map(str::to_owned);
    while let Some(current) = next {
        let closes = current == name;
        if path.contains(&current) && !closes {
            // A cycle further up that does not pass through this Environment: the
            // Environment that closed it was refused or checked on its own.
            return None;
        }
        path.push(current.clone());
        if closes {
            return Some(path.join(" → "));
        }
        next = parent_of(&current).filter(|p| !p.is_empty());
    }
    None
}

/// The refusal of an Environment whose parents lead back to it.
pub fn cycle_refusal(path: &str) -> String {
    format!("invalid parentEnvironment: the environments' parents form a cycle ({path})")
}

fn go_components(components: &[SnapshotComponent]) -> String {
    let items: Vec<String> =
        components.iter().map(|c| format!("{{Name:{} ContainerImage:{}}}", c.name, c.container_image)).collect();
    format!("[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        AutomatedPromotionConfiguration, KubernetesClusterCredentials, ManualPromotionConfiguration,
        UnstableEnvironmentConfiguration,
    };

    fn env_with(api_url: &str, cluster_type: Option<&str>, ingress: Option<&str>) -> EnvironmentSpec {
        EnvironmentSpec {
            unstable_configuration_fields: Some(UnstableEnvironmentConfiguration {
                cluster_type: cluster_type.map(str::to_owned),
                kubernetes_credentials: KubernetesClusterCredentials {
                    target_namespace: "team".into(),
                    api_url: api_url.into(),
                    ingress_domain: ingress.map(str::to_owned),
                    cluster_credentials_secret: "creds".into(),
                    ..KubernetesClusterCredentials::default()
                },
            }),
            ..EnvironmentSpec::default()
        }
    }

    #[test]
    fn environment_names_are_dns_labels_in_the_originals_words() {
        assert!(environment_name("staging").is_ok());
        assert!(environment_name("prod-2").is_ok());
        for bad in ["", "Staging", "-prod", "prod-", "prod_1", "a.b", &"e".repeat(64)] {
            let message = environment_name(bad).expect_err(bad);
            assert!(message.starts_with(&format!("invalid environment name: {bad}, ")), "{message}");
            assert!(message.ends_with("lower case alphanumeric characters or ‘-’"), "{message}");
        }
        assert!(environment_name(&"e".repeat(63)).is_ok());
    }

    #[test]
    fn api_urls_must_be_absolute_https_and_public_unless_allowed() {
        assert_eq!(environment(&env_with("https://api.example.invalid:6443", None, None), false), Ok(()));
        for bad in ["api/test-url.com:6443", "http://api.example.invalid:6443", "ftp://api.example.invalid"] {
            let message = environment(&env_with(bad, None, None), false).expect_err(bad);
            assert!(message.ends_with(API_URL_SENTENCE), "{message}");
        }
        let loopback = env_with("https://127.0.0.1:6443", None, None);
        assert!(environment(&loopback, false).is_err_and(|m| m.contains("loopback")));
        assert_eq!(environment(&loopback, true), Ok(()));
        // No cluster at all is the home case: nothing to check.
        assert_eq!(environment(&EnvironmentSpec::default(), false), Ok(()));
    }

    #[test]
    fn a_kubernetes_cluster_needs_a_valid_ingress_domain() {
        let url = "https://api.example.invalid";
        assert_eq!(
            environment(&env_with(url, Some("Kubernetes"), None), false),
            Err("ingress domain cannot be empty if cluster is of type Kubernetes".to_owned())
        );
        assert_eq!(environment(&env_with(url, Some("Kubernetes"), Some("apps.example.invalid")), false), Ok(()));
        assert!(
            environment(&env_with(url, Some("OpenShift"), Some("Apps_Bad")), false)
                .is_err_and(|m| m.starts_with("invalid ingress domain: Apps_Bad"))
        );
        assert_eq!(environment(&env_with(url, Some("OpenShift"), None), false), Ok(()));
    }

    #[test]
    fn bindings_keep_application_and_environment() {
        let old = SnapshotEnvironmentBindingSpec {
            application: "app".into(),
            environment: "staging".into(),
            snapshot: "s1".into(),
            ..SnapshotEnvironmentBindingSpec::default()
        };
        let moved_snapshot = SnapshotEnvironmentBindingSpec { snapshot: "s2".into(), ..old.clone() };
        assert_eq!(binding_update(&old, &moved_snapshot), Ok(()));
        let other_app = SnapshotEnvironmentBindingSpec { application: "app2".into(), ..old.clone() };
        assert_eq!(binding_update(&old, &other_app), Err("application field cannot be updated to app2".to_owned()));
        let other_env = SnapshotEnvironmentBindingSpec { environment: "prod".into(), ..old.clone() };
        assert_eq!(binding_update(&old, &other_env), Err("environment field cannot be updated to prod".to_owned()));
        assert_eq!(
            duplicate_binding(&old, "first"),
            "invalid SnapshotEnvironmentBinding: duplicate combination of Application (app) and Environment \
             (staging). Duplicated by: first"
        );
    }

    #[test]
    fn snapshots_keep_application_and_components() {
        let component = |image: &str| SnapshotComponent {
            name: "c1".into(),
            container_image: image.into(),
            ..SnapshotComponent::default()
        };
        let old =
            SnapshotSpec { application: "app".into(), components: vec![component("a:1")], ..SnapshotSpec::default() };
        let relabelled = SnapshotSpec { display_name: Some("shown".into()), ..old.clone() };
        assert_eq!(snapshot_update(&old, &relabelled), Ok(()));
        let other_app = SnapshotSpec { application: "app2".into(), ..old.clone() };
        assert_eq!(snapshot_update(&old, &other_app), Err("application field cannot be updated to app2".to_owned()));
        let other_image = SnapshotSpec { components: vec![component("a:2")], ..old.clone() };
        assert_eq!(
            snapshot_update(&old, &other_image),
            Err("components cannot be updated to [{Name:c1 ContainerImage:a:2}]".to_owned())
        );
    }

    #[test]
    fn promotion_specs_are_fixed_with_the_originals_dump() {
        let old = PromotionRunSpec {
            snapshot: "s".into(),
            application: "a".into(),
            manual_promotion: ManualPromotionConfiguration { target_environment: "staging".into() },
            automated_promotion: AutomatedPromotionConfiguration::default(),
        };
        assert_eq!(promotion_update(&old, &old.clone()), Ok(()));
        let retargeted = PromotionRunSpec {
            manual_promotion: ManualPromotionConfiguration { target_environment: "prod".into() },
            ..old.clone()
        };
        assert_eq!(
            promotion_update(&old, &retargeted),
            Err("spec cannot be updated to {Snapshot:s Application:a ManualPromotion:{TargetEnvironment:prod} \
                 AutomatedPromotion:{InitialEnvironment:}}"
                .to_owned())
        );
    }

    #[test]
    fn parent_cycles_are_found_through_this_environment_only() {
        let parents = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, p)| (*p).to_owned())
        };
        let chain = parents(&[("staging", "dev"), ("dev", "")]);
        assert_eq!(parent_cycle("prod", Some("staging"), chain), None);
        let back = parents(&[("staging", "dev"), ("dev", "prod")]);
        assert_eq!(parent_cycle("prod", Some("staging"), back), Some("prod → staging → dev → prod".to_owned()));
        assert_eq!(parent_cycle("prod", Some("prod"), parents(&[])), Some("prod → prod".to_owned()));
        // A cycle above that does not include prod is not prod's to refuse.
        let above = parents(&[("staging", "dev"), ("dev", "staging")]);
        assert_eq!(parent_cycle("prod", Some("staging"), above), None);
        assert_eq!(parent_cycle("prod", None, parents(&[])), None);
        assert_eq!(parent_cycle("prod", Some(""), parents(&[])), None);
    }
}
