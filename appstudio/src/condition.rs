//! Status conditions as the original wrote them: one entry per type, the transition
//! time bumped only when status, reason or message change, and the two-condition
//! error report (`ErrorOccurred`, kept for old clients, and `Reconciled`).

use crate::api::Condition;

pub const ERROR_OCCURRED: &str = "ErrorOccurred";
pub const RECONCILED: &str = "Reconciled";
pub const TRUE: &str = "True";
pub const FALSE: &str = "False";

/// Replaces the condition of `new.type_` (or appends it); keeps the old transition
/// time when nothing but the time would change. Returns whether anything changed.
pub fn upsert(conditions: &mut Vec<Condition>, mut new: Condition, now: &str) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) if old.status == new.status && old.reason == new.reason && old.message == new.message => false,
        Some(old) => {
            new.last_transition_time = now.to_owned();
            *old = new;
            true
        }
        None => {
            new.last_transition_time = now.to_owned();
            conditions.push(new);
            true
        }
    }
}

/// Reports an error: `ErrorOccurred`=True (reason `ErrorOccurred`) and
/// `Reconciled`=False with `reason`, both with `message`.
pub fn set_error(conditions: &mut Vec<Condition>, reason: &str, message: &str, now: &str) -> bool {
    let error = condition(ERROR_OCCURRED, TRUE, ERROR_OCCURRED, message);
    let reconciled = condition(RECONCILED, FALSE, reason, message);
    let changed = upsert(conditions, error, now);
    upsert(conditions, reconciled, now) || changed
}

/// After a successful reconcile, turns existing error conditions into resolved ones
/// (`ErrorOccurred`=False, `Reconciled`=True, reason `<old reason>Resolved`, empty
/// message) and adds none: an object that never failed keeps no condition.
pub fn resolve(conditions: &mut [Condition], now: &str) -> bool {
    let mut changed = false;
    for condition in conditions.iter_mut() {
        let status = match condition.type_.as_str() {
            ERROR_OCCURRED => FALSE,
            RECONCILED => TRUE,
            _ => continue,
        };
        if condition.status == status {
            continue;
        }
        condition.status = status.to_owned();
        condition.reason = format!("{}Resolved", condition.reason);
        condition.message = String::new();
        condition.last_transition_time = now.to_owned();
        changed = true;
    }
    changed
}

/// A condition without a transition time (set by [`upsert`]).
pub fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: String::new(),
        observed_generation: None,
    }
}

/// RFC 3339 UTC time of now, second precision.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transition_time_moves_only_with_a_change() {
        let mut conditions = Vec::new();
        assert!(set_error(&mut conditions, "SecretNotFound", "gone", "t1"));
        assert!(!set_error(&mut conditions, "SecretNotFound", "gone", "t2"), "the same error again changes nothing");
        assert!(conditions.iter().all(|c| c.last_transition_time == "t1"));
        assert!(set_error(&mut conditions, "InvalidEnvironment", "both", "t3"));
        let reconciled = conditions.iter().find(|c| c.type_ == RECONCILED).expect("Reconciled");
        assert_eq!(
            (reconciled.reason.as_str(), reconciled.last_transition_time.as_str()),
            ("InvalidEnvironment", "t3")
        );
        assert_eq!(conditions.len(), 2);
    }

    #[test]
    fn resolving_flips_existing_conditions_and_adds_none() {
        let mut none = Vec::new();
        assert!(!resolve(&mut none, "t"));
        assert!(none.is_empty());

        let mut conditions = Vec::new();
        set_error(&mut conditions, "SecretNotFound", "gone", "t1");
        assert!(resolve(&mut conditions, "t2"));
        let error = conditions.iter().find(|c| c.type_ == ERROR_OCCURRED).expect("ErrorOccurred");
        assert_eq!(
            (error.status.as_str(), error.reason.as_str(), error.message.as_str()),
            (FALSE, "ErrorOccurredResolved", "")
        );
        let reconciled = conditions.iter().find(|c| c.type_ == RECONCILED).expect("Reconciled");
        assert_eq!((reconciled.status.as_str(), reconciled.reason.as_str()), (TRUE, "SecretNotFoundResolved"));
        assert!(!resolve(&mut conditions, "t3"), "resolving twice changes nothing");
    }
}
