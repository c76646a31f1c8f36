//! The AppStudio layer against the test tier's API server (the emulator, or the real
//! cluster in GITOPS_TEST_KUBECONFIG): its CRDs, and its controllers run in-process
//! on a namespace of the test's own, while the test plays the repository generator
//! (writing binding status) and the core (writing GitOpsDeployment status). "kube"
//! in the module's name puts these tests in the real-Kubernetes tier of ops/test.
//! Ported from the original service's end-to-end cases; the original's minutes of
//! waiting are settings here. `binding_core` and `promotion_core` run the layer on
//! the real core instead (writer, agent and the Argo CD stand-in), the test playing
//! only the repository generator.

mod binding;
mod binding_core;
mod claim;
mod claim_dynamic;
mod crds;
mod environment;
mod leader;
mod promotion;
mod promotion_automated;
mod promotion_core;
mod tenancy;
mod webhook;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gitops_appstudio::api;
use gitops_appstudio::context::Settings;
use gitops_appstudio::metrics::Metrics;
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::support::writer::Env;

/// A namespace with the layer's controllers serving it; they stop when dropped.
pub(crate) struct Ground {
    pub(crate) client: kube::Client,
    namespace: Held,
    cancel: CancellationToken,
}

/// The namespace a ground serves: its own, or the tenant namespace of a core.
enum Held {
    Own(TestNamespace),
    Core(Box<Env>),
}

impl Drop for Ground {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(crate) async fn ground(purpose: &str) -> Ground {
    ground_with(purpose, Settings::default()).await
}

/// Loopback API URLs are the tests' clusters, so the grounds accept them
/// (`--api-url-allow-private`), but for [`ground_strict`].
pub(crate) async fn ground_with(purpose: &str, mut settings: Settings) -> Ground {
    settings.api_url_allow_private = true;
    start(purpose, settings).await
}

/// A ground whose controllers refuse private API URLs, as a production install does.
pub(crate) async fn ground_strict(purpose: &str) -> Ground {
    start(purpose, Settings::default()).await
}

async fn start(purpose: &str, settings: Settings) -> Ground {
    ground_counted(purpose, settings, Arc::default()).await
}

/// A ground on a namespace of its own whose controllers count their reconciles into
/// `metrics` (see [`reconciles`]), with `settings` as given (private API URLs only
/// if they say so).
pub(crate) async fn ground_counted(purpose: &str, settings: Settings, metrics: Arc<Metrics>) -> Ground {
    let cluster = TestCluster::get().await;
    install_crds(cluster).await;
    let namespace = cluster.namespace(purpose).await;
    serve(cluster.admin().await, Held::Own(namespace), settings, metrics)
}

/// Reconciles `controller` has finished, from the layer's metrics.
pub(crate) fn reconciles(metrics: &Metrics, controller: &str) -> u64 {
    let series = format!("gitops_appstudio_reconciles_total{{controller=\"{controller}\"}}");
    crate::support::sample(&metrics.render(), &series).unwrap_or_else(|| panic!("no reconcile count for {controller}"))
        as u64
}

/// Waits until `controller`, serving one object of the ground, has finished two
/// reconciles from now on, calling `nudge` (an edit of that object) now and then so
/// it has a reason to. Reconciles of one object run one at a time, so the second
/// began after this call and saw everything written before it: what it left in
/// place is what the layer decides on that state, not a step it has yet to take.
pub(crate) async fn reconciled_since_now<F, Fut>(metrics: &Metrics, controller: &str, mut nudge: F)
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = ()>,
{
    let start = reconciles(metrics, controller);
    let mut round = 0u32;
    crate::support::eventually(&format!("two {controller} reconciles"), || {
        round += 1;
        let done = reconciles(metrics, controller) >= start + 2;
        let nudged = (!done && round % 20 == 1).then(|| nudge(round));
        async move {
            if let Some(nudged) = nudged {
                nudged.await;
            }
            done.then_some(())
        }
    })
    .await;
}

/// A ground on the tenant namespace of `core` (a writer, its agent and the Argo CD
/// stand-in; start the writer with `core.writer`), counting the layer's reconciles
/// into `metrics`. Loopback API URLs are accepted, as in [`ground_with`].
pub(crate) async fn ground_on_core(core: Env, mut settings: Settings, metrics: Arc<Metrics>) -> Ground {
    settings.api_url_allow_private = true;
    install_crds(TestCluster::get().await).await;
    serve(core.kube.clone(), Held::Core(Box::new(core)), settings, metrics)
}

async fn install_crds(cluster: &TestCluster) {
    cluster.install_crds(gitops_writer::api::crds()).await.expect("install the core CRDs");
    cluster.install_crds(api::crds()).await.expect("install the AppStudio CRDs");
    cluster.install_crds(api::fixture_crds()).await.expect("install the fixture CRDs");
}

fn serve(client: kube::Client, namespace: Held, mut settings: Settings, metrics: Arc<Metrics>) -> Ground {
    let ground = Ground { client, namespace, cancel: CancellationToken::new() };
    settings.namespace = Some(ground.ns().to_owned());
    settings.user_error_requeue = Duration::from_millis(500);
    let client = ground.client.clone();
    tokio::spawn(gitops_appstudio::run::run_with_metrics(client, settings, metrics, ground.cancel.clone()));
    ground
}

impl Ground {
    pub(crate) fn ns(&self) -> &str {
        match &self.namespace {
            Held::Own(namespace) => namespace.name(),
            Held::Core(core) => core.tenant.name(),
        }
    }

    /// The core under a ground made by [`ground_on_core`].
    pub(crate) fn core(&self) -> Option<&Env> {
        match &self.namespace {
            Held::Own(_) => None,
            Held::Core(core) => Some(core),
        }
    }

    pub(crate) fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), self.ns())
    }

    /// Creates `object` in the ground's namespace as `client`'s user, which may be refused.
    pub(crate) async fn try_create_as<K>(&self, client: &kube::Client, object: &K) -> Result<K, kube::Error>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(client.clone(), self.ns()).create(&PostParams::default(), object).await
    }

    /// Creates `object` in the ground's namespace.
    pub(crate) async fn create<K>(&self, object: &K) -> K
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + DeserializeOwned
            + std::fmt::Debug,
    {
        self.api::<K>()
            .create(&PostParams::default(), object)
            .await
            .unwrap_or_else(|error| panic!("create {} {:?}: {error}", K::kind(&()), object.meta().name))
    }

    /// Merge-patches `name`'s spec (or any top-level field) with `patch`.
    pub(crate) async fn patch<K>(&self, name: &str, patch: serde_json::Value) -> K
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        self.api::<K>()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|error| panic!("patch {} {name}: {error}", K::kind(&())))
    }

    /// Merge-patches `name`'s status with `status` (the test playing another component).
    pub(crate) async fn patch_status<K>(&self, name: &str, status: serde_json::Value) -> K
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        self.api::<K>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&serde_json::json!({ "status": status })))
            .await
            .unwrap_or_else(|error| panic!("patch the status of {} {name}: {error}", K::kind(&())))
    }

    /// `name` as it is now, None when absent.
    pub(crate) async fn get<K>(&self, name: &str) -> Option<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        self.api::<K>().get_opt(name).await.unwrap_or_else(|error| panic!("read {} {name}: {error}", K::kind(&())))
    }

    /// A Secret holding a kubeconfig, of `type_`.
    pub(crate) async fn secret(&self, name: &str, type_: &str, kubeconfig: &str) -> Secret {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "type": type_,
            "stringData": {"kubeconfig": kubeconfig},
        }))
        .expect("a Secret");
        self.create(&secret).await
    }
}
