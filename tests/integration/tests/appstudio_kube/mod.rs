//! The AppStudio layer against the test tier's API server (the emulator, or the real
//! cluster in GITOPS_TEST_KUBECONFIG): its CRDs, and its controllers run in-process
//! on a namespace of the test's own, while the test plays the repository generator
//! (writing binding status) and the core (writing GitOpsDeployment status). "kube"
//! in the module's name puts these tests in the real-Kubernetes tier of ops/test.
//! Ported from the original service's end-to-end cases; the original's minutes of
//! waiting are settings here.

mod binding;
mod claim;
mod claim_dynamic;
mod crds;
mod environment;
mod leader;
mod promotion;
mod promotion_automated;
mod tenancy;
mod webhook;

use std::time::Duration;

use gitops_appstudio::api;
use gitops_appstudio::context::Settings;
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use k8s_openapi::api::core::v1::Secret;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

/// A namespace with the layer's controllers serving it; they stop when dropped.
pub(crate) struct Ground {
    pub(crate) client: kube::Client,
    pub(crate) namespace: TestNamespace,
    cancel: CancellationToken,
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

async fn start(purpose: &str, mut settings: Settings) -> Ground {
    let cluster = TestCluster::get().await;
    cluster.install_crds(gitops_writer::api::crds()).await.expect("install the core CRDs");
    cluster.install_crds(api::crds()).await.expect("install the AppStudio CRDs");
    cluster.install_crds(api::fixture_crds()).await.expect("install the fixture CRDs");
    let namespace = cluster.namespace(purpose).await;
    let client = cluster.admin().await;
    settings.namespace = Some(namespace.name().to_owned());
    settings.user_error_requeue = Duration::from_millis(500);
    let cancel = CancellationToken::new();
    tokio::spawn(gitops_appstudio::run::run_controllers(client.clone(), settings, cancel.clone()));
    Ground { client, namespace, cancel }
}

impl Ground {
    pub(crate) fn ns(&self) -> &str {
        self.namespace.name()
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
