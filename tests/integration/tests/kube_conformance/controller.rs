//! A `kube::runtime::Controller` as the service's components write them: it watches a
//! CRD, adds its finalizer (`kube::runtime::finalizer`, JSON patches with `test`), writes
//! status through the status subresource, follows spec changes, and cleans up on delete.
//! The test only creates, changes and deletes objects and waits for the effects.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{self, Event, finalizer};
use kube::runtime::watcher;
use serde_json::json;

use super::{Env, GADGET};
use crate::support::eventually;

const FINALIZER: &str = "conformance.gitops.example.invalid/cleanup";

struct Context {
    api: Api<DynamicObject>,
    cleaned_up: Mutex<Vec<String>>,
}

async fn reconcile(object: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, finalizer::Error<kube::Error>> {
    let api = ctx.api.clone();
    finalizer(&api, FINALIZER, object, |event| async {
        match event {
            Event::Apply(object) => {
                let status = json!({"status": {
                    "ready": true,
                    "observedGeneration": object.metadata.generation,
                    "message": format!("size {}", object.data["spec"]["size"]),
                }});
                api.patch_status(&object.name_any(), &PatchParams::default(), &Patch::Merge(status)).await?;
                Ok(Action::await_change())
            }
            Event::Cleanup(object) => {
                ctx.cleaned_up.lock().expect("lock").push(object.name_any());
                Ok(Action::await_change())
            }
        }
    })
    .await
}

fn error_policy(_object: Arc<DynamicObject>, _error: &finalizer::Error<kube::Error>, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_millis(100))
}

/// The object once its status reports `generation` reconciled, with `message`.
async fn reconciled(api: &Api<DynamicObject>, name: &str, generation: i64, message: &str) -> DynamicObject {
    eventually(&format!("{name} reconciled at generation {generation}"), || async {
        let object = api.get(name).await.ok()?;
        let status = object.data.get("status")?;
        let done =
            status["ready"] == true && status["observedGeneration"] == generation && status["message"] == message;
        done.then_some(object)
    })
    .await
}

#[tokio::test]
async fn a_controller_reconciles_status_and_finalizes_deleted_objects() {
    let env = Env::new("controller").await;
    let gadgets = env.api(GADGET);
    // One object exists before the controller starts, one is created after.
    gadgets.create(&PostParams::default(), &GADGET.object("early", json!({"spec": {"size": 1}}))).await.unwrap();

    let ctx = Arc::new(Context { api: gadgets.clone(), cleaned_up: Mutex::new(Vec::new()) });
    let controller = Controller::new_with(gadgets.clone(), watcher::Config::default(), GADGET.resource())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|_| futures_util::future::ready(()));
    let controller = tokio::spawn(controller);

    gadgets.create(&PostParams::default(), &GADGET.object("late", json!({"spec": {"size": 2}}))).await.unwrap();
    let early = reconciled(&gadgets, "early", 1, "size 1").await;
    let late = reconciled(&gadgets, "late", 1, "size 2").await;
    for object in [&early, &late] {
        assert_eq!(object.finalizers(), [FINALIZER]);
        assert_eq!(object.metadata.generation, Some(1), "finalizer and status writes keep the generation");
    }

    gadgets.patch("late", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 20}}))).await.unwrap();
    reconciled(&gadgets, "late", 2, "size 20").await;

    for name in ["early", "late"] {
        gadgets.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("both objects finalized and gone", || async {
        let left = gadgets.list(&Default::default()).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await;
    let mut cleaned_up = ctx.cleaned_up.lock().expect("lock").clone();
    cleaned_up.sort();
    cleaned_up.dedup();
    assert_eq!(cleaned_up, ["early", "late"]);
    controller.abort();
}
