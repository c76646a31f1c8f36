//! The writer's validating admission webhook: HTTPS (certificate and key from files,
//! read again when they change, as cert-manager rotates them), `POST /validate`
//! with an `admission.k8s.io/v1` AdmissionReview, answered by `review`. Every
//! writer replica answers, whatever shards it owns. The API server calls it for
//! CREATE and UPDATE of the tenant resources (`ops/deploy/writer/webhook.yaml`).
//!
//! The server is not the writer's alone: [`bind`] and [`serve`] answer with any
//! [`Review`], and the AppStudio layer serves its own rules with them.

pub mod escalation;
pub mod review;
pub mod spec_check;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube::api::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::context::WriterContext;
use review::Reviewer;

/// The verdict of one webhook on one admission request, and the count of it.
pub trait Review: Send + Sync + 'static {
    /// Allows or refuses `request` (a refusal's message is what the client prints).
    fn review<'a>(
        &'a self,
        request: &'a AdmissionRequest<DynamicObject>,
    ) -> futures_util::future::BoxFuture<'a, AdmissionResponse>;

    /// Counts one review: the request (None: not an AdmissionReview) and its
    /// outcome, `allowed`, `denied` or `error`.
    fn count(&self, request: Option<&AdmissionRequest<DynamicObject>>, outcome: &'static str);
}

impl Review for Reviewer {
    fn review<'a>(
        &'a self,
        request: &'a AdmissionRequest<DynamicObject>,
    ) -> futures_util::future::BoxFuture<'a, AdmissionResponse> {
        Box::pin(Reviewer::review(self, request))
    }

    fn count(&self, request: Option<&AdmissionRequest<DynamicObject>>, outcome: &'static str) {
        self.ctx.metrics.admission_reviewed(request.map_or("other", review::kind_label), outcome);
    }
}

/// The writer's reviewer: its rules, the tenancy checks and the approvals.
pub fn writer_reviewer(ctx: Arc<WriterContext>) -> Arc<dyn Review> {
    Arc::new(Reviewer { escalation: escalation::Escalation::new(ctx.kube.clone()), ctx })
}

/// Largest AdmissionReview body read (the API server's own request limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;
/// How often the certificate files are looked at for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(2);
/// Connections served at once (more wait in the accept queue).
const MAX_CONNECTIONS: usize = 1024;
/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and with which certificate the webhook is served.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub address: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("could not read the webhook certificate or key ({path})")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the webhook certificate or key in {path} is not usable PEM")]
    Pem { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("the webhook key is not a supported private key")]
    Key { source: rustls::Error },
}

fn load(cert_file: &PathBuf, key_file: &PathBuf) -> Result<Arc<CertifiedKey>, WebhookError> {
    let pem_error = |path: &PathBuf| {
        let path = path.clone();
        move |source: rustls::pki_types::pem::Error| match source {
            rustls::pki_types::pem::Error::Io(source) => WebhookError::Read { path: path.clone(), source },
            source => WebhookError::Pem { path: path.clone(), source },
        }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(pem_error(cert_file))?
        .collect::<Result<_, _>>()
        .map_err(pem_error(cert_file))?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(pem_error(key_file))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|source| WebhookError::Key { source })?;
    Ok(Arc::new(CertifiedKey::new(chain, signer)))
}

fn modified(path: &PathBuf) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The serving certificate, read again when either file changes.
#[derive(Debug)]
struct ReloadingCert {
    cert_file: PathBuf,
    key_file: PathBuf,
    state: Mutex<Loaded>,
}

/// When the files were last looked at, their modification times then, and the key.
type Loaded = (Instant, (Option<SystemTime>, Option<SystemTime>), Arc<CertifiedKey>);

impl ReloadingCert {
    fn new(cert_file: PathBuf, key_file: PathBuf) -> Result<ReloadingCert, WebhookError> {
        let stamps = (modified(&cert_file), modified(&key_file));
        let key = load(&cert_file, &key_file)?;
        Ok(ReloadingCert { cert_file, key_file, state: Mutex::new((Instant::now(), stamps, key)) })
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.0.elapsed() >= RELOAD_CHECK {
            state.0 = Instant::now();
            let stamps = (modified(&self.cert_file), modified(&self.key_file));
            if stamps != state.1 {
                match load(&self.cert_file, &self.key_file) {
                    Ok(key) => {
                        tracing::info!("webhook certificate reloaded");
                        state.1 = stamps;
                        state.2 = key;
                    }
                    // Half-written files: keep serving the old one and look again.
                    Err(error) => {
                        tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not reload the webhook certificate; keeping the old one")
                    }
                }
            }
        }
        Some(state.2.clone())
    }
}

/// Binds the webhook's socket and reads its certificate (so a bad configuration
/// fails at start); [`serve`] then answers on it.
pub async fn bind(settings: &WebhookSettings) -> Result<(TcpListener, tokio_rustls::TlsAcceptor), crate::WriterError> {
    let resolver = ReloadingCert::new(settings.cert_file.clone(), settings.key_file.clone())
        .map_err(|source| crate::WriterError::Webhook { source })?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|source| crate::WriterError::Webhook { source: WebhookError::Key { source } })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let listener = TcpListener::bind(settings.address)
        .await
        .map_err(|source| crate::WriterError::Bind { address: settings.address, source })?;
    Ok((listener, tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}

/// Answers admission reviews with `reviewer` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    reviewer: Arc<dyn Review>,
    cancel: CancellationToken,
) {
    let connections = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let (stream, _) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "could not accept a webhook connection");
                    continue;
                }
            },
        };
        let (acceptor, reviewer, cancel) = (acceptor.clone(), reviewer.clone(), cancel.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::debug!(%error, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("webhook TLS handshake timed out");
                    return;
                }
            };
            let service = service_fn(move |request: Request<Incoming>| {
                let reviewer = reviewer.clone();
                async move { Ok::<_, Infallible>(respond(&reviewer, request).await) }
            });
            let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = cancel.cancelled() => {}
                result = connection => if let Err(error) = result {
                    tracing::debug!(%error, "webhook connection ended with an error");
                },
            }
        });
    }
}

fn reply(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

async fn respond(reviewer: &Arc<dyn Review>, request: Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::POST || request.uri().path() != "/validate" {
        return reply(StatusCode::NOT_FOUND, b"{\"message\":\"not found\"}".to_vec());
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::PAYLOAD_TOO_LARGE, b"{\"message\":\"request too large\"}".to_vec()),
    };
    let review: Result<AdmissionReview<DynamicObject>, _> = serde_json::from_slice(&body);
    let request: Option<AdmissionRequest<DynamicObject>> = review.ok().and_then(|r| r.try_into().ok());
    let response = match request {
        Some(request) => {
            let response = reviewer.review(&request).await;
            reviewer.count(Some(&request), if response.allowed { "allowed" } else { "denied" });
            if !response.allowed {
                tracing::info!(
                    kind = %request.kind.kind,
                    tenant.ns = request.namespace.as_deref().unwrap_or_default(),
                    object = %request.name,
                    user = request.user_info.username.as_deref().unwrap_or_default(),
                    "admission denied"
                );
            }
            response
        }
        None => {
            reviewer.count(None, "error");
            AdmissionResponse::invalid("the request is not an admission.k8s.io/v1 AdmissionReview")
        }
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(body) => reply(StatusCode::OK, body),
        Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, b"{\"message\":\"could not encode the review\"}".to_vec()),
    }
}
