//! `gitops-dev up`: the whole service on a laptop, throwaway and self-contained. A
//! PostgreSQL server in a temporary directory (durability off), the Kubernetes API
//! emulator with TLS, the Argo CD stand-in over namespace `argocd`, one registered
//! engine instance (benchmarks run several, each with its stand-in and agents) and a
//! development-only encryption key, then one writer (its
//! admission webhook registered on loopback with a throwaway certificate) and one
//! agent as child processes (the binaries built next to this one). It writes
//! `DIR/kubeconfig` and `DIR/env`, reports readiness once both children serve (the
//! writer holds shard leases, the agent's heartbeat is fresh), and on Ctrl-C or
//! SIGTERM stops the children (SIGTERM, then a bounded wait) and everything else.
//!
//! Nothing here is fit for production: the key is generated, the database forgets
//! everything on exit and the API server is an emulator.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use gitops_shared::config::{DATABASE_URL, ENCRYPTION_ACTIVE_KEY, ENCRYPTION_KEYS, ENGINE_INSTANCE};
use gitops_shared::crypto::SecretBox;
use gitops_shared::db;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_testkit::admission;
use gitops_testkit::argocd::{self, ForeignCrds, StandinOptions};
use gitops_testkit::kube_emulator::{EmulatorOptions, ExpiredAnswers, HistoryWindows, KubeEmulator};
use gitops_testkit::{PgCluster, PgOptions};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// The engine instance `dev` registers and the agent serves.
pub const DEV_INSTANCE: &str = "argocd-1";
/// Where the stand-in (Argo CD) reads its Applications.
pub const DEV_ARGOCD_NAMESPACE: &str = "argocd";
/// Tenants an engine instance takes unless the shape says otherwise (the schema's default).
pub const DEFAULT_INSTANCE_CAPACITY: i32 = 1000;
/// The database `dev` creates and migrates.
const DEV_DATABASE: &str = "gitops";
/// The id of the generated key.
const DEV_KEY_ID: &str = "dev";
/// How long the children may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(120);
/// How long a child may take to stop after SIGTERM before it is killed.
const STOP_DEADLINE: Duration = Duration::from_secs(15);
/// How long each CRD may take to be Established.
const CRD_DEADLINE: Duration = Duration::from_secs(60);
/// A heartbeat younger than this counts as an agent that is up.
const HEARTBEAT_FRESH: &str = "30 seconds";

const FIELD_MANAGER: &str = "gitops-dev";
/// The ValidatingWebhookConfiguration of the writer's webhook.
const DEV_WEBHOOK: &str = "gitops-service";
/// The AppStudio layer's webhook configuration in the local stack.
const DEV_APPSTUDIO_WEBHOOK: &str = "gitops-appstudio";

const WRITER_READY: &str = "SELECT EXISTS (SELECT 1 FROM writer_shard WHERE lease_expires_at > now())";
const AGENT_READY: &str =
    "SELECT EXISTS (SELECT 1 FROM engine_instance WHERE name = $1 AND heartbeat_at > now() - $2::text::interval)";

/// Why `dev` could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("could not prepare the directory {path}")]
    Dir { path: PathBuf, source: std::io::Error },
    #[error("{dir} is in use by another gitops-dev (process {pid}); stop it or choose another directory")]
    DirInUse { dir: PathBuf, pid: String },
    #[error("{binary} not found next to gitops-dev (in {dir}); run `cargo build --workspace` first")]
    BinaryMissing { binary: &'static str, dir: PathBuf },
    #[error("could not find gitops-dev's own location")]
    CurrentExe { source: std::io::Error },
    #[error("could not start PostgreSQL")]
    Postgres { source: gitops_testkit::PgError },
    #[error("could not {action}")]
    Db { action: &'static str, source: db::DbError },
    #[error("could not {action}")]
    Query { action: &'static str, source: tokio_postgres::Error },
    #[error("could not start the Kubernetes emulator")]
    Emulator { source: gitops_testkit::kube_emulator::EmulatorError },
    #[error("could not set up the Argo CD stand-in")]
    Standin { source: argocd::StandinError },
    #[error("could not {action} in the emulator")]
    Kube { action: String, source: kube::Error },
    #[error("CustomResourceDefinition {name} was not Established within {CRD_DEADLINE:?}")]
    CrdTimeout { name: String },
    #[error("could not generate the development key")]
    Key { source: gitops_shared::crypto::CryptoError },
    #[error("could not start {binary}")]
    Spawn { binary: &'static str, source: std::io::Error },
    #[error("{binary} exited ({status}); its log is {log}")]
    ChildExited { binary: &'static str, status: String, log: PathBuf },
    #[error("the writer and the agent were not ready within {READY_DEADLINE:?}; their logs are in {dir}")]
    NotReady { dir: PathBuf },
    #[error("could not listen for SIGTERM")]
    Signal { source: std::io::Error },
    #[error("could not make the admission webhook's certificate")]
    Certificate { source: admission::CertError },
    #[error("could not find a free port for the admission webhook")]
    Port { source: std::io::Error },
}

/// A port free on 127.0.0.1 now (the writer binds it a moment later).
fn free_port() -> Result<u16, DevError> {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").map_err(|source| DevError::Port { source })?;
    Ok(socket.local_addr().map_err(|source| DevError::Port { source })?.port())
}

/// How many writers, engine instances and agents the stack runs, and how.
#[derive(Debug, Clone)]
pub struct StackShape {
    pub writers: usize,
    /// Agents per engine instance.
    pub agents: usize,
    /// Engine instances, each with its own Argo CD stand-in: the first is
    /// [`DEV_INSTANCE`] over [`DEV_ARGOCD_NAMESPACE`], the next `argocd-2` over
    /// namespace `argocd-2`, and so on (see [`instance_names`]).
    pub instances: usize,
    /// The Argo CD version each instance's stand-in plays, by instance index; an
    /// instance without one plays the stand-in options' version.
    pub versions: Vec<String>,
    /// Register the (first) writer's admission webhook; without it, deployments into
    /// a tenant's own namespace are accepted unverified.
    pub webhook: bool,
    /// The agents' operation lease (default: theirs).
    pub agent_lease: Option<Duration>,
    /// Further environment of every writer and of every agent.
    pub writer_env: Vec<(String, String)>,
    pub agent_env: Vec<(String, String)>,
    /// Database settings (`ALTER DATABASE … SET`) made before the children start,
    /// e.g. `gitops.instance_lost_after`.
    pub database_settings: Vec<(String, String)>,
    /// An existing cluster (its kubeconfig) instead of the emulator. Its API
    /// server cannot be expected to reach a webhook on this machine's loopback, so
    /// the webhook is not registered there (home deployments go unverified).
    pub kubeconfig: Option<PathBuf>,
    /// Run the Argo CD stand-in; off for a cluster that runs a real Argo CD.
    pub standin: bool,
    /// The first engine instance's Argo CD namespace (default [`DEV_ARGOCD_NAMESPACE`]).
    pub argocd_namespace: Option<String>,
    /// Tenants each engine instance takes (the schema's default, 1,000); a benchmark
    /// with more tenants on one instance raises it, or the rest are never placed.
    pub instance_capacity: i32,
    /// How long the emulator keeps watch and list history (the API server's windows
    /// by default; a benchmark shortens them to measure the live objects alone).
    pub history: HistoryWindows,
}

/// The engine instance and Argo CD namespace of instance `index` of a stack.
pub fn instance_names(index: usize) -> (String, String) {
    if index == 0 {
        (DEV_INSTANCE.to_owned(), DEV_ARGOCD_NAMESPACE.to_owned())
    } else {
        let name = format!("argocd-{}", index + 1);
        (name.clone(), name)
    }
}

impl Default for StackShape {
    /// What `up` runs: one writer with its webhook, one agent.
    fn default() -> Self {
        StackShape {
            writers: 1,
            agents: 1,
            instances: 1,
            versions: Vec::new(),
            webhook: true,
            agent_lease: None,
            writer_env: Vec::new(),
            agent_env: Vec::new(),
            database_settings: Vec::new(),
            kubeconfig: None,
            standin: true,
            argocd_namespace: None,
            instance_capacity: DEFAULT_INSTANCE_CAPACITY,
            history: HistoryWindows::default(),
        }
    }
}

impl StackShape {
    /// The engine instance and Argo CD namespace of instance `index` of this stack.
    fn instance(&self, index: usize) -> (String, String) {
        match (&self.argocd_namespace, index) {
            (Some(namespace), 0) => (DEV_INSTANCE.to_owned(), namespace.clone()),
            _ => instance_names(index),
        }
    }
}

/// What `dev` set up, as reported when ready.
#[derive(Debug, Clone)]
pub struct DevInfo {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub env_file: PathBuf,
    pub database_url: String,
    /// The Kubernetes API server's URL (the emulator's, or the given cluster's).
    pub api_server: String,
    /// Whether the API server is the emulator.
    pub emulated: bool,
    /// The Argo CD stand-ins' namespaces (none when a real Argo CD serves).
    pub standin_namespaces: Vec<String>,
    /// The writers and agents: metrics and health URLs, log files.
    pub components: Vec<ComponentInfo>,
}

/// One child process as the ready summary shows it.
#[derive(Debug, Clone)]
pub struct ComponentInfo {
    pub name: String,
    /// `http://127.0.0.1:PORT/metrics`; `/healthz` and `/readyz` beside it.
    pub metrics_url: String,
    pub health_url: String,
    pub log: PathBuf,
}

impl DevInfo {
    /// The short summary printed once the stack is ready; `in_process_log` is where
    /// the emulator's and stand-in's logs go (`None`: on stderr).
    pub fn summary(&self, in_process_log: Option<&Path>) -> String {
        let in_process = in_process_log.map_or_else(|| "stderr".to_owned(), |log| log.display().to_string());
        let env = self.env_file.display();
        let mut lines = vec![
            format!("kubeconfig     {}", self.kubeconfig.display()),
            format!("env file       {env}   (set -a; . {env}; set +a)"),
        ];
        if self.emulated {
            lines.push(format!("API server     {} (emulator; log {in_process})", self.api_server));
        } else {
            lines.push(format!("API server     {} (from the kubeconfig)", self.api_server));
        }
        for namespace in &self.standin_namespaces {
            lines.push(format!("Argo CD        stand-in over namespace {namespace} (log {in_process})"));
        }
        for component in &self.components {
            lines.push(format!(
                "{:<14} metrics {}  health {}  log {}",
                component.name,
                component.metrics_url,
                component.health_url,
                component.log.display()
            ));
        }
        lines.push(format!("database       {}", redact_password(&self.database_url)));
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }
}

/// `url` with any password replaced by `***` (the summary is printed).
fn redact_password(url: &str) -> String {
    let Some(scheme) = url.find("://") else { return url.to_owned() };
    let start = scheme + 3;
    let authority_end = url[start..].find(['/', '?', '#']).map_or(url.len(), |end| start + end);
    // The last `@` of the authority ends the user information (a password may hold `@`).
    match url[start..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &url[start..start + at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..start], &url[start + at..]),
                None => url.to_owned(),
            }
        }
        None => url.to_owned(),
    }
}

/// Runs the local service until Ctrl-C or SIGTERM; calls `on_ready` once a
/// GitOpsDeployment can be applied. `shape.instances` engine instances, each with
/// the Argo CD version `shape.versions` gives it (so a rollout can be tried).
pub async fn up(dir: &Path, shape: &StackShape, on_ready: impl FnOnce(&DevInfo)) -> Result<(), DevError> {
    let mut stack = DevStack::start_shaped(dir, StandinOptions::default(), shape).await?;
    on_ready(&stack.info);
    let outcome = serve(&mut stack.children).await;
    stack.stop().await;
    outcome
}

/// The whole local service, up and ready: what `up` serves and what `bench e2e`
/// measures. Stop it with [`DevStack::stop`].
pub struct DevStack {
    pub info: DevInfo,
    /// A client of the emulator (the tenants' and Argo CD's API server).
    pub kube: kube::Client,
    client: tokio_postgres::Client,
    children: Vec<DevChild>,
    /// One Argo CD stand-in per engine instance, by instance index.
    standins: Vec<Standin>,
    /// `None` on an existing cluster.
    emulator: Option<KubeEmulator>,
    postgres: PgCluster,
    /// Held while the stack runs: no second stack may share the directory.
    _dir_lock: DirLock,
}

/// One engine instance's Argo CD stand-in while it runs.
struct Standin {
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), argocd::StandinError>>>,
}

impl Standin {
    fn start(kube: &kube::Client, namespace: &str, options: StandinOptions) -> Standin {
        let cancel = CancellationToken::new();
        let (kube, namespace, token) = (kube.clone(), namespace.to_owned(), cancel.clone());
        let task = tokio::spawn(async move { argocd::run(kube, &namespace, options, token).await });
        Standin { cancel, task: Some(task) }
    }

    async fn stop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// `DIR/lock`, holding the process id of the `gitops-dev` that uses DIR. Two stacks in
/// one directory would share the kubeconfig and env files, so children started by
/// one would reach the other's database or API server; the second is refused.
struct DirLock {
    path: PathBuf,
}

impl DirLock {
    fn take(dir: &Path) -> Result<DirLock, DevError> {
        use std::io::Write as _;
        let path = dir.join("lock");
        for _ in 0..2 {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut file) => {
                    let _ = write!(file, "{}", std::process::id());
                    return Ok(DirLock { path });
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default().trim().to_owned();
                    let alive = !holder.is_empty() && Path::new("/proc").join(&holder).exists();
                    if alive {
                        return Err(DevError::DirInUse { dir: dir.to_owned(), pid: holder });
                    }
                    // Left by a gitops-dev that is gone: take it over.
                    let _ = std::fs::remove_file(&path);
                }
                Err(source) => return Err(DevError::Dir { path, source }),
            }
        }
        Err(DevError::DirInUse { dir: dir.to_owned(), pid: "unknown".to_owned() })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl DevStack {
    /// Starts everything in `dir` and returns once the writer holds shard leases
    /// and the agent's heartbeat is fresh; on failure, stops what it started.
    pub async fn start(dir: &Path, standin_options: StandinOptions) -> Result<DevStack, DevError> {
        DevStack::start_shaped(dir, standin_options, &StackShape::default()).await
    }

    /// [`start`](Self::start) with `shape`'s writers and agents.
    pub async fn start_shaped(
        dir: &Path,
        standin_options: StandinOptions,
        shape: &StackShape,
    ) -> Result<DevStack, DevError> {
        std::fs::create_dir_all(dir).map_err(|source| DevError::Dir { path: dir.to_owned(), source })?;
        let dir = dir.canonicalize().map_err(|source| DevError::Dir { path: dir.to_owned(), source })?;
        let dir_lock = DirLock::take(&dir)?;
        let bin_dir = binary_dir()?;
        let writer_bin = binary(&bin_dir, "gitops-writer")?;
        let agent_bin = binary(&bin_dir, "gitops-agent")?;
        // The AppStudio layer runs by default; a build without it starts the core only.
        let appstudio_bin = binary(&bin_dir, "gitops-appstudio").ok();
        if appstudio_bin.is_none() {
            tracing::warn!("gitops-appstudio is not built: the AppStudio layer does not run (cargo build --workspace)");
        }

        let postgres = PgCluster::start(PgOptions::default()).await.map_err(|source| DevError::Postgres { source })?;
        let database_url = create_database(&postgres).await?;
        tracing::info!(port = postgres.port(), "PostgreSQL up and migrated");

        let (kubeconfig, emulator, kube, api_server) = match &shape.kubeconfig {
            None => {
                let kubeconfig = dir.join("kubeconfig");
                let emulator = KubeEmulator::start(EmulatorOptions {
                    kubeconfig: Some(kubeconfig.clone()),
                    tls: true,
                    history: shape.history,
                    ..Default::default()
                })
                .await
                .map_err(|source| DevError::Emulator { source })?;
                let kube = emulator.client().await;
                let url = emulator.url().to_owned();
                (kubeconfig, Some(emulator), kube, url)
            }
            Some(path) => {
                let path = path.canonicalize().map_err(|source| DevError::Dir { path: path.clone(), source })?;
                let kube =
                    argocd::client_from_kubeconfig(&path).await.map_err(|source| DevError::Standin { source })?;
                let url = cluster_url(&path).await?;
                (path, None, kube, url)
            }
        };
        install_crds(&kube, shape.standin).await?;
        create_namespace(&kube, gitops_writer::controller::DEFAULT_HOME_NAMESPACE).await?;
        let mut standins = Vec::new();
        let mut standin_namespaces = Vec::new();
        for index in 0..shape.instances.max(1) {
            let (_, namespace) = shape.instance(index);
            create_namespace(&kube, &namespace).await?;
            if shape.standin {
                let mut options = standin_options.clone();
                if let Some(version) = shape.versions.get(index) {
                    options.version.clone_from(version);
                }
                standins.push(Standin::start(&kube, &namespace, options));
                standin_namespaces.push(namespace);
            }
        }
        tracing::info!(url = %api_server, standins = standins.len(), "Kubernetes API server and Argo CD stand-ins up");

        let client = db::connect(&database_url, "gitops-dev")
            .await
            .map_err(|source| DevError::Db { action: "connect", source })?;
        let info = DevInfo {
            dir: dir.clone(),
            kubeconfig: kubeconfig.clone(),
            env_file: dir.join("env"),
            database_url,
            emulated: emulator.is_some(),
            api_server,
            standin_namespaces,
            components: Vec::new(),
        };
        let mut stack =
            DevStack { info, kube, client, children: Vec::new(), standins, emulator, postgres, _dir_lock: dir_lock };
        match stack.start_children(&writer_bin, &agent_bin, appstudio_bin.as_deref(), shape).await {
            Ok(()) => Ok(stack),
            Err(error) => {
                stack.stop().await;
                Err(error)
            }
        }
    }

    async fn start_children(
        &mut self,
        writer_bin: &Path,
        agent_bin: &Path,
        appstudio_bin: Option<&Path>,
        shape: &StackShape,
    ) -> Result<(), DevError> {
        for (name, value) in &shape.database_settings {
            // Names and values are the stack's own (no tenant input); quoted all the same.
            let statement = format!(
                "ALTER DATABASE {DEV_DATABASE} SET {} = '{}'",
                name.replace(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'), ""),
                value.replace('\'', "''")
            );
            self.client
                .batch_execute(&statement)
                .await
                .map_err(|source| DevError::Query { action: "apply a database setting", source })?;
        }
        for index in 0..shape.instances.max(1) {
            let (name, namespace) = shape.instance(index);
            engine_instance_add(&self.client, &name, &namespace, shape.instance_capacity)
                .await
                .map_err(|source| DevError::Db { action: "register the engine instance", source })?;
        }
        let key = SecretBox::generate_key(DEV_KEY_ID).map_err(|source| DevError::Key { source })?;
        let env = vec![
            (DATABASE_URL, self.info.database_url.clone()),
            ("KUBECONFIG", self.info.kubeconfig.display().to_string()),
            (ENCRYPTION_KEYS, key),
            (ENCRYPTION_ACTIVE_KEY, DEV_KEY_ID.to_owned()),
            (ENGINE_INSTANCE, DEV_INSTANCE.to_owned()),
        ];
        write_env_file(&self.info.env_file, &env)?;
        let dir = self.info.dir.clone();
        // The webhook's address is the first writer's only.
        let mut writer_env: Vec<(String, String)> = Vec::new();
        let mut first_writer_env: Vec<(String, String)> = Vec::new();
        let mut appstudio_env: Vec<(String, String)> = Vec::new();
        // Tenants' home deployments go to this API server (loopback for the emulator).
        writer_env.push(("GITOPS_WRITER_HOME_API_URL".to_owned(), self.info.api_server.clone()));
        if shape.webhook && shape.kubeconfig.is_none() {
            // The writer's admission webhook, registered as an install registers it
            // (on loopback): the emulator calls it for every tenant resource it stores.
            let cert = admission::serving_cert(&dir).map_err(|source| DevError::Certificate { source })?;
            let port = free_port()?;
            let webhook_address = format!("127.0.0.1:{port}");
            let configuration = admission::configuration(
                DEV_WEBHOOK,
                &format!("https://{webhook_address}/validate"),
                &cert.ca_pem,
                None,
            );
            admission::register(&self.kube, &configuration)
                .await
                .map_err(|source| DevError::Kube { action: "register the admission webhook".to_owned(), source })?;
            first_writer_env.extend([
                ("GITOPS_WRITER_WEBHOOK_CERT_FILE".to_owned(), cert.cert_file.display().to_string()),
                ("GITOPS_WRITER_WEBHOOK_KEY_FILE".to_owned(), cert.key_file.display().to_string()),
                ("GITOPS_WRITER_WEBHOOK_ADDRESS".to_owned(), webhook_address),
            ]);
            if appstudio_bin.is_some() {
                // The AppStudio layer's webhook likewise, with the same loopback certificate.
                let address = format!("127.0.0.1:{}", free_port()?);
                let configuration = admission::appstudio_configuration(
                    DEV_APPSTUDIO_WEBHOOK,
                    &format!("https://{address}/validate"),
                    &cert.ca_pem,
                    None,
                );
                admission::register(&self.kube, &configuration).await.map_err(|source| DevError::Kube {
                    action: "register the AppStudio admission webhook".to_owned(),
                    source,
                })?;
                appstudio_env.extend([
                    ("GITOPS_APPSTUDIO_WEBHOOK_CERT_FILE".to_owned(), cert.cert_file.display().to_string()),
                    ("GITOPS_APPSTUDIO_WEBHOOK_KEY_FILE".to_owned(), cert.key_file.display().to_string()),
                    ("GITOPS_APPSTUDIO_WEBHOOK_ADDRESS".to_owned(), address),
                ]);
            }
        } else {
            // Nobody verifies who asks: deployments into a tenant's own namespace are
            // taken as they come (a development-only setting).
            writer_env.push(("GITOPS_WRITER_ALLOW_UNVERIFIED_HOME_DEPLOYMENTS".to_owned(), "true".to_owned()));
        }
        writer_env.extend(shape.writer_env.iter().cloned());
        let mut agent_env = Vec::new();
        agent_env.extend(shape.agent_env.iter().cloned());
        if let Some(lease) = shape.agent_lease {
            agent_env.push(("GITOPS_AGENT_LEASE".to_owned(), format!("{}ms", lease.as_millis())));
        }
        let env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        for index in 0..shape.writers.max(1) {
            let name =
                if shape.writers > 1 { format!("gitops-writer-{}", index + 1) } else { "gitops-writer".to_owned() };
            // Every child on a port of its own: stacks (and benchmarks) run side by side.
            let mut extra = vec![("GITOPS_WRITER_METRICS_ADDRESS".to_owned(), format!("127.0.0.1:{}", free_port()?))];
            extra.extend(writer_env.iter().cloned());
            if index == 0 {
                extra.extend(first_writer_env.iter().cloned());
            }
            let spec =
                ChildSpec { binary: "gitops-writer", name, path: writer_bin.to_owned(), env: env.clone(), extra };
            self.children.push(spec.spawn(&dir, 0)?);
        }
        let instances = shape.instances.max(1);
        for instance in 0..instances {
            let (instance_name, _) = shape.instance(instance);
            for index in 0..shape.agents.max(1) {
                let mut name = "gitops-agent".to_owned();
                if instances > 1 {
                    name.push_str(&format!("-{}", instance + 1));
                }
                if shape.agents > 1 {
                    name.push_str(&format!("-{}", index + 1));
                }
                let mut extra =
                    vec![("GITOPS_AGENT_METRICS_ADDRESS".to_owned(), format!("127.0.0.1:{}", free_port()?))];
                extra.extend(agent_env.iter().cloned());
                extra.push((ENGINE_INSTANCE.to_owned(), instance_name.clone()));
                let spec =
                    ChildSpec { binary: "gitops-agent", name, path: agent_bin.to_owned(), env: env.clone(), extra };
                self.children.push(spec.spawn(&dir, 0)?);
            }
        }
        if let Some(path) = appstudio_bin {
            let mut extra =
                vec![("GITOPS_APPSTUDIO_METRICS_ADDRESS".to_owned(), format!("127.0.0.1:{}", free_port()?))];
            extra.extend(appstudio_env);
            let name = "gitops-appstudio".to_owned();
            let spec = ChildSpec { binary: "gitops-appstudio", name, path: path.to_owned(), env: env.clone(), extra };
            self.children.push(spec.spawn(&dir, 0)?);
        }
        self.info.components = self.children.iter().map(DevChild::info).collect();
        let names: Vec<String> = (0..instances).map(|index| shape.instance(index).0).collect();
        wait_ready(&self.client, &dir, &mut self.children, &names).await
    }

    /// Stops engine instance `index` as a lost node would: its Argo CD stand-in stops
    /// and its agents are killed (SIGKILL), none replaced. Returns the agents' names.
    pub async fn stop_instance(&mut self, index: usize) -> Vec<String> {
        if let Some(standin) = self.standins.get_mut(index) {
            standin.stop().await;
        }
        let (instance, _) = instance_names(index);
        let mut stopped = Vec::new();
        for child in &mut self.children {
            if child.serves(&instance) {
                let _ = child.child.kill().await;
                stopped.push(child.spec.name.clone());
            }
        }
        stopped
    }

    /// Starts again the agents of engine instance `index` (stopped by
    /// [`stop_instance`](Self::stop_instance)) under a new generation; its stand-in
    /// stays stopped unless `standin` is given.
    pub fn restart_instance_agents(&mut self, index: usize, standin: Option<StandinOptions>) -> Result<(), DevError> {
        let dir = self.info.dir.clone();
        let (instance, namespace) = instance_names(index);
        if let (Some(options), Some(slot)) = (standin, self.standins.get_mut(index)) {
            *slot = Standin::start(&self.kube, &namespace, options);
        }
        for child in &mut self.children {
            if child.serves(&instance) && !matches!(child.child.try_wait(), Ok(None)) {
                child.generation += 1;
                *child = child.spec.spawn(&dir, child.generation)?;
            }
        }
        Ok(())
    }

    /// An error if the writer or the agent has exited.
    pub fn check_children(&mut self) -> Result<(), DevError> {
        self.children.iter_mut().try_for_each(DevChild::check)
    }

    /// The process id of a running child (`gitops-writer` or `gitops-agent`).
    pub fn pid(&self, binary: &str) -> Option<u32> {
        self.children.iter().find(|child| child.spec.binary == binary).and_then(|child| child.child.id())
    }

    /// The emulator's 410 answers so far (`None` on an existing cluster).
    pub fn expired_answers(&self) -> Option<ExpiredAnswers> {
        self.emulator.as_ref().map(KubeEmulator::expired_answers)
    }

    /// Makes the emulator forget every resource's history (as an API server's
    /// compaction does): what stays is the live objects. False on an existing cluster.
    pub fn compact_history(&self) -> bool {
        self.emulator.as_ref().map(|emulator| emulator.compactor().compact()).is_some()
    }

    /// The PostgreSQL server's postmaster process id.
    pub fn postgres_pid(&self) -> Option<u32> {
        self.postgres.postmaster_pid()
    }

    /// The children's names (`gitops-writer-1`, ...), in the order [`kill`](Self::kill) takes.
    pub fn child_names(&self) -> Vec<String> {
        self.children.iter().map(|child| child.spec.name.clone()).collect()
    }

    /// The process id of child `index` while it runs.
    pub fn child_pid(&self, index: usize) -> Option<u32> {
        self.children.get(index).and_then(|child| child.child.id())
    }

    /// Kills child `index` without warning (SIGKILL), as a node failure would, and
    /// starts it again at once under a new identity (as a Deployment replaces a pod).
    pub async fn kill_and_replace(&mut self, index: usize) -> Result<(), DevError> {
        let dir = self.info.dir.clone();
        let Some(child) = self.children.get_mut(index) else { return Ok(()) };
        let _ = child.child.kill().await;
        child.generation += 1;
        *child = child.spec.spawn(&dir, child.generation)?;
        Ok(())
    }

    /// Starts again every child that stopped by itself (a start while the database
    /// is away ends with an error, and a Deployment would restart it); returns how many.
    pub fn replace_exited(&mut self) -> Result<usize, DevError> {
        let dir = self.info.dir.clone();
        let mut replaced = 0;
        for child in &mut self.children {
            if matches!(child.child.try_wait(), Ok(Some(_)) | Err(_)) {
                child.generation += 1;
                *child = child.spec.spawn(&dir, child.generation)?;
                replaced += 1;
            }
        }
        Ok(replaced)
    }

    /// The stack's PostgreSQL (to pause and resume it).
    pub fn postgres(&self) -> &PgCluster {
        &self.postgres
    }

    /// Stops the children (SIGTERM, then a bounded wait), the stand-in, the
    /// emulator and PostgreSQL.
    pub async fn stop(mut self) {
        for child in &mut self.children {
            child.stop().await;
        }
        drop(self.client);
        for standin in &mut self.standins {
            standin.stop().await;
        }
        if let Some(emulator) = self.emulator.take() {
            emulator.shutdown().await;
        }
        drop(self.postgres);
    }
}

/// Waits for Ctrl-C or SIGTERM, or for a child to exit (an error).
async fn serve(children: &mut [DevChild]) -> Result<(), DevError> {
    let mut terminate = signal(SignalKind::terminate()).map_err(|source| DevError::Signal { source })?;
    let mut poll = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = terminate.recv() => return Ok(()),
            _ = poll.tick() => {
                for child in children.iter_mut() {
                    child.check()?;
                }
            }
        }
    }
}

async fn wait_ready(
    client: &tokio_postgres::Client,
    dir: &Path,
    children: &mut [DevChild],
    instances: &[String],
) -> Result<(), DevError> {
    let deadline = Instant::now() + READY_DEADLINE;
    loop {
        for child in children.iter_mut() {
            child.check()?;
        }
        let writer: bool = client
            .query_one(WRITER_READY, &[])
            .await
            .map_err(|source| DevError::Query { action: "check the writer", source })?
            .get(0);
        let mut agents = true;
        for instance in instances {
            let fresh: bool = client
                .query_one(AGENT_READY, &[instance, &HEARTBEAT_FRESH])
                .await
                .map_err(|source| DevError::Query { action: "check the agent", source })?
                .get(0);
            agents &= fresh;
        }
        if writer && agents {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(DevError::NotReady { dir: dir.to_owned() });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How to start one child: its binary, its name (its log file, and its writer id
/// with a generation suffix), and its environment.
#[derive(Debug, Clone)]
struct ChildSpec {
    binary: &'static str,
    name: String,
    path: PathBuf,
    env: Vec<(String, String)>,
    extra: Vec<(String, String)>,
}

/// A child process with its log file.
struct DevChild {
    spec: ChildSpec,
    generation: u32,
    child: Child,
    log: PathBuf,
}

impl ChildSpec {
    /// Starts the child; its output is appended to `DIR/NAME.log`.
    fn spawn(&self, dir: &Path, generation: u32) -> Result<DevChild, DevError> {
        let log = dir.join(format!("{}.log", self.name));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| DevError::Dir { path: log.clone(), source })?;
        let stderr = file.try_clone().map_err(|source| DevError::Dir { path: log.clone(), source })?;
        let mut command = Command::new(&self.path);
        command.arg("run").stdin(Stdio::null()).stdout(file).stderr(stderr).kill_on_drop(true);
        command.envs(self.env.iter().chain(&self.extra).map(|(k, v)| (k.as_str(), v.as_str())));
        if self.binary == "gitops-writer" {
            command.env("GITOPS_WRITER_ID", format!("{}-{generation}", self.name));
        }
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        let child = command.spawn().map_err(|source| DevError::Spawn { binary: self.binary, source })?;
        tracing::info!(name = %self.name, generation, log = %log.display(), "started");
        Ok(DevChild { spec: self.clone(), generation, child, log })
    }
}

impl DevChild {
    /// Its metrics and health URLs (from the address it was given) and log.
    fn info(&self) -> ComponentInfo {
        let address = self
            .spec
            .extra
            .iter()
            .find(|(key, _)| key.ends_with("_METRICS_ADDRESS"))
            .map(|(_, value)| value.clone())
            .unwrap_or_default();
        ComponentInfo {
            name: self.spec.name.clone(),
            metrics_url: format!("http://{address}/metrics"),
            health_url: format!("http://{address}/healthz"),
            log: self.log.clone(),
        }
    }

    /// Whether this child is an agent of engine instance `instance`.
    fn serves(&self, instance: &str) -> bool {
        self.spec.binary == "gitops-agent"
            && self
                .spec
                .env
                .iter()
                .chain(&self.spec.extra)
                .rev()
                .find(|(key, _)| key == ENGINE_INSTANCE)
                .map(|(_, v)| v.as_str())
                == Some(instance)
    }

    /// An error if the process has exited.
    fn check(&mut self) -> Result<(), DevError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(DevError::ChildExited {
                binary: self.spec.binary,
                status: status.to_string(),
                log: self.log.clone(),
            }),
            Err(error) => Err(DevError::ChildExited {
                binary: self.spec.binary,
                status: error.to_string(),
                log: self.log.clone(),
            }),
        }
    }

    /// SIGTERM, then a bounded wait, then SIGKILL.
    async fn stop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
        }
        if tokio::time::timeout(STOP_DEADLINE, self.child.wait()).await.is_err() {
            tracing::warn!(name = %self.spec.name, "did not stop after SIGTERM; killing it");
            let _ = self.child.kill().await;
        }
    }
}

fn binary_dir() -> Result<PathBuf, DevError> {
    let exe = std::env::current_exe().map_err(|source| DevError::CurrentExe { source })?;
    Ok(exe.parent().map(Path::to_owned).unwrap_or_default())
}

fn binary(dir: &Path, binary: &'static str) -> Result<PathBuf, DevError> {
    let path = dir.join(binary);
    if path.is_file() { Ok(path) } else { Err(DevError::BinaryMissing { binary, dir: dir.to_owned() }) }
}

async fn create_database(postgres: &PgCluster) -> Result<String, DevError> {
    let admin = db::connect(&postgres.url("postgres"), "gitops-dev")
        .await
        .map_err(|source| DevError::Db { action: "connect", source })?;
    admin
        .batch_execute(&format!("CREATE DATABASE {DEV_DATABASE}"))
        .await
        .map_err(|source| DevError::Query { action: "create the database", source })?;
    let url = postgres.url(DEV_DATABASE);
    let mut client =
        db::connect(&url, "gitops-dev").await.map_err(|source| DevError::Db { action: "connect", source })?;
    db::migrate(&mut client).await.map_err(|source| DevError::Db { action: "migrate the database", source })?;
    Ok(url)
}

/// The server URL of the kubeconfig's current context.
async fn cluster_url(path: &Path) -> Result<String, DevError> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| DevError::Standin {
        source: argocd::StandinError::Kubeconfig { path: path.to_owned(), source },
    })?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.map_err(
            |source| DevError::Standin { source: argocd::StandinError::Kubeconfig { path: path.to_owned(), source } },
        )?;
    Ok(config.cluster_url.to_string().trim_end_matches('/').to_owned())
}

/// The writer's four CRDs and the AppStudio layer's (applied), the development
/// Application and Component CRDs where none exist yet (the repository generator's
/// own are never replaced), and, for the stand-in, Argo CD's (through its installer;
/// a real Argo CD brings its own).
async fn install_crds(kube: &kube::Client, standin: bool) -> Result<(), DevError> {
    if standin {
        argocd::install_crds(kube, ForeignCrds::Keep, CRD_DEADLINE)
            .await
            .map_err(|source| DevError::Standin { source })?;
    }
    let api = Api::<CustomResourceDefinition>::all(kube.clone());
    let mut crds = gitops_writer::api::crds();
    crds.extend(gitops_appstudio::api::crds());
    for crd in gitops_appstudio::api::fixture_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let existing = api
            .get_opt(&name)
            .await
            .map_err(|source| DevError::Kube { action: format!("read CustomResourceDefinition {name}"), source })?;
        if existing.is_none() {
            crds.push(crd);
        }
    }
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd))
            .await
            .map_err(|source| DevError::Kube { action: format!("install CustomResourceDefinition {name}"), source })?;
        match tokio::time::timeout(CRD_DEADLINE, await_condition(api.clone(), &name, conditions::is_crd_established()))
            .await
        {
            Ok(Ok(_)) => {}
            _ => return Err(DevError::CrdTimeout { name }),
        }
    }
    Ok(())
}

async fn create_namespace(kube: &kube::Client, name: &str) -> Result<(), DevError> {
    let namespace: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
    }))
    .unwrap_or_default();
    Api::<Namespace>::all(kube.clone())
        .patch(name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&namespace))
        .await
        .map_err(|source| DevError::Kube { action: format!("create namespace {name}"), source })?;
    Ok(())
}

/// `NAME=value` lines (read with `set -a; . DIR/env; set +a`), readable by the
/// owner only: it holds the development key.
fn write_env_file(path: &Path, env: &[(&str, String)]) -> Result<(), DevError> {
    use std::os::unix::fs::OpenOptionsExt;
    let text: String = env.iter().map(|(name, value)| format!("{name}={value}\n")).collect();
    let io = |source| DevError::Dir { path: path.to_owned(), source };
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path).map_err(io)?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(io)
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn the_summary_names_every_url_and_log_and_hides_the_password() {
        let info = DevInfo {
            dir: PathBuf::from("run"),
            kubeconfig: PathBuf::from("run/kubeconfig"),
            env_file: PathBuf::from("run/env"),
            database_url: "postgres://gitops:s3cret@127.0.0.1:5432/gitops".into(),
            api_server: "https://127.0.0.1:6443".into(),
            emulated: true,
            standin_namespaces: vec!["argocd".into()],
            components: vec![ComponentInfo {
                name: "gitops-writer".into(),
                metrics_url: "http://127.0.0.1:9000/metrics".into(),
                health_url: "http://127.0.0.1:9000/healthz".into(),
                log: PathBuf::from("run/gitops-writer.log"),
            }],
        };
        let summary = info.summary(Some(Path::new("run/gitops-dev.log")));
        for part in [
            "run/kubeconfig",
            "set -a; . run/env; set +a",
            "https://127.0.0.1:6443 (emulator; log run/gitops-dev.log)",
            "stand-in over namespace argocd",
            "http://127.0.0.1:9000/metrics",
            "http://127.0.0.1:9000/healthz",
            "run/gitops-writer.log",
            "postgres://gitops:***@127.0.0.1:5432/gitops",
        ] {
            assert!(summary.contains(part), "{part} in {summary}");
        }
        assert!(!summary.contains("s3cret"));
        assert_eq!(redact_password("postgres://postgres@127.0.0.1:1/db"), "postgres://postgres@127.0.0.1:1/db");
        assert_eq!(redact_password("postgres://u:p@ss@127.0.0.1:1/db"), "postgres://u:***@127.0.0.1:1/db");
        assert_eq!(redact_password("postgres://u:pw@127.0.0.1:1/db?x=a@b"), "postgres://u:***@127.0.0.1:1/db?x=a@b");
    }
}

#[cfg(test)]
mod dir_lock_tests {
    use super::*;

    #[test]
    fn one_stack_per_directory_and_a_stale_lock_is_taken_over() {
        let dir = std::env::temp_dir().join(format!("gitops-dev-lock-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let first = DirLock::take(&dir).expect("the first takes it");
        let second = DirLock::take(&dir).err().expect("a second is refused");
        assert!(second.to_string().contains("in use by another gitops-dev"), "{second}");
        drop(first);
        let again = DirLock::take(&dir).expect("free again once the first stopped");
        drop(again);
        // Left by a process that is gone (no such pid).
        std::fs::write(dir.join("lock"), "4294967295").expect("stale lock");
        drop(DirLock::take(&dir).expect("a stale lock is taken over"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
