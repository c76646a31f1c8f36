//! The agent process's small HTTP endpoint: `/metrics` (Prometheus text, every
//! served instance's series labelled `instance`), `/healthz` (the process answers)
//! and `/readyz` (the database reachable, every served instance's LISTEN connected,
//! and some instance's Argo CD answering), served by `gitops_shared::serve` with
//! what `crate::registry` reads.

use std::net::SocketAddr;

use gitops_shared::serve::{HealthEndpoints, serve_health};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Binds `address`; fails at once when it is taken.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Serves `endpoints` on `listener` until `cancel` fires.
pub async fn serve(listener: TcpListener, endpoints: impl HealthEndpoints, cancel: CancellationToken) {
    serve_health(listener, endpoints, cancel).await;
}
