//! A validating admission webhook for tests: an HTTPS server on 127.0.0.1 (a fresh
//! CA and a certificate with IP SAN 127.0.0.1, which a real kube-apiserver insists
//! on) that answers each `admission.k8s.io/v1` AdmissionReview with what the test's
//! function decides, and hands every review it received to the test. It serves on the
//! runtime that started it until dropped, so dropping it is how a test takes a webhook
//! down.

use std::convert::Infallible;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::tls;

/// What the webhook answers to one review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// `allowed: false` with `status.code` and `status.message`.
    Deny {
        code: u16,
        message: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookServerError {
    #[error("generate the webhook's certificates")]
    Tls(#[from] tls::TlsError),
    #[error("listen on 127.0.0.1")]
    Bind(#[source] std::io::Error),
}

type Decide = dyn Fn(&Value) -> Verdict + Send + Sync;

/// A running webhook; it stops when dropped.
pub struct WebhookServer {
    port: u16,
    ca_bundle: String,
    reviews: mpsc::UnboundedReceiver<Value>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer").field("port", &self.port).finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// Starts serving on a free port of 127.0.0.1; `decide` gets each review's `request`.
    pub async fn start(decide: impl Fn(&Value) -> Verdict + Send + Sync + 'static) -> Result<Self, WebhookServerError> {
        let material = tls::generate()?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.map_err(WebhookServerError::Bind)?;
        let port = listener.local_addr().map_err(WebhookServerError::Bind)?.port();
        let acceptor = tokio_rustls::TlsAcceptor::from(material.server_config.clone());
        let (sender, reviews) = mpsc::unbounded_channel();
        let decide: Arc<Decide> = Arc::new(decide);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (acceptor, decide, sender) = (acceptor.clone(), decide.clone(), sender.clone());
                        connections.spawn(async move {
                            let Ok(stream) = acceptor.accept(stream).await else { return };
                            let service = service_fn(move |request| {
                                answer(request, decide.clone(), sender.clone())
                            });
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(material.ca_pem);
        Ok(WebhookServer { port, ca_bundle, reviews, task })
    }

    /// `https://127.0.0.1:PORT/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}/{}", self.port, path.trim_start_matches('/'))
    }

    /// The CA as `clientConfig.caBundle` wants it (base64 of PEM).
    pub fn ca_bundle(&self) -> &str {
        &self.ca_bundle
    }

    /// The next review received (the whole AdmissionReview), or None when none comes
    /// within `within`.
    pub async fn next_review(&mut self, within: std::time::Duration) -> Option<Value> {
        tokio::time::timeout(within, self.reviews.recv()).await.ok().flatten()
    }
}

impl Drop for WebhookServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    request: http::Request<hyper::body::Incoming>,
    decide: Arc<Decide>,
    sender: mpsc::UnboundedSender<Value>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(reply(StatusCode::BAD_REQUEST, json!({"error": "unreadable body"}))),
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return Ok(reply(StatusCode::BAD_REQUEST, json!({"error": "not JSON"})));
    };
    let empty = Value::Null;
    let sent = review.get("request").unwrap_or(&empty);
    let mut response = json!({"uid": sent.get("uid").cloned().unwrap_or(Value::Null), "allowed": true});
    if let Verdict::Deny { code, message } = decide(sent) {
        response["allowed"] = json!(false);
        response["status"] = json!({"code": code, "message": message});
    }
    let _ = sender.send(review);
    Ok(reply(
        StatusCode::OK,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    ))
}

fn reply(code: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = code;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}
