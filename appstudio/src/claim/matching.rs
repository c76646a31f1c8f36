//! Which DeploymentTarget may bind a DeploymentTargetClaim, decided without I/O,
//! as a PersistentVolume may bind a PersistentVolumeClaim.

use crate::api::{DeploymentTarget, DeploymentTargetClaim};

pub const PHASE_AVAILABLE: &str = "Available";

/// Whether `target` may bind `claim`: free or reserved for it, of its class,
/// available, with credentials.
pub fn target_matches(claim: &DeploymentTargetClaim, target: &DeploymentTarget) -> bool {
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let free_or_ours = target.spec.claim_ref.as_deref().is_none_or(|c| c.is_empty() || c == claim_name);
    let phase = target.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
    let credentials = &target.spec.kubernetes_credentials;
    free_or_ours
        && target.metadata.deletion_timestamp.is_none()
        && target.spec.deployment_target_class_name == claim.spec.deployment_target_class_name
        && (phase.is_empty() || phase == PHASE_AVAILABLE)
        && !credentials.api_url.is_empty()
        && !credentials.cluster_credentials_secret.is_empty()
}

/// The target to bind `claim` to among `targets`: one reserved for it first, else a
/// free one (by name, so the choice is stable). With `reserved_only` (the claim
/// waits for a provisioner) only a reserved one.
pub fn choose<'a>(
    claim: &DeploymentTargetClaim,
    targets: &'a [DeploymentTarget],
    reserved_only: bool,
) -> Option<&'a DeploymentTarget> {
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    let mut candidates: Vec<&DeploymentTarget> = targets.iter().filter(|t| target_matches(claim, t)).collect();
    candidates.sort_by_key(|t| (t.spec.claim_ref.as_deref() != Some(claim_name), t.metadata.name.clone()));
    candidates.into_iter().find(|t| !reserved_only || t.spec.claim_ref.as_deref() == Some(claim_name))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{
        DeploymentTargetClaimSpec, DeploymentTargetKubernetesClusterCredentials, DeploymentTargetSpec,
        DeploymentTargetStatus,
    };

    /// A target with credentials, of `class`, reserved for `claim`, in `phase`.
    pub(crate) fn target(name: &str, class: &str, claim: Option<&str>, phase: Option<&str>) -> DeploymentTarget {
        let mut target = DeploymentTarget::new(
            name,
            DeploymentTargetSpec {
                deployment_target_class_name: class.into(),
                kubernetes_credentials: DeploymentTargetKubernetesClusterCredentials {
                    api_url: "https://127.0.0.1:6443".into(),
                    cluster_credentials_secret: "s".into(),
                    ..Default::default()
                },
                claim_ref: claim.map(str::to_owned),
            },
        );
        target.status = Some(DeploymentTargetStatus { phase: phase.map(str::to_owned), conditions: vec![] });
        target
    }

    fn claim() -> DeploymentTargetClaim {
        DeploymentTargetClaim::new(
            "dtc",
            DeploymentTargetClaimSpec { deployment_target_class_name: "cls".into(), target_name: None },
        )
    }

    #[test]
    fn class_phase_claim_and_credentials_decide() {
        let claim = claim();
        assert!(target_matches(&claim, &target("a", "cls", None, None)));
        assert!(target_matches(&claim, &target("a", "cls", Some("dtc"), Some("Available"))));
        assert!(!target_matches(&claim, &target("a", "other", None, None)), "another class");
        assert!(!target_matches(&claim, &target("a", "cls", Some("someone"), None)), "claimed by another");
        assert!(!target_matches(&claim, &target("a", "cls", None, Some("Bound"))), "bound");
        assert!(!target_matches(&claim, &target("a", "cls", None, Some("Released"))), "released");
        let mut bare = target("a", "cls", None, None);
        bare.spec.kubernetes_credentials.api_url.clear();
        assert!(!target_matches(&claim, &bare), "no credentials");
    }

    #[test]
    fn a_reserved_target_wins_and_provisioning_waits_for_one() {
        let claim = claim();
        let targets = vec![target("a-free", "cls", None, None), target("z-reserved", "cls", Some("dtc"), None)];
        assert_eq!(choose(&claim, &targets, false).and_then(|t| t.metadata.name.as_deref()), Some("z-reserved"));
        let free = vec![target("b", "cls", None, None), target("a", "cls", None, None)];
        assert_eq!(choose(&claim, &free, false).and_then(|t| t.metadata.name.as_deref()), Some("a"));
        assert!(choose(&claim, &free, true).is_none());
    }
}
