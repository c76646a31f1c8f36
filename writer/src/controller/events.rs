//! Which changes of a tenant resource's conditions become Kubernetes Events: the
//! watcher compares what the conditions told the tenant before and after each
//! update (ours and the status loop's alike) and publishes the transitions —
//! accepted, refused, ready, unavailable, stalled, moving — and the deletion. Objects seen
//! for the first time (a start, a relist) publish nothing: nothing changed.

use std::sync::Arc;

use kube::Resource;

use super::Controllers;
use super::object::CONDITION;
use crate::api::Condition;
use crate::events::Transition;

/// What the writer's condition and `Ready` say: (status, reason, message).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Shown {
    writer: Option<(String, String, String, Option<i64>)>,
    ready: Option<(String, String, String)>,
}

impl Shown {
    pub(crate) fn of(conditions: &[Condition]) -> Shown {
        let find = |type_: &str| conditions.iter().find(|c| c.type_ == type_);
        let text = |c: &Condition| {
            (c.status.clone(), c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default())
        };
        Shown {
            writer: find(CONDITION).map(|c| {
                let (status, reason, message) = text(c);
                (status, reason, message, c.observed_generation)
            }),
            ready: find("Ready").map(text),
        }
    }
}

/// The transitions from `before` to `after`.
fn transitions(before: &Shown, after: &Shown) -> Vec<Transition> {
    let mut out = Vec::new();
    if let Some((status, reason, message, generation)) = &after.writer
        && before.writer != after.writer
    {
        let (was_status, was_reason) =
            before.writer.as_ref().map(|(s, r, ..)| (s.as_str(), r.as_str())).unwrap_or_default();
        if status == "False" && (was_status != "False" || before.writer.as_ref().map(|w| w.3) != Some(*generation)) {
            let note = format!("generation {} is stored and handed to Argo CD", generation.unwrap_or_default());
            out.push(Transition { warning: false, reason: "Accepted".into(), action: "Store", note });
        } else if status == "True" && (was_status != "True" || was_reason != reason) {
            out.push(Transition { warning: true, reason: reason.clone(), action: "Validate", note: message.clone() });
        }
    }
    if let Some((status, reason, message)) = &after.ready
        && before.ready.as_ref().map(|(s, r, _)| (s, r)) != Some((status, reason))
    {
        match (status.as_str(), reason.as_str()) {
            ("True", _) => {
                out.push(Transition { warning: false, reason: "Ready".into(), action: "Apply", note: message.clone() })
            }
            ("False", "Stalled" | "ArgoCDUnavailable") => {
                out.push(Transition { warning: true, reason: reason.clone(), action: "Apply", note: message.clone() });
            }
            // Why it moves (a rollout, its rollback, a drain, a failover): the message says.
            ("False", "Moving") => {
                out.push(Transition { warning: false, reason: reason.clone(), action: "Move", note: message.clone() });
            }
            _ => {}
        }
    }
    out
}

/// Publishes, in the background, the transitions of `object` from `before` to `after`.
pub(crate) fn publish_changes<K>(ctl: &Arc<Controllers>, object: &K, before: &Shown, after: &Shown)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let changes = transitions(before, after);
    if changes.is_empty() {
        return;
    }
    let (events, object) = (ctl.ctx.events.clone(), object.clone());
    tokio::spawn(async move {
        for change in changes {
            events.publish(&object, change).await;
        }
    });
}

/// Publishes, in the background, that `object` is gone.
pub(crate) fn publish_deleted<K>(ctl: &Arc<Controllers>, object: &K)
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let (events, object) = (ctl.ctx.events.clone(), object.clone());
    let note = "deleted; its Argo CD objects are removed".to_owned();
    tokio::spawn(async move {
        events.publish(&object, Transition { warning: false, reason: "Deleted".into(), action: "Delete", note }).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str, reason: &str, generation: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            message: Some(format!("{reason} message")),
            observed_generation: Some(generation),
            ..Condition::default()
        }
    }

    fn reasons(before: &[Condition], after: &[Condition]) -> Vec<(String, bool)> {
        transitions(&Shown::of(before), &Shown::of(after)).into_iter().map(|t| (t.reason, t.warning)).collect()
    }

    #[test]
    fn transitions_are_published_once() {
        let accepted = [condition(CONDITION, "False", "Accepted", 1)];
        assert_eq!(reasons(&[], &accepted), [("Accepted".to_owned(), false)]);
        assert!(reasons(&accepted, &accepted).is_empty(), "no change, no event");
        let next = [condition(CONDITION, "False", "Accepted", 2)];
        assert_eq!(reasons(&accepted, &next), [("Accepted".to_owned(), false)], "a new generation stored");
        let refused = [condition(CONDITION, "True", "InvalidPath", 3)];
        assert_eq!(reasons(&next, &refused), [("InvalidPath".to_owned(), true)]);
        let ready = [next[0].clone(), condition("Ready", "True", "Ready", 2)];
        assert_eq!(reasons(&next, &ready), [("Ready".to_owned(), false)]);
        let unavailable = [next[0].clone(), condition("Ready", "False", "ArgoCDUnavailable", 2)];
        assert_eq!(reasons(&ready, &unavailable), [("ArgoCDUnavailable".to_owned(), true)]);
        let progressing = [next[0].clone(), condition("Ready", "False", "Progressing", 2)];
        assert!(reasons(&ready, &progressing).is_empty(), "progress is not an event");
        let moving = [next[0].clone(), condition("Ready", "False", "Moving", 2)];
        assert_eq!(reasons(&ready, &moving), [("Moving".to_owned(), false)], "a move is");
    }
}
