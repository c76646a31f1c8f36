//! Hands each test a Kubernetes API. Two tiers behind one type: a real cluster when
//! `GITOPS_TEST_KUBECONFIG` names a kubeconfig, otherwise the in-process emulator,
//! started once per test process on a runtime of its own (each `#[tokio::test]` has a
//! runtime that ends with the test; the emulator must outlive all of them). Tests get
//! fresh clients, randomly prefixed namespaces that are deleted when dropped, and CRDs
//! installed once per run — never replacing a user's Argo CD CRDs unless told to.

use gitops_shared::telemetry::error_chain as chain;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::TEST_KUBECONFIG;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use tokio::sync::{Mutex, OnceCell};

/// Set to `1` to let the tests replace `argoproj.io` CRDs they did not install.
pub const REPLACE_ARGO_CRDS: &str = "GITOPS_TEST_REPLACE_ARGO_CRDS";
/// Label (with [`INSTALLED_VALUE`]) on every CRD the test kit installs: such a CRD may be
/// updated by a later run. The Argo CD stand-in's installer uses the same mark.
pub const INSTALLED_LABEL: &str = "app.kubernetes.io/managed-by";
pub const INSTALLED_VALUE: &str = "gitops-testkit";
/// Label on every namespace the tests create, to find leftovers of an interrupted run.
pub const NAMESPACE_LABEL: &str = "gitops-test/namespace";

/// The group whose CRDs belong to a possibly running Argo CD.
const ARGO_GROUP: &str = "argoproj.io";
/// How long a CRD may take to become Established, or an old one to go away.
const CRD_DEADLINE: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("read the kubeconfig {path}")]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("load the client configuration from the kubeconfig")]
    LoadConfig(#[source] KubeconfigError),
    #[error("build a Kubernetes client")]
    BuildClient(#[source] kube::Error),
    #[error("start the Kubernetes emulator")]
    StartEmulator(#[source] crate::kube_emulator::EmulatorError),
    #[error("start the Kubernetes emulator's thread")]
    EmulatorThread(#[source] std::io::Error),
    #[error("the Kubernetes emulator's thread ended before it was ready")]
    EmulatorGone,
    #[error("a CustomResourceDefinition to install has no name")]
    UnnamedCrd,
    #[error("watch CustomResourceDefinition {name} for Established")]
    WaitCrd {
        name: String,
        #[source]
        source: kube::runtime::wait::Error,
    },
    #[error("{action} CustomResourceDefinition {name}")]
    Crd {
        action: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "CustomResourceDefinition {name} already exists and was not installed by the tests (no label \
         {INSTALLED_LABEL}={INSTALLED_VALUE}): it may belong to a running Argo CD; set {REPLACE_ARGO_CRDS}=1 to replace it"
    )]
    ForeignArgoCrd { name: String },
    #[error("CustomResourceDefinition {name}: {what} within {CRD_DEADLINE:?}")]
    CrdTimeout { name: String, what: &'static str },
}

/// The Kubernetes API the tests of this process use.
pub struct TestCluster {
    real: bool,
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    /// Names of the CRDs installed (created or updated, then Established) in this run.
    installed: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("real", &self.real)
            .field("kubeconfig_path", &self.kubeconfig_path)
            .finish_non_exhaustive()
    }
}

/// A namespace-bound identity made by `TestCluster::namespace_identity`.
#[derive(Debug, Clone)]
pub struct NamespaceIdentity {
    pub token: String,
    /// The cluster's kubeconfig with this identity's token; removed with the process's temp files.
    pub kubeconfig: PathBuf,
}

static CLUSTER: OnceCell<TestCluster> = OnceCell::const_new();

/// Writes made at least, and time let pass at least, to outlast a real API server's
/// watch cache (see [`TestCluster::lose_history`]).
pub const HISTORY_WRITES_MIN: usize = 200;
pub const HISTORY_GAP_MIN: Duration = Duration::from_secs(90);
/// The pace of those writes: about 2 a second. The watch cache doubles its capacity
/// (from 100) whenever it is full of events younger than 75 s; at this pace it stops
/// at 200 events, full after about 90 s, and the next writes push `since` out.
pub const HISTORY_WRITE_EVERY: Duration = Duration::from_millis(450);
/// When outlasting the history is given up as failed.
const HISTORY_DEADLINE: Duration = Duration::from_secs(360);

/// How a watch's place in history was lost.
#[derive(Debug, Clone, Copy)]
pub struct HistoryLoss {
    /// Writes made to outlast it (none when compacted).
    pub writes: usize,
    pub elapsed: Duration,
    /// Whether the history was compacted (the emulator) rather than outlasted.
    pub compacted: bool,
}

/// Whether a watch of `api` from resourceVersion `since` is refused as too old.
async fn gone<K>(api: &Api<K>, since: &str) -> bool
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use futures_util::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    match api.watch(&WatchParams::default().timeout(1), since).await {
        Err(kube::Error::Api(status)) => status.code == 410,
        Err(error) => panic!("probe a watch from resourceVersion {since}: {}", chain(&error)),
        Ok(stream) => {
            let mut stream = std::pin::pin!(stream);
            matches!(stream.next().await, Some(Ok(WatchEvent::Error(status))) if status.code == 410)
        }
    }
}

impl TestCluster {
    /// The per-process cluster: the one in `GITOPS_TEST_KUBECONFIG`, else the emulator
    /// (started on first use).
    pub async fn get() -> &'static TestCluster {
        CLUSTER
            .get_or_init(|| async {
                match TestCluster::start().await {
                    Ok(cluster) => cluster,
                    Err(error) => panic!("test Kubernetes API unavailable: {}", chain(&error)),
                }
            })
            .await
    }

    async fn start() -> Result<TestCluster, ClusterError> {
        let (real, kubeconfig_path) = match std::env::var_os(TEST_KUBECONFIG).filter(|path| !path.is_empty()) {
            Some(path) => (true, PathBuf::from(path)),
            None => (false, emulator::start().await?),
        };
        let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)
            .map_err(|source| ClusterError::ReadKubeconfig { path: kubeconfig_path.clone(), source })?;
        Ok(TestCluster { real, kubeconfig_path, kubeconfig, installed: Mutex::new(HashSet::new()) })
    }

    /// True on a real cluster, false on the emulator.
    pub fn is_real(&self) -> bool {
        self.real
    }

    /// Compacts the API server's history now, as etcd's compaction does, so that a
    /// watch resuming from before answers 410 Gone. Only the emulator can be asked
    /// (false on a real cluster, whose flags and etcd the tests do not own).
    pub fn compact(&self) -> bool {
        match (self.real, emulator::COMPACTOR.get()) {
            (false, Some(compactor)) => {
                compactor.compact();
                true
            }
            _ => false,
        }
    }

    /// Makes a watch of `api`'s resource resuming from `since` (a resourceVersion
    /// taken after the watcher lost its connection) answer 410 Gone, by the means
    /// the tier allows. The emulator is compacted. A real API server is outlasted:
    /// its watch cache keeps at least the last 100 events of a resource and every
    /// event of the last 75 s (kube-apiserver 1.20), so `write` (one write to the
    /// resource per call) runs every [`HISTORY_WRITE_EVERY`] until a watch from
    /// `since` is refused — at least [`HISTORY_WRITES_MIN`] writes over at least
    /// [`HISTORY_GAP_MIN`], so that the window is passed by both count and age.
    pub async fn lose_history<K, W, F>(&self, api: &Api<K>, since: &str, mut write: W) -> HistoryLoss
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        W: FnMut(usize) -> F,
        F: std::future::Future<Output = ()>,
    {
        let started = std::time::Instant::now();
        if self.compact() {
            return HistoryLoss { writes: 0, elapsed: started.elapsed(), compacted: true };
        }
        let mut writes = 0;
        loop {
            write(writes).await;
            writes += 1;
            let elapsed = started.elapsed();
            if writes >= HISTORY_WRITES_MIN && elapsed >= HISTORY_GAP_MIN && writes % 10 == 0 && gone(api, since).await
            {
                // Shown with the test's output when it fails.
                eprintln!("a watch from resourceVersion {since} is refused after {writes} writes over {elapsed:?}");
                return HistoryLoss { writes, elapsed, compacted: false };
            }
            assert!(
                elapsed < HISTORY_DEADLINE,
                "a watch from resourceVersion {since} still resumes after {writes} writes over {elapsed:?}"
            );
            tokio::time::sleep(HISTORY_WRITE_EVERY).await;
        }
    }

    /// The admin kubeconfig (for `kubectl` and child processes).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// A new client with the kubeconfig's (admin) credentials. Made per call: a client's
    /// background task lives on the runtime that built it, and each test has its own.
    pub async fn admin(&self) -> Client {
        let config = self.config().await;
        client(config)
    }

    /// A new client that authenticates with bearer `token` instead of the admin's.
    pub async fn client_with_token(&self, token: &str) -> Client {
        let mut config = self.config().await;
        config.auth_info =
            serde_json::from_value(serde_json::json!({ "token": token })).expect("an AuthInfo with a token");
        client(config)
    }

    /// A new client that sends no credentials at all (the API server's anonymous user).
    pub async fn anonymous(&self) -> Client {
        let mut config = self.config().await;
        config.auth_info = AuthInfo::default();
        client(config)
    }

    async fn config(&self) -> Config {
        Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .map_err(ClusterError::LoadConfig)
            .unwrap_or_else(|error| panic!("{}", chain(&error)))
    }

    /// An identity that may do only what `rules` (RBAC PolicyRules) allow, and only
    /// in `namespace`: a ServiceAccount there, a Role with `rules`, a RoleBinding,
    /// and a token from TokenRequest. Returns the token and a kubeconfig file (the
    /// cluster's, with that token) for code that reads one.
    pub async fn namespace_identity(&self, namespace: &str, name: &str, rules: serde_json::Value) -> NamespaceIdentity {
        let admin = self.admin().await;
        let post = PostParams::default();
        let account: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("a ServiceAccount");
        let account = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
            .create(&post, &account)
            .await
            .unwrap_or_else(|error| panic!("create ServiceAccount {namespace}/{name}: {error}"));
        self.grant(namespace, name, rules, (namespace, name)).await;
        let request: TokenRequest =
            serde_json::from_value(serde_json::json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
                .expect("a TokenRequest");
        let account_name = account.metadata.name.unwrap_or_else(|| name.to_owned());
        let token = Api::<ServiceAccount>::namespaced(admin, namespace)
            .create_token_request(&account_name, &post, &request)
            .await
            .unwrap_or_else(|error| panic!("TokenRequest for {namespace}/{name}: {error}"))
            .status
            .map(|status| status.token)
            .unwrap_or_default();
        let mut kubeconfig = self.kubeconfig.clone();
        for user in &mut kubeconfig.auth_infos {
            user.auth_info = serde_json::from_value(serde_json::json!({ "token": token })).ok();
        }
        let path = std::env::temp_dir().join(format!("kubeconfig-{namespace}-{name}"));
        let text = serde_json::to_string(&kubeconfig).expect("a kubeconfig serialises");
        std::fs::write(&path, text).unwrap_or_else(|error| panic!("write {}: {error}", path.display()));
        NamespaceIdentity { token, kubeconfig: path }
    }

    /// Lets ServiceAccount `account` (`namespace/name`) do what `rules` allow in
    /// `namespace`: a Role and a RoleBinding there, both called `name`.
    pub async fn grant(&self, namespace: &str, name: &str, rules: serde_json::Value, account: (&str, &str)) {
        let (account_namespace, account_name) = account;
        let admin = self.admin().await;
        let post = PostParams::default();
        let role: Role = serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "rules": rules}))
            .expect("a Role with those rules");
        Api::<Role>::namespaced(admin.clone(), namespace)
            .create(&post, &role)
            .await
            .unwrap_or_else(|error| panic!("create Role {namespace}/{name}: {error}"));
        let binding: RoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account_name, "namespace": account_namespace}]
        }))
        .expect("a RoleBinding");
        Api::<RoleBinding>::namespaced(admin, namespace)
            .create(&post, &binding)
            .await
            .unwrap_or_else(|error| panic!("create RoleBinding {namespace}/{name}: {error}"));
    }

    /// A namespace of the test's own, `t-<random>-<purpose>`, created now and deleted
    /// (best effort, without waiting) when the returned value is dropped.
    pub async fn namespace(&'static self, purpose: &str) -> TestNamespace {
        let name = namespace_name(purpose);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(NAMESPACE_LABEL.to_owned(), "true".to_owned())])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.admin().await)
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|error| panic!("create test namespace {name}: {error}"));
        TestNamespace { cluster: self, name }
    }

    /// A namespace name of the test's own, `t-<random>-<purpose>`, not created (for
    /// code under test that makes it), deleted (best effort) when dropped.
    pub fn reserved_namespace(&'static self, purpose: &str) -> TestNamespace {
        TestNamespace { cluster: self, name: namespace_name(purpose) }
    }

    /// Installs `crds` (create, or update one installed by an earlier run), each once per
    /// run, and waits until each is Established. On a real cluster an `argoproj.io` CRD
    /// the tests did not install is left alone (an error) unless
    /// `GITOPS_TEST_REPLACE_ARGO_CRDS=1`.
    pub async fn install_crds(&self, crds: Vec<CustomResourceDefinition>) -> Result<(), ClusterError> {
        let mut installed = self.installed.lock().await;
        let api = Api::<CustomResourceDefinition>::all(self.admin().await);
        for mut crd in crds {
            let name = crd.metadata.name.clone().ok_or(ClusterError::UnnamedCrd)?;
            if installed.contains(&name) {
                continue;
            }
            crd.metadata.labels.get_or_insert_default().insert(INSTALLED_LABEL.to_owned(), INSTALLED_VALUE.to_owned());
            self.create_or_update_crd(&api, &name, crd).await?;
            match tokio::time::timeout(
                CRD_DEADLINE,
                await_condition(api.clone(), &name, conditions::is_crd_established()),
            )
            .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(source)) => return Err(ClusterError::WaitCrd { name, source }),
                Err(_) => return Err(ClusterError::CrdTimeout { name, what: "not Established" }),
            }
            installed.insert(name);
        }
        Ok(())
    }

    async fn create_or_update_crd(
        &self,
        api: &Api<CustomResourceDefinition>,
        name: &str,
        mut crd: CustomResourceDefinition,
    ) -> Result<(), ClusterError> {
        let crd_error = |action, source| ClusterError::Crd { action, name: name.to_owned(), source };
        let deadline = tokio::time::Instant::now() + CRD_DEADLINE;
        loop {
            let written = match api.get_opt(name).await.map_err(|source| crd_error("read", source))? {
                None => {
                    crd.metadata.resource_version = None;
                    Some(api.create(&PostParams::default(), &crd).await)
                }
                // An earlier run's copy still being deleted: wait until it is gone.
                Some(existing) if existing.metadata.deletion_timestamp.is_some() => None,
                Some(existing) => {
                    if !may_replace(self.real, &existing, replace_argo_allowed()) {
                        return Err(ClusterError::ForeignArgoCrd { name: name.to_owned() });
                    }
                    crd.metadata.resource_version = existing.metadata.resource_version;
                    Some(api.replace(name, &PostParams::default(), &crd).await)
                }
            };
            match written {
                Some(Ok(_)) => return Ok(()),
                // AlreadyExists or Conflict: another writer got there first; read again.
                Some(Err(kube::Error::Api(status))) if status.code == 409 => {}
                Some(Err(source)) => return Err(crd_error("create or update", source)),
                None => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::CrdTimeout { name: name.to_owned(), what: "an earlier copy not gone" });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A namespace owned by one test (see [`TestCluster::namespace`]).
#[derive(Debug)]
pub struct TestNamespace {
    cluster: &'static TestCluster,
    name: String,
}

impl TestNamespace {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let cluster = self.cluster;
        let name = std::mem::take(&mut self.name);
        // Drop runs outside any runtime guarantee; a short-lived one sends the delete.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async {
                let namespaces = Api::<Namespace>::all(cluster.admin().await);
                let _ = namespaces.delete(&name, &DeleteParams::background()).await;
            });
        })
        .join();
    }
}

fn client(config: Config) -> Client {
    Client::try_from(config).map_err(ClusterError::BuildClient).unwrap_or_else(|error| panic!("{}", chain(&error)))
}

/// Whether the tests may overwrite `existing`: anything on the emulator; on a real
/// cluster an `argoproj.io` CRD only if the test kit installed it or replacing is allowed.
fn may_replace(real: bool, existing: &CustomResourceDefinition, replace_argo: bool) -> bool {
    let installed_by_tests = existing
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(INSTALLED_LABEL))
        .is_some_and(|value| value == INSTALLED_VALUE);
    !real || existing.spec.group != ARGO_GROUP || installed_by_tests || replace_argo
}

fn replace_argo_allowed() -> bool {
    std::env::var(REPLACE_ARGO_CRDS).is_ok_and(|value| value == "1")
}

/// `t-<6 hex>-<purpose>`, reduced to a valid namespace name (DNS label, ≤ 63 chars).
fn namespace_name(purpose: &str) -> String {
    let random = uuid::Uuid::new_v4().simple().to_string();
    let purpose: String = purpose
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut name = format!("t-{}-{}", &random[..6], purpose.trim_matches('-'));
    name.truncate(63);
    name.trim_end_matches('-').to_owned()
}

/// The emulator tier: started on a thread and runtime of its own, kept for the process.
mod emulator {
    use std::net::SocketAddr;
    use std::path::PathBuf;

    use tokio::sync::oneshot;

    use super::ClusterError;
    use crate::kube_emulator::{Compactor, EmulatorOptions, KubeEmulator};

    /// The emulator's compactor, once it serves.
    pub(super) static COMPACTOR: std::sync::OnceLock<Compactor> = std::sync::OnceLock::new();

    /// Starts the emulator and returns the path of its admin kubeconfig.
    pub(super) async fn start() -> Result<PathBuf, ClusterError> {
        let (ready, started) = oneshot::channel();
        std::thread::Builder::new()
            .name("kube-emulator".into())
            .spawn(move || serve(ready))
            .map_err(ClusterError::EmulatorThread)?;
        started.await.map_err(|_| ClusterError::EmulatorGone)?
    }

    /// Runs the emulator until the process exits, reporting its kubeconfig once ready.
    fn serve(ready: oneshot::Sender<Result<PathBuf, ClusterError>>) {
        let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                let _ = ready.send(Err(ClusterError::EmulatorThread(error)));
                return;
            }
        };
        runtime.block_on(async move {
            let options = EmulatorOptions {
                listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                kubeconfig: None,
                tokens: None,
                // kubectl (client-go) sends credentials only over TLS, as it
                // does with a real cluster.
                tls: true,
                ..EmulatorOptions::default()
            };
            match KubeEmulator::start(options).await {
                Ok(emulator) => {
                    let _ = COMPACTOR.set(emulator.compactor());
                    let _ = ready.send(Ok(emulator.kubeconfig_path().to_owned()));
                    let _serving = emulator;
                    std::future::pending::<()>().await;
                }
                Err(error) => {
                    let _ = ready.send(Err(ClusterError::StartEmulator(error)));
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    use super::{INSTALLED_LABEL, INSTALLED_VALUE, may_replace, namespace_name};

    fn crd(group: &str, labels: serde_json::Value) -> CustomResourceDefinition {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("things.{group}"), "labels": labels},
            "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing"}, "versions": []}
        }))
        .unwrap()
    }

    #[test]
    fn foreign_argo_crds_are_replaced_only_when_allowed() {
        let ours = serde_json::json!({ INSTALLED_LABEL: INSTALLED_VALUE });
        let foreign = serde_json::json!({ INSTALLED_LABEL: "Helm" });
        // A real cluster: someone else's Argo CD CRD is protected unless allowed.
        assert!(!may_replace(true, &crd("argoproj.io", foreign.clone()), false));
        assert!(!may_replace(true, &crd("argoproj.io", serde_json::json!({})), false));
        assert!(may_replace(true, &crd("argoproj.io", foreign.clone()), true));
        assert!(may_replace(true, &crd("argoproj.io", ours), false));
        // Other groups, and anything on the emulator, are the tests' own.
        assert!(may_replace(true, &crd("example.invalid", foreign.clone()), false));
        assert!(may_replace(false, &crd("argoproj.io", foreign), false));
    }

    #[test]
    fn namespace_names_are_valid_dns_labels() {
        for purpose in
            ["crud", "Watch Resume", "a-very-long-purpose-that-goes-on-and-on-and-on-beyond-sixty-three", "--"]
        {
            let name = namespace_name(purpose);
            assert!(name.len() <= 63, "{name}");
            assert!(name.starts_with("t-"), "{name}");
            assert!(!name.ends_with('-'), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
        }
        assert_ne!(namespace_name("x"), namespace_name("x"));
    }
}
