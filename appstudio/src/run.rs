//! Starts the layer's controllers on one client and stops them together.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::context::{Context, Settings};
use crate::{binding, claim, environment, promotion};

/// Runs every controller until `cancel` is cancelled, then lets in-flight
/// reconciles finish.
pub async fn run_controllers(client: kube::Client, settings: Settings, cancel: CancellationToken) {
    run_with_metrics(client, settings, Arc::default(), cancel).await;
}

/// As [`run_controllers`], counting into `metrics`.
pub async fn run_with_metrics(
    client: kube::Client,
    settings: Settings,
    metrics: Arc<crate::metrics::Metrics>,
    cancel: CancellationToken,
) {
    let (ctx, namespaces) = Context::new(client, settings, metrics);
    let ctx = Arc::new(ctx);
    let stop = || {
        let cancel = cancel.clone();
        async move { cancel.cancelled().await }
    };
    let namespaces = tokio::spawn(namespaces);
    tokio::join!(
        environment::run(ctx.clone(), stop()),
        environment::legacy::run(ctx.clone(), stop()),
        binding::run(ctx.clone(), stop()),
        promotion::run(ctx.clone(), stop()),
        claim::run(ctx.clone(), stop()),
        claim::reclaim::run(ctx.clone(), stop()),
        claim::provision::run(ctx.clone(), stop()),
    );
    namespaces.abort();
}
