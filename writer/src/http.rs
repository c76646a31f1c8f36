//! The writer's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the
//! process answers) and `/readyz` (watchers synced, LISTEN connected, database
//! reachable, the home role and namespace present), served by `gitops_shared::serve` as the agent's is.

use std::sync::Arc;

use gitops_shared::db::DbPool;
use gitops_shared::listen::Listener;
use gitops_shared::serve::{HealthEndpoints, database_reachable, serve_health};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::WriterMetrics;

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<WriterMetrics>,
    pub listener: Listener,
    pub pool: DbPool,
    pub home_status: Arc<crate::controller::HomeStatus>,
}

impl HealthEndpoints for Endpoints {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    async fn readiness(&self) -> Result<(), String> {
        let synced = self.metrics.is_ready();
        let listening = self.listener.is_connected();
        let database = database_reachable(&self.pool).await;
        let home = self.home_status.problem().is_none();
        if synced && listening && database && home {
            Ok(())
        } else {
            Err(format!(
                "watchers_synced={synced} listen_connected={listening} database_reachable={database} home_identity_possible={home}"
            ))
        }
    }
}

/// Serves the endpoints on `socket` until `cancel` fires.
pub async fn serve(socket: TcpListener, endpoints: Endpoints, cancel: CancellationToken) {
    serve_health(socket, endpoints, cancel).await;
}
