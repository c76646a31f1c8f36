//! The kube client against the test tier's API server (the emulator, or the real
//! cluster in GITOPS_TEST_KUBECONFIG): version, list namespaces, create a CRD and
//! wait for Established, watch its objects.

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};

use crate::support::DEADLINE;

async fn tier_client() -> Client {
    let path = gitops_testkit::cluster::TestCluster::get().await.kubeconfig_path().to_owned();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("read the kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("kubeconfig");
    Client::try_from(config).expect("client")
}

#[tokio::test]
async fn kube_client_lists_creates_a_crd_and_watches() {
    let client = tier_client().await;
    let version = client.apiserver_version().await.expect("/version");
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "20"), "both tiers speak Kubernetes 1.20");
    let namespaces = Api::<Namespace>::all(client.clone()).list(&ListParams::default()).await.expect("list namespaces");
    assert!(namespaces.items.iter().any(|ns| ns.metadata.name.as_deref() == Some("default")));

    let suffix = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let group = format!("smoke{suffix}.gitops.example.invalid");
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}
                }}}
            }]
        }
    }))
    .expect("crd");
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.expect("create CRD");
    let name = format!("widgets.{group}");
    let established = tokio::time::timeout(
        DEADLINE,
        kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        ),
    )
    .await;
    assert!(matches!(established, Ok(Ok(_))), "CRD not Established in time");

    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Widget"), "widgets");
    let widgets = Api::<DynamicObject>::namespaced_with(client.clone(), "default", &resource);
    let mut events = watcher::watcher(widgets.clone(), watcher::Config::default()).boxed();
    let widget: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"), "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}
    }))
    .expect("widget");
    // Create once the watch is established (its first Init events arrived).
    let mut created = false;
    let seen = tokio::time::timeout(DEADLINE, async {
        while let Some(event) = events.next().await {
            match event.expect("watch event") {
                Event::InitDone if !created => {
                    widgets.create(&PostParams::default(), &widget).await.expect("create widget");
                    created = true;
                }
                Event::Apply(obj) if obj.metadata.name.as_deref() == Some("w1") => return obj,
                _ => {}
            }
        }
        panic!("watch ended")
    })
    .await
    .expect("the watch saw the new object");
    assert_eq!(seen.data["spec"]["size"], 3);
    crds.delete(&name, &DeleteParams::default()).await.expect("delete CRD");
}
