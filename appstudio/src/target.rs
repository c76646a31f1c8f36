//! Finding the DeploymentTarget a DeploymentTargetClaim is bound to: the one its
//! `targetName` names, else the only one whose `claimRef` names the claim. Both
//! Environments and bindings follow a claim this way, inside the claim's namespace.

use kube::api::{Api, ListParams};

use crate::api::{DeploymentTarget, DeploymentTargetClaim};
use crate::context::{ReconcileError, found};

/// The phase of a bound claim or target.
pub const PHASE_BOUND: &str = "Bound";

/// What following a claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    Target(Box<DeploymentTarget>),
    /// No target is bound to the claim.
    None,
    /// Several targets claim it and none is named: which is meant is unclear.
    Conflict(Vec<String>),
}

/// Picks the target bound to `claim` among `targets` (all of the claim's namespace).
pub fn select(claim: &DeploymentTargetClaim, targets: &[DeploymentTarget]) -> Bound {
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    if let Some(name) = claim.spec.target_name.as_deref().filter(|n| !n.is_empty()) {
        return match targets.iter().find(|t| t.metadata.name.as_deref() == Some(name)) {
            Some(target) => Bound::Target(Box::new(target.clone())),
            None => Bound::None,
        };
    }
    let claiming: Vec<&DeploymentTarget> =
        targets.iter().filter(|t| t.spec.claim_ref.as_deref() == Some(claim_name)).collect();
    match claiming.as_slice() {
        [] => Bound::None,
        [one] => Bound::Target(Box::new((*one).clone())),
        many => Bound::Conflict(many.iter().filter_map(|t| t.metadata.name.clone()).collect()),
    }
}

/// Reads the targets of `namespace` and picks the one bound to `claim`.
pub async fn bound_target(
    client: &kube::Client,
    namespace: &str,
    claim: &DeploymentTargetClaim,
) -> Result<Bound, ReconcileError> {
    let targets = Api::<DeploymentTarget>::namespaced(client.clone(), namespace);
    if let Some(name) = claim.spec.target_name.as_deref().filter(|n| !n.is_empty()) {
        let target = found(targets.get(name).await, "read the DeploymentTarget")?;
        return Ok(target.map_or(Bound::None, |t| Bound::Target(Box::new(t))));
    }
    let list = targets
        .list(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Kube { action: "list the DeploymentTargets", source })?;
    Ok(select(claim, &list.items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{DeploymentTargetClaimSpec, DeploymentTargetSpec};

    fn target(name: &str, claim: Option<&str>) -> DeploymentTarget {
        DeploymentTarget::new(
            name,
            DeploymentTargetSpec { claim_ref: claim.map(str::to_owned), ..DeploymentTargetSpec::default() },
        )
    }

    #[test]
    fn the_named_target_wins_else_the_only_one_claiming() {
        let targets = vec![target("a", None), target("b", Some("c")), target("d", Some("other"))];
        let mut claim = DeploymentTargetClaim::new("c", DeploymentTargetClaimSpec::default());
        assert!(matches!(select(&claim, &targets), Bound::Target(t) if t.metadata.name.as_deref() == Some("b")));
        claim.spec.target_name = Some("a".into());
        assert!(matches!(select(&claim, &targets), Bound::Target(t) if t.metadata.name.as_deref() == Some("a")));
        claim.spec.target_name = Some("missing".into());
        assert_eq!(select(&claim, &targets), Bound::None);
        let claim = DeploymentTargetClaim::new("c", DeploymentTargetClaimSpec::default());
        let twice = vec![target("b", Some("c")), target("e", Some("c"))];
        assert_eq!(select(&claim, &twice), Bound::Conflict(vec!["b".into(), "e".into()]));
        assert_eq!(select(&claim, &[]), Bound::None);
    }
}
