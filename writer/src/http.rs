//! The writer's HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the
//! process answers) and `/readyz` (watchers synced, LISTEN connected, database
//! reachable). Plain hyper, as the agent's: the accept loop mirrors
//! `agent/src/http.rs` and belongs in a shared crate once a third binary needs it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gitops_shared::db::{DbPool, pooled};
use gitops_shared::listen::Listener;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::WriterMetrics;

/// How long `/readyz` waits for the database.
const READY_DB_TIMEOUT: Duration = Duration::from_secs(2);

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<WriterMetrics>,
    pub listener: Listener,
    pub pool: DbPool,
}

/// Serves the endpoints on `socket` until `cancel` fires.
pub async fn serve(socket: TcpListener, endpoints: Endpoints, cancel: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = socket.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "could not accept an HTTP connection");
                    continue;
                }
            },
        };
        let (endpoints, cancel) = (endpoints.clone(), cancel.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&endpoints, request.method(), request.uri().path()).await) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                result = connection => if let Err(error) = result {
                    tracing::debug!(%error, "HTTP connection ended with an error");
                },
            }
        });
    }
}

async fn respond(endpoints: &Endpoints, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match path {
        "/metrics" => {
            let mut response = text(StatusCode::OK, endpoints.metrics.render());
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => {
            let synced = endpoints.metrics.is_ready();
            let listening = endpoints.listener.is_connected();
            let database = database_reachable(&endpoints.pool).await;
            if synced && listening && database {
                text(StatusCode::OK, "ready\n".into())
            } else {
                let body = format!(
                    "not ready: watchers_synced={synced} listen_connected={listening} database_reachable={database}\n"
                );
                text(StatusCode::SERVICE_UNAVAILABLE, body)
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

async fn database_reachable(pool: &DbPool) -> bool {
    let probe = async { pooled(pool).await.ok()?.query_one("SELECT 1", &[]).await.ok() };
    matches!(tokio::time::timeout(READY_DB_TIMEOUT, probe).await, Ok(Some(_)))
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
