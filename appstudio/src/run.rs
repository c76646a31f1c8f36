//! Starts the layer's controllers on one client and stops them together.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::context::{Context, Settings};
use crate::{binding, environment, promotion};

/// Runs every controller until `cancel` is cancelled, then lets in-flight
/// reconciles finish.
pub async fn run_controllers(client: kube::Client, settings: Settings, cancel: CancellationToken) {
    let ctx = Arc::new(Context { client, settings });
    let stop = || {
        let cancel = cancel.clone();
        async move { cancel.cancelled().await }
    };
    tokio::join!(
        environment::run(ctx.clone(), stop()),
        environment::legacy::run(ctx.clone(), stop()),
        binding::run(ctx.clone(), stop()),
        promotion::run(ctx.clone(), stop()),
    );
}
