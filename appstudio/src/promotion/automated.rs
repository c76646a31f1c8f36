//! Automated promotion's plan, decided without I/O: from the initial Environment,
//! down the `parentEnvironment` graph, one step per generation — the initial
//! Environment, then every Environment whose parent was in the step before and
//! whose `deploymentStrategy` is `AppStudioAutomated`. Environments that share a
//! parent are promoted together as one step; an Environment of another strategy
//! stops its branch (it and its descendants are promoted by hand). A cycle is
//! refused (the webhook refuses creating one, but its check races).

use std::collections::{BTreeMap, BTreeSet};

/// The strategy that lets automated promotion continue into an Environment.
pub const AUTOMATED: &str = "AppStudioAutomated";

/// What the plan needs of an Environment: its parent and its strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub parent: Option<String>,
    pub strategy: String,
}

/// The steps from `initial` over `environments` (by name), each sorted; Err when
/// `initial` does not exist or the graph below it has a cycle.
pub fn plan(initial: &str, environments: &BTreeMap<String, Node>) -> Result<Vec<Vec<String>>, String> {
    if !environments.contains_key(initial) {
        return Err(format!("the initial Environment {initial} of the automated promotion does not exist"));
    }
    let mut children: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, node) in environments {
        if let Some(parent) = node.parent.as_deref().filter(|p| !p.is_empty()) {
            children.entry(parent).or_default().push(name);
        }
    }
    let mut steps = vec![vec![initial.to_owned()]];
    let mut seen = BTreeSet::from([initial.to_owned()]);
    loop {
        let mut next = Vec::new();
        for parent in steps.last().into_iter().flatten() {
            for child in children.get(parent.as_str()).into_iter().flatten() {
                if environments.get(*child).is_none_or(|node| node.strategy != AUTOMATED) {
                    continue;
                }
                if !seen.insert((*child).to_owned()) {
                    return Err(format!(
                        "invalid parentEnvironment: the environments' parents form a cycle through {child}; \
                         automated promotion stopped"
                    ));
                }
                next.push((*child).to_owned());
            }
        }
        if next.is_empty() {
            return Ok(steps);
        }
        next.sort();
        steps.push(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(pairs: &[(&str, &str, &str)]) -> BTreeMap<String, Node> {
        pairs
            .iter()
            .map(|(name, parent, strategy)| {
                let parent = (!parent.is_empty()).then(|| (*parent).to_owned());
                ((*name).to_owned(), Node { parent, strategy: (*strategy).to_owned() })
            })
            .collect()
    }

    #[test]
    fn siblings_are_one_step_and_manual_environments_stop_their_branch() {
        let envs = graph(&[
            ("dev", "", "Manual"),
            ("staging", "dev", AUTOMATED),
            ("qa", "dev", AUTOMATED),
            ("sandbox", "dev", "Manual"),
            ("after-sandbox", "sandbox", AUTOMATED),
            ("prod", "staging", AUTOMATED),
            ("elsewhere", "", AUTOMATED),
        ]);
        assert_eq!(
            plan("dev", &envs),
            Ok(vec![vec!["dev".to_owned()], vec!["qa".to_owned(), "staging".to_owned()], vec!["prod".to_owned()]])
        );
        assert_eq!(plan("staging", &envs), Ok(vec![vec!["staging".to_owned()], vec!["prod".to_owned()]]));
        assert_eq!(plan("prod", &envs), Ok(vec![vec!["prod".to_owned()]]));
        assert!(plan("gone", &envs).is_err_and(|m| m.contains("gone")));
    }

    #[test]
    fn a_cycle_below_the_initial_environment_is_refused() {
        let envs = graph(&[("a", "b", AUTOMATED), ("b", "a", AUTOMATED)]);
        assert!(plan("a", &envs).is_err_and(|m| m.contains("cycle")));
        let envs = graph(&[("a", "a", AUTOMATED)]);
        assert!(plan("a", &envs).is_err_and(|m| m.contains("cycle")));
        // A cycle elsewhere is not this promotion's business.
        let envs = graph(&[("a", "", AUTOMATED), ("x", "y", AUTOMATED), ("y", "x", AUTOMATED)]);
        assert_eq!(plan("a", &envs), Ok(vec![vec!["a".to_owned()]]));
    }
}
