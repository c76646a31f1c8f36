//! Pure mapping from observed-state rows to the tenant resources' `.status`: what a
//! GitOpsDeployment's status should be after a feed row, and the condition a
//! GitOpsDeploymentSyncRun gets from its sync request's state.
//!
//! Condition ownership. Several writers of one `.status.conditions` list share it
//! by type: the status loop owns exactly the types in [`ENGINE_CONDITION_TYPES`]
//! (Argo CD's application condition types; an engine condition of any other type is
//! reported as `UnknownError`) on a GitOpsDeployment, and [`SYNC_RUN_CONDITION`] on
//! a GitOpsDeploymentSyncRun. Every other condition (the writer's validation and
//! placement conditions) is kept untouched, in place.

use gitops_shared::db::status_feed::{StatusFeedRow, SyncRunRow};
use gitops_shared::model::SyncOperationState;
use serde_json::Value;

use crate::api::{
    Condition, DeploymentHealth, DeploymentSync, GitOpsDeploymentStatus, ReconciledDestination, ReconciledSource,
    ReconciledState,
};

/// The condition types the status loop owns on a GitOpsDeployment.
pub const ENGINE_CONDITION_TYPES: &[&str] = &[
    "InvalidSpecError",
    "UnknownError",
    "ComparisonError",
    "SharedResourceWarning",
    "SyncError",
    "OrphanedResourceWarning",
    "ExcludedResourceWarning",
    "OperationError",
    "RepeatedResourceWarning",
    "DeletionError",
];

/// The one condition type the status loop owns on a GitOpsDeploymentSyncRun:
/// `False` while the sync is pending, running or terminating, `True` once it
/// succeeded, failed or was terminated; `reason` names the state.
pub const SYNC_RUN_CONDITION: &str = "SyncCompleted";

/// kstatus conditions of a GitOpsDeployment: `Ready` is `True` only when the current
/// generation is stored, applied in Argo CD and (automated) synced and healthy, or
/// (manual) healthy; `Reconciling` is `True` while that is under way; `Stalled` is
/// `True` when it cannot get there without the tenant (a permanent failure).
/// `Synced` (manual deployments only) says whether Argo CD's copy is in sync.
pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
pub const SYNCED: &str = "Synced";
const READINESS_TYPES: &[&str] = &[READY, RECONCILING, STALLED, SYNCED];
/// `Ready`'s reason while the tenant moves between Argo CD instances.
pub const REASON_MOVING: &str = "Moving";
/// `Ready`'s reasons while the tenant's Argo CD instance is not healthy.
pub const REASON_INSTANCE_LOST: &str = "InstanceLost";
pub const REASON_INSTANCE_DEGRADED: &str = "InstanceDegraded";
/// Reasons of the writer's condition that wait on the operator, not the tenant.
const WAITING_REASONS: &[&str] = &["NoEngineInstanceAvailable", "HomeIdentityUnavailable", "RequesterUnverified"];

/// What a GitOpsDeployment is, besides its status, for its readiness.
#[derive(Debug, Clone, Copy)]
pub struct DeploymentFacts {
    pub generation: Option<i64>,
    pub automated: bool,
}

fn condition(type_: &str, status: bool, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if status { "True" } else { "False" }.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message),
        observed_generation: generation,
        ..Condition::default()
    }
}

/// The `Ready` the writer sets with its own condition: `False` with the refusal's
/// reason, or `False`/`Reconciling` when it accepts a generation no `Ready` speaks
/// of yet (None otherwise: the status loop, which hears of the agent's work, keeps it).
pub fn writer_ready(
    error: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    existing: &[Condition],
    now: &str,
) -> Option<Condition> {
    let current = existing.iter().find(|c| c.type_ == READY).is_some_and(|c| c.observed_generation >= generation);
    let mut ready = if error {
        condition(READY, false, reason, message.to_owned(), generation)
    } else if !current {
        let message = "the new generation is stored; Argo CD has not applied it yet".to_owned();
        condition(READY, false, "Reconciling", message, generation)
    } else {
        return None;
    };
    ready.last_transition_time = Some(now.to_owned());
    Some(ready)
}

/// What the agent last made of a row, as the feed carries it.
#[derive(Debug, Clone, Copy)]
pub struct AgentView<'a> {
    pub applied_generation: Option<i64>,
    pub message: Option<&'a str>,
    pub stalled: bool,
    /// Why the tenant is moving to another engine instance; None: not moving.
    pub moving: Option<&'a str>,
    /// The health of the tenant's engine instance (None: unknown, taken as healthy).
    pub instance: Option<&'a str>,
}

/// `Ready`, `Reconciling` and `Stalled` of an object at `generation` whose other
/// conditions are `current`, after the agent's `agent` view: the writer's refusal
/// of this generation first, then the agent's failure, then whether this generation
/// is applied at all; `applied` says what an applied generation amounts to
/// (ready or not, reason, message).
fn kstatus(
    agent: AgentView<'_>,
    generation: Option<i64>,
    current: &[Condition],
    applied: impl FnOnce() -> (bool, &'static str, String),
) -> [Condition; 3] {
    // A refusal speaks of its generation only; whether the current one is in Argo CD
    // is the agent's to say (it applied the row of that generation, or not).
    let writer = current.iter().find(|c| c.type_ == "ErrorOccurred" && c.observed_generation == generation);
    // (ready, reconciling, stalled, reason, message)
    let (ready, reconciling, stalled, reason, message): (bool, bool, bool, &str, String) = match writer {
        Some(c) if c.status == "True" => {
            let reason = c.reason.as_deref().unwrap_or("Refused");
            let waiting = WAITING_REASONS.contains(&reason);
            (false, waiting, !waiting, reason, c.message.clone().unwrap_or_default())
        }
        _ if let Some(reason) = agent.moving => {
            let why = match reason {
                "failover" => " because its Argo CD instance was lost",
                "degraded" => " because its Argo CD instance stopped making progress",
                "rebalance" => " to balance the load of the service's instances",
                "drain" => " because an operator is emptying its Argo CD instance",
                "rollout" => " running a new Argo CD version, as part of a canary rollout",
                "rollback" => " back to its previous Argo CD instance: a canary rollout is rolled back",
                _ => "",
            };
            let message =
                format!("the namespace is moving to another Argo CD instance{why}; the last status is kept meanwhile");
            (false, true, false, REASON_MOVING, message)
        }
        _ if agent.instance == Some("lost") => {
            let message = "no agent reaches the Argo CD instance serving this namespace; the last status is kept \
                           meanwhile. If that Argo CD still runs, it may keep applying the last specs it had \
                           (with the credentials it holds) until an operator stops it";
            (false, true, false, REASON_INSTANCE_LOST, message.to_owned())
        }
        _ if agent.instance == Some("degraded") => {
            let message = "the Argo CD instance serving this namespace is not making progress; the last status is \
                           kept meanwhile";
            (false, true, false, REASON_INSTANCE_DEGRADED, message.to_owned())
        }
        _ if agent.stalled => (false, false, true, "Stalled", agent.message.unwrap_or("Argo CD refused it").to_owned()),
        _ if agent.message.is_some() => {
            (false, true, false, "ArgoCDUnavailable", agent.message.unwrap_or_default().to_owned())
        }
        _ if agent.applied_generation.is_none() || agent.applied_generation != generation => {
            (false, true, false, "Reconciling", "the current generation is not applied in Argo CD yet".to_owned())
        }
        _ => {
            let (ready, reason, message) = applied();
            (ready, !ready, false, reason, message)
        }
    };
    [
        condition(READY, ready, reason, message.clone(), generation),
        condition(RECONCILING, reconciling, if reconciling { reason } else { "Ready" }, message.clone(), generation),
        condition(STALLED, stalled, if stalled { reason } else { "NotStalled" }, message, generation),
    ]
}

/// `Ready`, `Reconciling`, `Stalled` (and `Synced` for a manual deployment) after
/// `row`, for an object at `facts` whose other conditions are `current`.
pub fn readiness(row: &StatusFeedRow, facts: DeploymentFacts, current: &[Condition]) -> Vec<Condition> {
    let generation = facts.generation;
    let sync = row.sync_status.as_deref().unwrap_or("Unknown");
    let health = row.health_status.as_deref().unwrap_or("Unknown");
    let agent = AgentView {
        applied_generation: row.applied_generation,
        message: row.agent_message.as_deref(),
        stalled: row.agent_stalled,
        moving: row.moving.as_deref(),
        instance: row.instance_health.as_deref(),
    };
    let mut out: Vec<Condition> = kstatus(agent, generation, current, || {
        let ready = health == "Healthy" && (!facts.automated || sync == "Synced");
        (ready, if ready { "Ready" } else { "Progressing" }, format!("sync {sync}, health {health}"))
    })
    .into();
    if !facts.automated {
        out.push(condition(SYNCED, sync == "Synced", sync, format!("Argo CD reports sync {sync}"), generation));
    }
    out
}

/// `Ready`'s reason when Argo CD has not finished deleting a deployment for long.
pub const REASON_DELETION_STUCK: &str = "DeletionStuck";

/// The kstatus conditions of a GitOpsDeployment whose deletion is stuck: not
/// Ready, still reconciling (the deletion is retried), with the agent's `message`.
pub fn deletion_stuck_conditions(
    message: &str,
    generation: Option<i64>,
    current: &[Condition],
    now: &str,
) -> Vec<Condition> {
    let message = message.to_owned();
    let ours = vec![
        condition(READY, false, REASON_DELETION_STUCK, message.clone(), generation),
        condition(RECONCILING, true, REASON_DELETION_STUCK, message.clone(), generation),
        condition(STALLED, false, "NotStalled", message, generation),
    ];
    merge_conditions(current, ours, |t| [READY, RECONCILING, STALLED].contains(&t), now)
}

/// The conditions of a managed environment or repository credential at
/// `generation` after the agent's view: `Ready` once its Secret of this generation
/// is applied in Argo CD. Other conditions of `current` are kept in place.
pub fn resource_conditions(
    agent: AgentView<'_>,
    generation: Option<i64>,
    current: &[Condition],
    now: &str,
) -> Vec<Condition> {
    let ours = kstatus(agent, generation, current, || {
        (true, "Ready", "its Secret of this generation is applied in Argo CD".to_owned())
    });
    merge_conditions(current, ours.into(), |t| [READY, RECONCILING, STALLED].contains(&t), now)
}

/// Engine conditions of a type outside [`ENGINE_CONDITION_TYPES`] are shown as this.
const FALLBACK_CONDITION: &str = "UnknownError";

/// The status fields the loop owns, as the row says they should be; the rest of
/// `current` (validation conditions, `observedGeneration`) is kept. `now` (RFC
/// 3339) stamps conditions that appear without a transition time of their own.
pub fn deployment_status(
    row: &StatusFeedRow,
    facts: DeploymentFacts,
    current: &GitOpsDeploymentStatus,
    now: &str,
) -> GitOpsDeploymentStatus {
    let mut status = current.clone();
    status.sync =
        row.sync_status.as_ref().map(|s| DeploymentSync { status: s.clone(), revision: row.sync_revision.clone() });
    status.health =
        row.health_status.as_ref().map(|s| DeploymentHealth { status: s.clone(), message: row.health_message.clone() });
    status.resources = row
        .resources
        .as_array()
        .map(|items| items.iter().filter_map(|item| serde_json::from_value(item.clone()).ok()).collect())
        .unwrap_or_default();
    status.reconciled_state = row.reconciled_state.as_ref().map(|compared| reconciled_state(compared, row));
    status.operation_state = row.operation_state.clone();
    let engine = merge_conditions(
        &current.conditions,
        engine_conditions(&row.conditions),
        |t| ENGINE_CONDITION_TYPES.contains(&t),
        now,
    );
    status.conditions =
        merge_conditions(&engine, readiness(row, facts, &current.conditions), |t| READINESS_TYPES.contains(&t), now);
    status
}

/// The JSON merge patch (RFC 7386) that turns `current` into `desired`: keys gone
/// from `desired` become `null`, nested objects are diffed, anything else that
/// differs is replaced whole. Empty when the two are equal.
pub fn merge_diff(current: &Value, desired: &Value) -> Value {
    match (current, desired) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for key in old.keys().filter(|key| !new.contains_key(*key)) {
                patch.insert(key.clone(), Value::Null);
            }
            for (key, value) in new {
                match old.get(key) {
                    Some(previous) if previous == value => {}
                    Some(previous @ Value::Object(_)) if value.is_object() => {
                        patch.insert(key.clone(), merge_diff(previous, value));
                    }
                    _ => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => desired.clone(),
    }
}

/// The SyncRun's conditions after its sync request's current state.
pub fn sync_run_conditions(row: &SyncRunRow, current: &[Condition], now: &str) -> Vec<Condition> {
    let (status, reason) = match row.state {
        SyncOperationState::Pending => ("False", "Pending"),
        SyncOperationState::Running => ("False", "Running"),
        SyncOperationState::Terminating => ("False", "Terminating"),
        SyncOperationState::Succeeded => ("True", "Succeeded"),
        SyncOperationState::Failed => ("True", row.failure_reason.as_deref().unwrap_or("Failed")),
        SyncOperationState::Terminated => ("True", "Terminated"),
        SyncOperationState::Unknown => ("Unknown", "Unknown"),
    };
    let message = match (&row.message, &row.synced_revision) {
        (Some(message), _) => Some(message.clone()),
        (None, Some(revision)) => Some(format!("synced to revision {revision}")),
        (None, None) => None,
    };
    let completed = Condition {
        type_: SYNC_RUN_CONDITION.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: message.clone(),
        ..Condition::default()
    };
    // kstatus: Ready once the sync succeeded; Stalled when it ended otherwise.
    let text = message.unwrap_or_else(|| format!("the sync is {}", reason.to_lowercase()));
    let succeeded = row.state == SyncOperationState::Succeeded;
    let ended = status == "True";
    let ready = [
        condition(READY, succeeded, reason, text.clone(), None),
        condition(RECONCILING, !ended, if ended { "Finished" } else { reason }, text.clone(), None),
        condition(STALLED, ended && !succeeded, if ended && !succeeded { reason } else { "NotStalled" }, text, None),
    ];
    let owned = |t: &str| t == SYNC_RUN_CONDITION || [READY, RECONCILING, STALLED].contains(&t);
    merge_conditions(current, std::iter::once(completed).chain(ready).collect(), owned, now)
}

/// Whether a sync request can still change (its SyncRun must be looked at again).
pub fn sync_in_flight(state: SyncOperationState) -> bool {
    matches!(state, SyncOperationState::Pending | SyncOperationState::Running | SyncOperationState::Terminating)
}

fn reconciled_state(compared: &Value, row: &StatusFeedRow) -> ReconciledState {
    let source: ReconciledSource =
        compared.get("source").and_then(|s| serde_json::from_value(s.clone()).ok()).unwrap_or_default();
    let namespace = compared.pointer("/destination/namespace").and_then(Value::as_str).map(str::to_owned);
    ReconciledState { source, destination: ReconciledDestination { environment: row.environment.clone(), namespace } }
}

/// The engine's conditions (`{type, message, lastTransitionTime}`) as ours.
fn engine_conditions(conditions: &Value) -> Vec<Condition> {
    let Some(items) = conditions.as_array() else { return Vec::new() };
    items
        .iter()
        .filter_map(|item| {
            let kind = item.get("type")?.as_str()?;
            let message = item.get("message").and_then(Value::as_str).unwrap_or_default();
            let (type_, message) = if ENGINE_CONDITION_TYPES.contains(&kind) {
                (kind.to_owned(), message.to_owned())
            } else {
                (FALLBACK_CONDITION.to_owned(), format!("{kind}: {message}"))
            };
            Some(Condition {
                reason: Some(type_.clone()),
                type_,
                status: "True".to_owned(),
                message: Some(message),
                last_transition_time: item.get("lastTransitionTime").and_then(Value::as_str).map(str::to_owned),
                observed_generation: None,
            })
        })
        .collect()
}

/// `current` with every condition of an owned type replaced by `ours`. A
/// condition whose status did not change keeps its transition time; one without a
/// time gets `now`. Conditions of other types keep their place.
fn merge_conditions(
    current: &[Condition],
    ours: Vec<Condition>,
    owned: impl Fn(&str) -> bool,
    now: &str,
) -> Vec<Condition> {
    let mut merged: Vec<Condition> = current.iter().filter(|c| !owned(&c.type_)).cloned().collect();
    for mut condition in ours {
        if merged.iter().any(|c| c.type_ == condition.type_) {
            continue; // one condition per type; the first reported wins
        }
        let previous = current.iter().find(|c| c.type_ == condition.type_ && c.status == condition.status);
        if condition.last_transition_time.is_none() {
            condition.last_transition_time =
                Some(previous.and_then(|c| c.last_transition_time.clone()).unwrap_or_else(|| now.to_owned()));
        }
        merged.push(condition);
    }
    merged
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    fn row() -> StatusFeedRow {
        StatusFeedRow {
            seq: 1,
            xid: 1,
            snapshot_xmin: 2,
            application_id: gitops_shared::model::ApplicationId(1),
            retrying: false,
            namespace: "team".into(),
            resource_name: "web".into(),
            resource_uid: Uuid::nil(),
            environment: None,
            sync_status: Some("Synced".into()),
            sync_revision: Some("abc".into()),
            health_status: Some("Healthy".into()),
            health_message: None,
            resources: json!([{"kind": "ConfigMap", "name": "demo", "status": "Synced", "extra": 1}]),
            conditions: json!([{"type": "ComparisonError", "message": "boom"}, {"type": "Odd", "message": "x"}]),
            operation_state: Some(json!({"phase": "Succeeded"})),
            reconciled_state: Some(json!({"source": {"repoURL": "r", "path": "p"}, "destination": {"namespace": "n"}})),
            row_state: gitops_shared::model::RowState::Active,
            applied_generation: Some(3),
            agent_message: None,
            agent_stalled: false,
            moving: None,
            deletion_message: None,
            instance_health: None,
        }
    }

    const AUTOMATED: DeploymentFacts = DeploymentFacts { generation: Some(3), automated: true };

    fn validation() -> Condition {
        Condition {
            type_: "ErrorOccurred".into(),
            status: "False".into(),
            reason: Some("Accepted".into()),
            observed_generation: Some(3),
            ..Condition::default()
        }
    }

    /// (status, reason) of condition `type_`.
    fn of<'a>(conditions: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
        let c = conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_}"));
        (c.status.as_str(), c.reason.as_deref().unwrap_or_default())
    }

    #[test]
    fn ready_only_when_the_current_generation_is_applied_synced_and_healthy() {
        let accepted = [validation()];
        let ready = readiness(&row(), AUTOMATED, &accepted);
        assert_eq!(of(&ready, READY), ("True", "Ready"));
        assert_eq!(of(&ready, RECONCILING), ("False", "Ready"));
        assert_eq!(of(&ready, STALLED), ("False", "NotStalled"));
        assert!(ready.iter().all(|c| c.observed_generation == Some(3)));

        let newer = DeploymentFacts { generation: Some(4), ..AUTOMATED };
        assert_eq!(of(&readiness(&row(), newer, &accepted), READY), ("False", "Reconciling"), "not applied yet");
        let mut stale = row();
        stale.applied_generation = Some(2);
        assert_eq!(of(&readiness(&stale, AUTOMATED, &accepted), READY), ("False", "Reconciling"), "not applied");

        let mut degraded = row();
        degraded.health_status = Some("Degraded".into());
        let progressing = readiness(&degraded, AUTOMATED, &accepted);
        assert_eq!(
            (of(&progressing, READY), of(&progressing, RECONCILING)),
            (("False", "Progressing"), ("True", "Progressing"))
        );

        let mut unreachable = row();
        unreachable.agent_message = Some("the Argo CD instance serving this namespace is unavailable; retrying".into());
        let waiting = readiness(&unreachable, AUTOMATED, &accepted);
        assert_eq!(
            (of(&waiting, READY), of(&waiting, STALLED)),
            (("False", "ArgoCDUnavailable"), ("False", "NotStalled"))
        );

        let mut refused = unreachable.clone();
        refused.agent_stalled = true;
        let stalled = readiness(&refused, AUTOMATED, &accepted);
        assert_eq!((of(&stalled, READY), of(&stalled, STALLED)), (("False", "Stalled"), ("True", "Stalled")));

        let invalid = [Condition { status: "True".into(), reason: Some("InvalidPath".into()), ..validation() }];
        let stalled = readiness(&row(), AUTOMATED, &invalid);
        assert_eq!((of(&stalled, READY), of(&stalled, STALLED)), (("False", "InvalidPath"), ("True", "InvalidPath")));
        let no_engine =
            [Condition { status: "True".into(), reason: Some("NoEngineInstanceAvailable".into()), ..validation() }];
        let waiting = readiness(&row(), AUTOMATED, &no_engine);
        assert_eq!(
            (of(&waiting, RECONCILING), of(&waiting, STALLED)).1,
            ("False", "NotStalled"),
            "waits on the operator"
        );

        let manual = DeploymentFacts { automated: false, ..AUTOMATED };
        let mut out_of_sync = row();
        out_of_sync.sync_status = Some("OutOfSync".into());
        let conditions = readiness(&out_of_sync, manual, &accepted);
        assert_eq!(of(&conditions, READY), ("True", "Ready"), "a manual deployment is ready when healthy");
        assert_eq!(of(&conditions, SYNCED), ("False", "OutOfSync"));
        assert!(readiness(&row(), AUTOMATED, &accepted).iter().all(|c| c.type_ != SYNCED));
    }

    #[test]
    fn the_writer_sets_ready_as_it_refuses_or_accepts_a_new_generation() {
        let refused = writer_ready(true, "InvalidPath", "bad path", Some(2), &[], "t").expect("Ready");
        assert_eq!((refused.status.as_str(), refused.reason.as_deref()), ("False", Some("InvalidPath")));
        let older = readiness(&row(), DeploymentFacts { generation: Some(2), ..AUTOMATED }, &[]);
        let accepted = writer_ready(false, "Accepted", "stored", Some(3), &older, "t").expect("Ready");
        assert_eq!((accepted.status.as_str(), accepted.reason.as_deref()), ("False", Some("Reconciling")));
        let current = readiness(&row(), AUTOMATED, &[]);
        assert_eq!(of(&current, READY), ("True", "Ready"));
        assert!(
            writer_ready(false, "Accepted", "stored", Some(3), &current, "t").is_none(),
            "the loop got there first"
        );
    }

    #[test]
    fn environments_and_credentials_are_ready_once_their_generation_is_applied() {
        let applied = |generation| AgentView {
            applied_generation: Some(generation),
            message: None,
            stalled: false,
            moving: None,
            instance: None,
        };
        let kept = [validation()];
        let ready = resource_conditions(applied(3), Some(3), &kept, "t");
        assert_eq!(of(&ready, READY), ("True", "Ready"));
        assert_eq!(of(&ready, "ErrorOccurred"), ("False", "Accepted"), "the writer's condition stays");
        assert_eq!(of(&resource_conditions(applied(2), Some(3), &kept, "t"), READY), ("False", "Reconciling"));
        let failing = AgentView {
            applied_generation: Some(2),
            message: Some("Argo CD is unavailable"),
            stalled: false,
            moving: None,
            instance: None,
        };
        let unavailable = resource_conditions(failing, Some(3), &kept, "t");
        assert_eq!(of(&unavailable, READY), ("False", "ArgoCDUnavailable"));
        assert_eq!(of(&unavailable, STALLED), ("False", "NotStalled"));
        let refused = AgentView {
            applied_generation: Some(2),
            message: Some("reserved namespace"),
            stalled: true,
            moving: None,
            instance: None,
        };
        let stalled = resource_conditions(refused, Some(3), &kept, "t");
        assert_eq!(of(&stalled, STALLED), ("True", "Stalled"));
        assert_eq!(of(&stalled, RECONCILING), ("False", "Ready"));
        let mut writer_refused = validation();
        writer_refused.status = "True".into();
        writer_refused.reason = Some("SecretNotFound".into());
        let missing = resource_conditions(applied(3), Some(3), &[writer_refused], "t");
        assert_eq!(of(&missing, READY), ("False", "SecretNotFound"), "the writer's refusal comes first");
    }

    #[test]
    fn a_moving_tenant_is_not_ready_and_says_so() {
        let mut moving = row();
        moving.moving = Some("failover".into());
        let conditions = readiness(&moving, AUTOMATED, &[]);
        assert_eq!(of(&conditions, READY), ("False", REASON_MOVING));
        let ready = conditions.iter().find(|c| c.type_ == READY).and_then(|c| c.message.clone()).unwrap_or_default();
        assert!(ready.contains("because its Argo CD instance was lost"), "the tenant reads why: {ready}");
        assert_eq!(of(&conditions, RECONCILING), ("True", REASON_MOVING));
        assert_eq!(of(&readiness(&row(), AUTOMATED, &[]), READY), ("True", "Ready"), "and Ready again after");
        for (reason, says) in
            [("rollout", "as part of a canary rollout"), ("rollback", "a canary rollout is rolled back")]
        {
            moving.moving = Some(reason.into());
            let conditions = readiness(&moving, AUTOMATED, &[]);
            let message = conditions.iter().find(|c| c.type_ == READY).and_then(|c| c.message.clone());
            assert!(message.unwrap_or_default().contains(says), "a {reason} says so");
        }
    }

    #[test]
    fn an_unhealthy_instance_makes_its_tenants_not_ready() {
        let mut lost = row();
        lost.instance_health = Some("lost".into());
        assert_eq!(of(&readiness(&lost, AUTOMATED, &[]), READY), ("False", REASON_INSTANCE_LOST));
        lost.instance_health = Some("degraded".into());
        assert_eq!(of(&readiness(&lost, AUTOMATED, &[]), READY), ("False", REASON_INSTANCE_DEGRADED));
        lost.instance_health = Some("healthy".into());
        assert_eq!(of(&readiness(&lost, AUTOMATED, &[]), READY), ("True", "Ready"));
    }

    #[test]
    fn owned_fields_follow_the_row_and_validation_conditions_stay() {
        let current = GitOpsDeploymentStatus {
            conditions: vec![validation()],
            observed_generation: Some(3),
            ..Default::default()
        };
        let status = deployment_status(&row(), AUTOMATED, &current, "2026-01-01T00:00:00Z");
        assert_eq!(status.sync.as_ref().map(|s| s.status.as_str()), Some("Synced"));
        assert_eq!(status.resources[0].name, "demo");
        assert_eq!(status.reconciled_state.as_ref().and_then(|r| r.destination.namespace.as_deref()), Some("n"));
        assert_eq!(status.observed_generation, Some(3));
        let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["ErrorOccurred", "ComparisonError", "UnknownError", READY, RECONCILING, STALLED]);
        assert_eq!(status.conditions[2].message.as_deref(), Some("Odd: x"));
    }

    #[test]
    fn rendering_twice_changes_nothing() {
        let first = deployment_status(&row(), AUTOMATED, &GitOpsDeploymentStatus::default(), "2026-01-01T00:00:00Z");
        let second = deployment_status(&row(), AUTOMATED, &first, "2026-02-02T00:00:00Z");
        assert_eq!(first, second);
    }

    #[test]
    fn gone_engine_conditions_are_removed() {
        let first = deployment_status(&row(), AUTOMATED, &GitOpsDeploymentStatus::default(), "t");
        let mut clean = row();
        clean.conditions = json!([]);
        let types: Vec<String> =
            deployment_status(&clean, AUTOMATED, &first, "t").conditions.into_iter().map(|c| c.type_).collect();
        assert_eq!(types, [READY, RECONCILING, STALLED]);
    }

    #[test]
    fn merge_diffs_remove_what_is_gone() {
        let current = json!({"a": {"x": 1, "y": 2}, "b": [1], "c": 3});
        let desired = json!({"a": {"x": 1}, "b": [1, 2], "d": 4});
        assert_eq!(merge_diff(&current, &desired), json!({"a": {"y": null}, "b": [1, 2], "c": null, "d": 4}));
        assert_eq!(merge_diff(&desired, &desired), json!({}));
    }

    #[test]
    fn sync_runs_get_one_condition_per_state() {
        let mut run = SyncRunRow {
            id: gitops_shared::model::SyncOperationId(1),
            namespace: "team".into(),
            resource_name: "run".into(),
            resource_uid: Uuid::nil(),
            state: SyncOperationState::Running,
            synced_revision: None,
            message: None,
            failure_reason: None,
        };
        let running = sync_run_conditions(&run, &[validation()], "t1");
        assert_eq!(running[1].status, "False");
        assert_eq!(running[1].reason.as_deref(), Some("Running"));
        assert_eq!((of(&running, READY), of(&running, RECONCILING)), (("False", "Running"), ("True", "Running")));
        run.state = SyncOperationState::Succeeded;
        run.synced_revision = Some("abc".into());
        let done = sync_run_conditions(&run, &running, "t2");
        assert_eq!(done.len(), 5);
        assert_eq!((of(&done, READY), of(&done, STALLED)), (("True", "Succeeded"), ("False", "NotStalled")));
        let mut failed = run.clone();
        failed.state = SyncOperationState::Failed;
        let failed = sync_run_conditions(&failed, &running, "t2");
        assert_eq!((of(&failed, READY), of(&failed, STALLED)), (("False", "Failed"), ("True", "Failed")));
        let mut moved = run.clone();
        (moved.state, moved.failure_reason) = (SyncOperationState::Failed, Some("InstanceMoved".into()));
        let moved = sync_run_conditions(&moved, &running, "t2");
        assert_eq!((of(&moved, READY), of(&moved, STALLED)), (("False", "InstanceMoved"), ("True", "InstanceMoved")));
        assert_eq!((done[1].status.as_str(), done[1].last_transition_time.as_deref()), ("True", Some("t2")));
        assert_eq!(sync_run_conditions(&run, &done, "t3"), done);
    }
}
