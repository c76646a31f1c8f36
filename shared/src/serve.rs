//! The small HTTP endpoint every binary serves, `/metrics` (Prometheus text),
//! `/healthz` (the process answers) and `/readyz` (what the binary says it needs),
//! and the SIGTERM/SIGINT watch that starts a graceful shutdown. Plain hyper: three
//! fixed routes need no web framework.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::db::{DbPool, pooled};

/// How long a readiness probe waits for the database.
const READY_DB_TIMEOUT: Duration = Duration::from_secs(2);

/// What a binary's endpoints read.
pub trait HealthEndpoints: Clone + Send + Sync + 'static {
    /// The `/metrics` body, Prometheus text format.
    fn metrics(&self) -> String;

    /// `Ok` when ready; otherwise what is not, as `name=value` pairs (the
    /// `/readyz` body is `not ready: ` followed by them).
    fn readiness(&self) -> impl Future<Output = Result<(), String>> + Send;
}

/// Serves `endpoints` on `listener` until `cancel` fires.
pub async fn serve_health<E: HealthEndpoints>(listener: TcpListener, endpoints: E, cancel: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "could not accept an HTTP connection");
                    continue;
                }
            },
        };
        let (endpoints, cancel) = (endpoints.clone(), cancel.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
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

async fn respond<E: HealthEndpoints>(endpoints: &E, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match path {
        "/metrics" => {
            let mut response = text(StatusCode::OK, endpoints.metrics());
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match endpoints.readiness().await {
            Ok(()) => text(StatusCode::OK, "ready\n".into()),
            Err(detail) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {detail}\n")),
        },
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

/// Whether `pool` answers `SELECT 1` within a readiness probe's patience.
pub async fn database_reachable(pool: &DbPool) -> bool {
    let probe = async { pooled(pool).await.ok()?.query_one("SELECT 1", &[]).await.ok() };
    matches!(tokio::time::timeout(READY_DB_TIMEOUT, probe).await, Ok(Some(_)))
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// Cancels `cancel` on SIGTERM or SIGINT.
pub async fn cancel_on_signal(cancel: CancellationToken) {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot watch for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        () = terminate => tracing::info!("SIGTERM: shutting down"),
    }
    cancel.cancel();
}
