//! Kubernetes API conformance: what the service's code relies on from an API server,
//! asserted as a real kube-apiserver behaves, so the same tests hold the emulator to it
//! (`GITOPS_TEST_KUBECONFIG` unset → the emulator; set → that cluster). Each test works
//! in namespaces of its own, names cluster-scoped objects randomly and cleans up. This
//! file holds the test CRDs and the helpers the modules share.

mod admission;
mod apply;
mod authorization;
mod controller;
mod crd;
mod crud;
mod dry_run;
mod finalizers;
mod gc;
mod kubectl;
mod patch;
mod rbac;
mod watch;

use std::fmt::Debug;

use futures_util::{Stream, StreamExt};
use gitops_testkit::cluster::{TestCluster, TestNamespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::core::{Status, WatchEvent};
use serde_json::{Value, json};

use crate::support::DEADLINE;

/// The API group of the conformance CRDs (installed once per run, left installed).
pub const GROUP: &str = "conformance.gitops.example.invalid";
pub const API_VERSION: &str = "conformance.gitops.example.invalid/v1";

/// A namespaced kind with a `status` subresource, a structural schema and one field
/// (`spec.extra`) that keeps unknown fields.
pub const GADGET: TestKind = TestKind {
    kind: "Gadget",
    plural: "gadgets",
    namespaced: true,
    status_subresource: true,
    application_shape: false,
};
/// Shaped like Argo CD's Application: namespaced, `spec`/`status`/`operation`, and no
/// status subresource, so status is written on the main resource.
pub const GIZMO: TestKind =
    TestKind { kind: "Gizmo", plural: "gizmos", namespaced: true, status_subresource: false, application_shape: true };
/// A cluster-scoped kind.
pub const BEACON: TestKind = TestKind {
    kind: "Beacon",
    plural: "beacons",
    namespaced: false,
    status_subresource: false,
    application_shape: false,
};

#[derive(Debug, Clone, Copy)]
pub struct TestKind {
    pub kind: &'static str,
    pub plural: &'static str,
    pub namespaced: bool,
    pub status_subresource: bool,
    /// `spec`, `status` and a free-form `operation`, like Argo CD's Application.
    pub application_shape: bool,
}

impl TestKind {
    pub fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1", self.kind), self.plural)
    }

    /// The kind's objects in `namespace` (ignored for a cluster-scoped kind).
    pub fn api(&self, client: &Client, namespace: &str) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(client.clone(), namespace, &self.resource())
        } else {
            Api::all_with(client.clone(), &self.resource())
        }
    }

    /// An object of this kind named `name` with the given top-level fields (`spec`, …).
    pub fn object(&self, name: &str, fields: Value) -> DynamicObject {
        let mut body = json!({"apiVersion": API_VERSION, "kind": self.kind, "metadata": {"name": name}});
        merge(&mut body, fields);
        serde_json::from_value(body).expect("a valid object")
    }

    /// The CRD for this kind in `group`.
    pub fn crd_in(&self, group: &str) -> CustomResourceDefinition {
        let kind_schema = if self.application_shape {
            json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "size": {"type": "integer"}, "color": {"type": "string"}}},
                "status": {"type": "object", "properties": {
                    "phase": {"type": "string"}, "observedGeneration": {"type": "integer"}}},
                "operation": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
        } else {
            json!({"type": "object", "properties": {
                "spec": {"type": "object", "properties": {
                    "size": {"type": "integer"},
                    "color": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
                "status": {"type": "object", "properties": {
                    "ready": {"type": "boolean"},
                    "observedGeneration": {"type": "integer"},
                    "message": {"type": "string"}}}}})
        };
        let mut version = json!({"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": kind_schema}});
        if self.status_subresource {
            version["subresources"] = json!({"status": {}});
        }
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{}.{group}", self.plural)},
            "spec": {
                "group": group,
                "scope": if self.namespaced { "Namespaced" } else { "Cluster" },
                "names": {"plural": self.plural, "singular": self.kind.to_lowercase(), "kind": self.kind,
                          "listKind": format!("{}List", self.kind)},
                "versions": [version],
            }
        }))
        .expect("a valid CRD")
    }
}

/// What a conformance test works with: the cluster, an admin client and its namespace.
pub struct Env {
    pub cluster: &'static TestCluster,
    pub client: Client,
    pub ns: TestNamespace,
}

impl Env {
    /// Installs the conformance CRDs (once per run) and creates a namespace for `purpose`.
    pub async fn new(purpose: &str) -> Env {
        let cluster = TestCluster::get().await;
        cluster
            .install_crds(vec![GADGET.crd_in(GROUP), GIZMO.crd_in(GROUP), BEACON.crd_in(GROUP)])
            .await
            .expect("install the conformance CRDs");
        let ns = cluster.namespace(purpose).await;
        let client = cluster.admin().await;
        Env { cluster, client, ns }
    }

    pub fn ns(&self) -> &str {
        self.ns.name()
    }

    pub fn api(&self, kind: TestKind) -> Api<DynamicObject> {
        kind.api(&self.client, self.ns())
    }

    /// Objects of a built-in kind in this test's namespace.
    pub fn namespaced<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), self.ns())
    }
}

/// Deep-merges `patch` into `target` (objects merged key by key, anything else replaced).
pub fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
        (target, patch) => *target = patch,
    }
}

/// A lowercase name unique to this run: `prefix-<8 hex>`.
pub fn random_name(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// The `Status` of a request the test expects the server to refuse.
#[track_caller]
pub fn refused<T: Debug>(result: Result<T, kube::Error>) -> Box<Status> {
    match result {
        Err(kube::Error::Api(status)) => status,
        other => panic!("expected an API error (a Status), got {other:?}"),
    }
}

/// Asserts a refusal with HTTP `code` and `reason`, and returns its `Status`.
#[track_caller]
pub fn refused_with<T: Debug>(result: Result<T, kube::Error>, code: u16, reason: &str) -> Box<Status> {
    let status = refused(result);
    assert_eq!((status.code, status.reason.as_str()), (code, reason), "unexpected refusal: {status:?}");
    assert!(status.is_failure(), "a refusal says status Failure: {status:?}");
    status
}

/// The object's names in the given order.
pub fn names(objects: &[DynamicObject]) -> Vec<String> {
    objects.iter().map(|o| o.metadata.name.clone().unwrap_or_default()).collect()
}

pub fn generation(object: &DynamicObject) -> i64 {
    object.metadata.generation.expect("a generation")
}

pub fn resource_version(object: &DynamicObject) -> String {
    object.metadata.resource_version.clone().expect("a resourceVersion")
}

/// The next watch event that is not a bookmark (panics after `DEADLINE` or at the end).
pub async fn next_change<S>(events: &mut S) -> WatchEvent<DynamicObject>
where
    S: Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin,
{
    loop {
        match next_event(events).await {
            WatchEvent::Bookmark(_) => {}
            event => return event,
        }
    }
}

/// The next watch event (panics after `DEADLINE`, on a stream error or at the end).
pub async fn next_event<S>(events: &mut S) -> WatchEvent<DynamicObject>
where
    S: Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin,
{
    match tokio::time::timeout(DEADLINE, events.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(error))) => panic!("watch failed: {error}"),
        Ok(None) => panic!("the watch ended early"),
        Err(_) => panic!("no watch event within {DEADLINE:?}"),
    }
}

/// A watch event reduced to (type, name) for comparisons; the object for the caller.
pub fn summary(event: &WatchEvent<DynamicObject>) -> (&'static str, String) {
    let (kind, object) = match event {
        WatchEvent::Added(o) => ("ADDED", o),
        WatchEvent::Modified(o) => ("MODIFIED", o),
        WatchEvent::Deleted(o) => ("DELETED", o),
        WatchEvent::Bookmark(_) => return ("BOOKMARK", String::new()),
        WatchEvent::Error(status) => return ("ERROR", format!("{status:?}")),
    };
    (kind, object.metadata.name.clone().unwrap_or_default())
}

/// The object carried by an ADDED, MODIFIED or DELETED event.
#[track_caller]
pub fn event_object(event: WatchEvent<DynamicObject>) -> DynamicObject {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => o,
        other => panic!("expected an object event, got {other:?}"),
    }
}
