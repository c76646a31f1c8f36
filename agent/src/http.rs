//! The agent's small HTTP endpoint: `/metrics` (Prometheus text), `/healthz` (the
//! process answers) and `/readyz` (LISTEN connected and the database reachable).
//! Plain hyper: three fixed routes need no web framework.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gitops_shared::db::{DbPool, pooled};
use gitops_shared::listen::Listener;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How long `/readyz` waits for the database.
const READY_DB_TIMEOUT: Duration = Duration::from_secs(2);

/// What the endpoints read.
#[derive(Clone)]
pub struct Endpoints {
    pub metrics: Arc<Metrics>,
    pub listener: Listener,
    pub pool: DbPool,
}

/// Binds `address`; fails at once when it is taken.
pub async fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(address).await
}

/// Serves the endpoints on `listener` until `cancel` fires.
pub async fn serve(listener: TcpListener, endpoints: Endpoints, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "could not accept an HTTP connection");
                continue;
            }
        };
        let endpoints = endpoints.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let endpoints = endpoints.clone();
                async move { Ok::<_, Infallible>(respond(&endpoints, &request).await) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                result = connection => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "HTTP connection ended with an error");
                    }
                }
            }
        });
    }
}

async fn respond(endpoints: &Endpoints, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n".into());
    }
    match request.uri().path() {
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
            let listening = endpoints.listener.is_connected();
            let database = database_reachable(&endpoints.pool).await;
            if listening && database {
                text(StatusCode::OK, "ready\n".into())
            } else {
                let body = format!("not ready: listen_connected={listening} database_reachable={database}\n");
                text(StatusCode::SERVICE_UNAVAILABLE, body)
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

async fn database_reachable(pool: &DbPool) -> bool {
    let probe = async {
        let client = pooled(pool).await.ok()?;
        client.query_one("SELECT 1", &[]).await.ok()
    };
    matches!(tokio::time::timeout(READY_DB_TIMEOUT, probe).await, Ok(Some(_)))
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}
