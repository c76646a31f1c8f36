//! The agent's small HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the
//! process answers) and `/readyz` (LISTEN connected and the database reachable),
//! served by `gitops_shared::serve`.

use std::net::SocketAddr;
use std::sync::Arc;

use gitops_shared::db::DbPool;
use gitops_shared::listen::Listener;
use gitops_shared::serve::{HealthEndpoints, database_reachable, serve_health};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub listener: Listener,
    pub pool: DbPool,
}

impl HealthEndpoints for Endpoints {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    async fn readiness(&self) -> Result<(), String> {
        let listening = self.listener.is_connected();
        let database = database_reachable(&self.pool).await;
        let argocd = self.metrics.argocd_reachable.load(std::sync::atomic::Ordering::Relaxed);
        if listening && database && argocd {
            Ok(())
        } else {
            Err(format!("listen_connected={listening} database_reachable={database} argocd_reachable={argocd}"))
        }
    }
}

/// Binds `address`; fails at once when it is taken.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Serves the endpoints on `listener` until `cancel` fires.
pub async fn serve(listener: TcpListener, endpoints: Endpoints, cancel: CancellationToken) {
    serve_health(listener, endpoints, cancel).await;
}
