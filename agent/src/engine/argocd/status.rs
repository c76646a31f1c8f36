//! The Argo CD side of the status stream: watches the instance's Applications that
//! carry the service's managed-by label and turns each watch event into an
//! engine-neutral `StatusEvent`, reading the fields the agent records out of the
//! Application's `status`. Everything Argo CD-specific about status stays here;
//! the agent's status watcher sees only `ObservedApplication`s.
//!
//! Argo CD's Application has no status subresource, so every status write arrives
//! as an ordinary watch event; the consumer drops unchanged observations.

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};

use super::{application_resource, objects::operation_view};
use crate::engine::{EngineError, ObservedApplication, StatusEvent};
use crate::names::{MANAGED_BY_LABEL, MANAGED_BY_VALUE};

/// The status events of the service's Applications in `namespace`. Watch errors
/// are yielded as transient engine errors and retried with kube's default backoff.
pub fn status_events(client: Client, namespace: &str) -> BoxStream<'static, Result<StatusEvent, EngineError>> {
    let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &application_resource());
    let config = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY_VALUE}"));
    watcher::watcher(api, config)
        .default_backoff()
        .filter_map(|event| async move {
            match event {
                Err(error) => Some(Err(EngineError::Transient {
                    action: "watch Applications".to_owned(),
                    source: Box::new(error),
                })),
                Ok(Event::Init) => Some(Ok(StatusEvent::Restarted)),
                Ok(Event::Apply(object) | Event::InitApply(object)) => {
                    Some(Ok(StatusEvent::Applied(Box::new(observe(&object)))))
                }
                Ok(Event::Delete(object)) => object.metadata.name.map(|name| Ok(StatusEvent::Deleted(name))),
                Ok(Event::InitDone) => None,
            }
        })
        .boxed()
}

/// What an Application says about itself.
pub fn observe(object: &DynamicObject) -> ObservedApplication {
    observe_value(
        object.metadata.name.clone().unwrap_or_default(),
        object.metadata.labels.clone().unwrap_or_default(),
        &object.data,
    )
}

fn text(value: &Value, pointer: &str) -> Option<String> {
    value.pointer(pointer).and_then(Value::as_str).map(str::to_owned)
}

fn array(value: &Value, pointer: &str) -> Value {
    value.pointer(pointer).filter(|v| v.is_array()).cloned().unwrap_or_else(|| json!([]))
}

fn object_at(value: &Value, pointer: &str) -> Option<Value> {
    value.pointer(pointer).filter(|v| v.is_object()).cloned()
}

/// The observation in an Application's JSON (`status` and `operation` read).
/// Timestamps that move without anything changing (`reconciledAt`, `observedAt`)
/// are left out.
fn observe_value(
    name: String,
    labels: std::collections::BTreeMap<String, String>,
    application: &Value,
) -> ObservedApplication {
    ObservedApplication {
        name,
        labels,
        sync_status: text(application, "/status/sync/status"),
        sync_revision: text(application, "/status/sync/revision"),
        health_status: text(application, "/status/health/status"),
        health_message: text(application, "/status/health/message"),
        resources: array(application, "/status/resources"),
        conditions: array(application, "/status/conditions"),
        operation_state: object_at(application, "/status/operationState"),
        operation: operation_view(application).state,
        reconciled_state: object_at(application, "/status/sync/comparedTo"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::engine::OperationPhase;

    #[test]
    fn status_fields_map_and_volatile_timestamps_do_not_matter() {
        let app = json!({"status": {
            "sync": {"status": "Synced", "revision": "abc", "comparedTo": {"source": {"repoURL": "r"}}},
            "health": {"status": "Degraded", "message": "boom"},
            "resources": [{"kind": "Deployment", "name": "web"}],
            "reconciledAt": "2025-01-01T00:00:00Z",
        }});
        let observed = observe_value("gitops-x".into(), BTreeMap::new(), &app);
        assert_eq!(observed.sync_status.as_deref(), Some("Synced"));
        assert_eq!(observed.health_message.as_deref(), Some("boom"));
        assert_eq!(observed.conditions, json!([]));
        assert_eq!(observed.reconciled_state, Some(json!({"source": {"repoURL": "r"}})));
        assert_eq!(observed.operation, None);
        let mut later = app.clone();
        later["status"]["reconciledAt"] = json!("2025-01-01T00:03:00Z");
        assert_eq!(observe_value("gitops-x".into(), BTreeMap::new(), &later), observed);
    }

    #[test]
    fn the_operation_state_is_kept_whole_and_parsed() {
        let state = json!({
            "phase": "Succeeded", "message": "ok", "startedAt": "2025-01-01T00:00:00Z",
            "finishedAt": "2025-01-01T00:00:05Z", "syncResult": {"revision": "r1"},
            "operation": {"info": [{"name": "correlation-id", "value": "abc"}]},
        });
        let app = json!({"status": {"operationState": state}});
        let observed = observe_value("gitops-x".into(), BTreeMap::new(), &app);
        assert_eq!(observed.operation_state.as_ref(), Some(&state));
        let operation = observed.operation.expect("an operation");
        assert_eq!((operation.correlation_id.as_deref(), operation.phase), (Some("abc"), OperationPhase::Succeeded));
        assert_eq!(operation.synced_revision.as_deref(), Some("r1"));
        assert_eq!(operation.started_at.as_deref(), Some("2025-01-01T00:00:00Z"));
        assert_eq!(operation.finished_at.as_deref(), Some("2025-01-01T00:00:05Z"));
    }
}
