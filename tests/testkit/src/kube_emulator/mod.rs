//! A Kubernetes API emulator: an HTTP server that speaks the Kubernetes API
//! closely enough that `kube` (Api, watcher, Controller, server-side apply,
//! finalizers) and kubectl work against it unchanged, for fast tests and the
//! local quickstart. State lives in memory for as long as the emulator runs.
//! What is implemented and what is a deliberate limit: see `README.md` beside
//! this file.

mod access;
mod admission;
mod apply;
mod auth;
mod builtin;
mod crd;
mod delete;
mod discovery;
mod dry_run;
mod errors;
mod escalation;
mod fieldpath;
mod fields;
mod gc;
mod kubeconfig;
mod managed;
mod meta;
mod openapi;
mod patch;
mod protobuf;
mod rbac;
mod read;
mod resources;
mod review;
mod router;
mod schema;
mod selector;
mod server;
mod store;
mod table;
pub(crate) mod tls;
mod watch;
mod webhook_client;
pub mod webhook_server;
mod write;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

use self::auth::TokenBook;
use self::router::Shared;
use self::store::State;
pub use self::store::{ExpiredAnswers, HistoryWindows};

/// How to run the emulator.
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Where to write the kubeconfig; a temporary file (removed on drop) when None.
    pub kubeconfig: Option<PathBuf>,
    /// A kube-apiserver style token file (`token,user,uid,"group1,group2"`).
    pub tokens: Option<PathBuf>,
    /// Serve HTTPS with a generated CA (written into the kubeconfig).
    pub tls: bool,
    /// How long watch and list history is kept (the API server's defaults).
    pub history: HistoryWindows,
    /// How long an Event lives after its last write (kube-apiserver's `--event-ttl`,
    /// 1 h by default); without it, Events accumulate for as long as the emulator runs.
    pub event_ttl: Duration,
}

/// kube-apiserver's default `--event-ttl`.
pub const DEFAULT_EVENT_TTL: Duration = Duration::from_secs(3600);

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kubeconfig: None,
            tokens: None,
            tls: false,
            history: HistoryWindows::default(),
            event_ttl: DEFAULT_EVENT_TTL,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmulatorError {
    #[error("listen on {addr}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("read the token file {path}")]
    ReadTokens { path: PathBuf, source: std::io::Error },
    #[error("parse the token file {path}")]
    ParseTokens { path: PathBuf, source: auth::AuthError },
    #[error("generate the TLS certificates")]
    Tls(#[from] tls::TlsError),
    #[error("write the kubeconfig {path}")]
    WriteKubeconfig { path: PathBuf, source: std::io::Error },
}

/// A running emulator; it stops when dropped (or on `shutdown`).
pub struct KubeEmulator {
    url: String,
    kubeconfig: PathBuf,
    admin_token: String,
    ca_pem: Option<String>,
    stop: signal::Sender<bool>,
    task: JoinHandle<()>,
    temp_dir: Option<PathBuf>,
    state: Arc<Mutex<State>>,
}

/// A handle that compacts a running emulator's history (etcd's compaction, on
/// demand): how a test forces the `410 Gone` a watcher meets after a long gap.
#[derive(Clone)]
pub struct Compactor(Arc<Mutex<State>>);

impl std::fmt::Debug for Compactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compactor")
    }
}

impl Compactor {
    /// Forgets every resource's history: watches resuming and lists continuing from
    /// an older resourceVersion answer 410 Gone.
    pub fn compact(&self) {
        router::lock(&self.0).compact();
    }
}

impl std::fmt::Debug for KubeEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEmulator").field("url", &self.url).field("kubeconfig", &self.kubeconfig).finish()
    }
}

fn random_token() -> String {
    let mut bytes = [0u8; 24];
    if getrandom::fill(&mut bytes).is_err() {
        return uuid::Uuid::new_v4().simple().to_string();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn token_book(options: &EmulatorOptions, admin_token: &str) -> Result<TokenBook, EmulatorError> {
    let Some(path) = &options.tokens else { return Ok(TokenBook::with_admin(admin_token.to_owned())) };
    let text =
        std::fs::read_to_string(path).map_err(|source| EmulatorError::ReadTokens { path: path.clone(), source })?;
    let mut book =
        TokenBook::from_csv(&text).map_err(|source| EmulatorError::ParseTokens { path: path.clone(), source })?;
    book.add_admin(admin_token.to_owned());
    Ok(book)
}

impl KubeEmulator {
    /// Starts serving; returns once the kubeconfig is written.
    pub async fn start(options: EmulatorOptions) -> Result<KubeEmulator, EmulatorError> {
        let admin_token = random_token();
        let book = token_book(&options, &admin_token)?;
        let material = if options.tls { Some(tls::generate()?) } else { None };
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| EmulatorError::Bind { addr: options.listen, source })?;
        let addr = listener.local_addr().map_err(|source| EmulatorError::Bind { addr: options.listen, source })?;
        let scheme = if options.tls { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");

        let mut state = State::with_history(options.history);
        let mut rbac_objects = rbac::bootstrap_cluster_roles();
        rbac_objects.extend(rbac::bootstrap_cluster_role_bindings());
        builtin::bootstrap(&mut state, rbac_objects);
        let (stop, stop_rx) = signal::channel(false);
        let state = Arc::new(Mutex::new(state));
        let shared =
            Arc::new(Shared { state: state.clone(), book, server_address: addr.to_string(), stop: stop_rx.clone() });
        let acceptor = material.as_ref().map(|m| tokio_rustls::TlsAcceptor::from(m.server_config.clone()));
        let task = tokio::spawn(server::serve(listener, acceptor, shared, stop_rx.clone()));
        tokio::spawn(expire_events(state.clone(), options.event_ttl, stop_rx));

        let ca_pem = material.map(|m| m.ca_pem);
        let (kubeconfig_path, temp_dir) = match &options.kubeconfig {
            Some(path) => (path.clone(), None),
            None => {
                let dir = std::env::temp_dir().join(format!("kube-emulator-{}-{}", std::process::id(), random_token()));
                (dir.join("kubeconfig"), Some(dir))
            }
        };
        let document = kubeconfig::document(&url, ca_pem.as_deref(), &admin_token);
        kubeconfig::write(&kubeconfig_path, &document)
            .map_err(|source| EmulatorError::WriteKubeconfig { path: kubeconfig_path.clone(), source })?;
        tracing::info!(url = %url, kubeconfig = %kubeconfig_path.display(), "kube emulator ready");
        Ok(KubeEmulator { url, kubeconfig: kubeconfig_path, admin_token, ca_pem, stop, task, temp_dir, state })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// How often watches and paged lists were answered 410 Gone so far: whether
    /// the history windows were long enough for the clients.
    pub fn expired_answers(&self) -> ExpiredAnswers {
        router::lock(&self.state).expired_answers()
    }

    /// A handle to compact this emulator's history.
    pub fn compactor(&self) -> Compactor {
        Compactor(self.state.clone())
    }

    /// A kube client with the admin token, built from the kubeconfig by kube's own
    /// config code. Panics if the kubeconfig cannot be read (test support).
    pub async fn client(&self) -> kube::Client {
        let document = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("read the emulator's kubeconfig");
        Self::client_from(document).await
    }

    /// A kube client that authenticates with `token` (empty: anonymous).
    pub async fn client_with_token(&self, token: &str) -> kube::Client {
        let mut document = kubeconfig::document(&self.url, self.ca_pem.as_deref(), token);
        if token.is_empty() {
            document["users"][0]["user"] = serde_json::json!({});
        }
        let document: kube::config::Kubeconfig =
            serde_json::from_value(document).expect("the emulator's kubeconfig is a valid Kubeconfig");
        Self::client_from(document).await
    }

    async fn client_from(document: kube::config::Kubeconfig) -> kube::Client {
        let config = kube::Config::from_custom_kubeconfig(document, &kube::config::KubeConfigOptions::default())
            .await
            .expect("load the emulator's kubeconfig");
        kube::Client::try_from(config).expect("build a kube client for the emulator")
    }

    /// Stops serving and waits for the listener to close.
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
    }
}

impl Drop for KubeEmulator {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.task.abort();
        if let Some(dir) = &self.temp_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_admission;

/// Deletes expired Events every so often (a tenth of the TTL, 1 to 60 s) until the
/// emulator stops.
async fn expire_events(state: Arc<Mutex<State>>, ttl: Duration, mut stop: signal::Receiver<bool>) {
    let every = (ttl / 10).clamp(Duration::from_secs(1), Duration::from_secs(60));
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let expired = router::lock(&state).expire_events(std::time::Instant::now(), ttl);
        if expired > 0 {
            tracing::debug!(expired, "Events past their TTL deleted");
        }
    }
}
