//! The controllers' workers: each takes the next key from the work queue,
//! reconciles it when this writer owns its namespace, counts the outcome, and
//! puts the key back after a delay or a backoff when it has to be looked at again.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use gitops_shared::telemetry::error_chain;
use tokio_util::sync::CancellationToken;

use super::{
    Controllers, Next, ReconcileError, Settled, deployment, environment, namespace, repository_credential, sync_run,
};
use crate::metrics::{Inventory, ObjectRef, Outcome};
use crate::work_queue::Kind;

pub(super) async fn worker(ctl: Arc<Controllers>, cancel: CancellationToken) {
    // The tenant and deployment gauges are read from `known` when rendered.
    let known = Arc::downgrade(&ctl);
    let inventory: std::sync::Weak<dyn Inventory> = known;
    ctl.ctx.metrics.set_inventory(inventory);
    while let Some(key) = ctl.ctx.queue.pop(&cancel).await {
        ctl.ctx.metrics.queue_depth.store(ctl.ctx.queue.len() as u64, Ordering::Relaxed);
        let outcome = if ctl.owns(&key.namespace) {
            match key.kind {
                Kind::Deployment => deployment::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::SyncRun => sync_run::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::Environment => environment::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::RepositoryCredential => repository_credential::reconcile(&ctl, &key.namespace, &key.name).await,
                Kind::Namespace => namespace::reconcile(&ctl, &key.namespace).await,
            }
        } else {
            Ok(Next::Done)
        };
        let metrics = &ctl.ctx.metrics;
        if outcome.is_ok() {
            ctl.ctx.queue.forget(&key);
        }
        let object = ObjectRef { kind: key.kind, namespace: key.namespace.clone(), name: key.name.clone() };
        match outcome {
            Ok(Next::Done) => metrics.validation_cleared(&object),
            Ok(Next::Settled(Settled::Ok)) => {
                metrics.reconciled(key.kind, Outcome::Ok);
                metrics.validation_cleared(&object);
            }
            Ok(Next::Revisit(delay)) => {
                metrics.reconciled(key.kind, Outcome::Ok);
                metrics.validation_cleared(&object);
                ctl.ctx.queue.push_after(key.clone(), delay, &cancel);
            }
            Ok(Next::Settled(Settled::Invalid(reason))) => {
                metrics.reconciled(key.kind, Outcome::Invalid);
                let generation = ctl.known().get(&key).and_then(|seen| seen.generation);
                metrics.validation_failed(object, generation, reason);
            }
            Err(ReconcileError::StatusMoved) => {
                metrics.reconciled(key.kind, Outcome::Retry);
                ctl.ctx.queue.push(key.clone());
            }
            // The namespace's own cleanup runs from its key; nothing to retry here.
            Err(ReconcileError::NamespaceGone) => ctl.ctx.queue.forget(&key),
            Ok(Next::Retry(delay)) => {
                metrics.reconciled(key.kind, Outcome::Retry);
                ctl.ctx.queue.push_after(key.clone(), delay, &cancel);
            }
            Err(error) => {
                metrics.reconciled(key.kind, Outcome::Failed);
                let retry_in = ctl.ctx.queue.retry_later(key.clone(), &cancel);
                tracing::warn!(
                    error = %error_chain(&error),
                    tenant.ns = %key.namespace,
                    object = %key.name,
                    retry_in_ms = retry_in.as_millis() as u64,
                    "reconcile failed; retrying"
                );
            }
        }
        ctl.ctx.queue.done(&key);
    }
}
