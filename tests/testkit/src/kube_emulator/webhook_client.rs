//! The HTTPS call to a validating webhook: POST of the AdmissionReview to
//! `clientConfig.url` (with `?timeout=Ns` as kube-apiserver appends it), the server's
//! certificate verified against `clientConfig.caBundle` (only that CA: no system roots,
//! so a webhook without a caBundle fails the TLS check), over HTTP/1.1 connections
//! kept open and reused per (host, port, caBundle) as kube-apiserver's client keeps
//! them, everything within `timeoutSeconds`. Every way a call can go wrong is a
//! [`CallFailure`] worded like Go's client errors (`Post "…": dial tcp …: …`), which
//! `admission.rs` turns into a 500 or ignores per `failurePolicy`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;
/// (host, port, caBundle): where a connection goes and whom it trusts.
type PoolKey = (String, u16, Option<String>);

/// Idle connections by destination and trust (at most [`IDLE_PER_KEY`] each).
static IDLE: LazyLock<Mutex<HashMap<PoolKey, Vec<Sender>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));
/// TLS client configurations by caBundle, parsed once.
static CONFIGS: LazyLock<Mutex<HashMap<Option<String>, Arc<rustls::ClientConfig>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
const IDLE_PER_KEY: usize = 64;

use super::admission::{self, Call, CallFailure};
use super::errors::ApiError;

/// Calls every webhook of a write at once; the first refusal in webhook order wins
/// (a denial, or a failed call of a webhook that fails closed).
pub async fn run(calls: &[Call]) -> Result<(), ApiError> {
    let answers = futures_util::future::join_all(calls.iter().map(post)).await;
    for (call, answer) in calls.iter().zip(answers) {
        let refusal = match answer.and_then(|answer| admission::judge(call, &answer)) {
            Ok(denial) => denial,
            Err(failure) => admission::call_failed(call, &failure),
        };
        if let Some(error) = refusal {
            return Err(error);
        }
    }
    Ok(())
}

/// Sends `call.review` and returns the parsed answer.
pub async fn post(call: &Call) -> Result<Value, CallFailure> {
    let Some(url) = call.url.as_deref() else {
        return Err(CallFailure(
            "the webhook names a service: the emulator calls only clientConfig.url webhooks".to_owned(),
        ));
    };
    let separator = if url.contains('?') { '&' } else { '?' };
    let shown = format!("{url}{separator}timeout={}s", call.timeout.as_secs());
    let failed = |detail: String| CallFailure(format!("Post {shown:?}: {detail}"));
    match tokio::time::timeout(call.timeout, exchange(&shown, call)).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(detail)) => Err(failed(detail)),
        Err(_) => Err(failed("context deadline exceeded".to_owned())),
    }
}

/// The call itself; Err is the detail of what failed.
async fn exchange(url: &str, call: &Call) -> Result<Value, String> {
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    if uri.scheme_str() != Some("https") {
        return Err(format!("unsupported protocol scheme {:?}", uri.scheme_str().unwrap_or("")));
    }
    let host = uri.host().ok_or("no host in the URL")?.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let key: PoolKey = (host.clone(), port, call.ca_bundle.clone());
    let body = serde_json::to_vec(&call.review).map_err(|e| format!("encode the AdmissionReview: {e}"))?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let authority = uri.authority().map_or(host.clone(), |a| a.to_string());
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, authority)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json, */*")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("build the request: {e}"))?;
    // A kept connection first; when it turns out closed, once more on a new one.
    let (mut sender, kept) = match idle(&key) {
        Some(sender) => (sender, true),
        None => (connect(&key).await?, false),
    };
    let response = match sender.send_request(request.clone()).await {
        Ok(response) => response,
        Err(_) if kept => {
            sender = connect(&key).await?;
            sender.send_request(request).await.map_err(|e| format!("send the request: {e}"))?
        }
        Err(e) => return Err(format!("send the request: {e}")),
    };
    let status = response.status();
    let bytes = response.into_body().collect().await.map_err(|e| format!("read the response: {e}"))?.to_bytes();
    keep(key, sender);
    if status != StatusCode::OK {
        return Err(format!(
            "the server responded with {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
        ));
    }
    serde_json::from_slice::<Value>(&bytes).map_err(|e| format!("the response is not JSON: {e}"))
}

/// An idle connection to `key`'s destination that is still open.
fn idle(key: &PoolKey) -> Option<Sender> {
    let mut idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner);
    let senders = idle.get_mut(key)?;
    while let Some(sender) = senders.pop() {
        if !sender.is_closed() {
            return Some(sender);
        }
    }
    None
}

/// Puts a connection back for the next call (dropped when enough are idle).
fn keep(key: PoolKey, sender: Sender) {
    if sender.is_closed() {
        return;
    }
    let mut idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner);
    let senders = idle.entry(key).or_default();
    if senders.len() < IDLE_PER_KEY {
        senders.push(sender);
    }
}

/// A new TLS connection to `key`'s destination, its HTTP/1.1 driver running.
async fn connect(key: &PoolKey) -> Result<Sender, String> {
    let (host, port, ca_bundle) = key;
    let config = {
        let cached = CONFIGS.lock().unwrap_or_else(PoisonError::into_inner).get(ca_bundle).cloned();
        match cached {
            Some(config) => config,
            None => {
                let config = Arc::new(client_config(ca_bundle.as_deref())?);
                CONFIGS.lock().unwrap_or_else(PoisonError::into_inner).insert(ca_bundle.clone(), config.clone());
                config
            }
        }
    };
    let server_name = ServerName::try_from(host.clone()).map_err(|e| format!("invalid server name {host:?}: {e}"))?;
    let tcp = TcpStream::connect((host.as_str(), *port))
        .await
        .map_err(|e| format!("dial tcp {host}:{port}: connect: {e}"))?;
    let tls = TlsConnector::from(config)
        .connect(server_name, tcp)
        .await
        .map_err(|e| format!("x509: certificate check failed: {e}"))?;
    let (sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| format!("http handshake: {e}"))?;
    // Runs until the connection closes (the server's keep-alive, or the sender dropped).
    tokio::spawn(connection);
    Ok(sender)
}

/// A TLS client trusting only the CA certificates of `ca_bundle` (base64 of PEM).
fn client_config(ca_bundle: Option<&str>) -> Result<rustls::ClientConfig, String> {
    use base64::Engine;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(bundle) = ca_bundle {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(bundle.trim())
            .map_err(|e| format!("clientConfig.caBundle is not base64: {e}"))?;
        for certificate in CertificateDer::pem_slice_iter(&pem) {
            let certificate = certificate.map_err(|e| format!("clientConfig.caBundle is not PEM: {e}"))?;
            roots.add(certificate).map_err(|e| format!("clientConfig.caBundle: {e}"))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
