//! Instances the service makes itself, on both tiers, with the Argo CD Operator
//! played by the test kit: `instance provision` creates the namespace, the agents'
//! Role and RoleBinding there (an agent already serving another instance is
//! bound, so one identity serves both) and an `ArgoCD` resource with the version
//! and a pinned tracking method, waits until it is Available and registers it; a
//! tenant is placed there and its deployment becomes Ready on the requested
//! version; `instance decommission` moves the tenant off, purges the instance's
//! operation history, unregisters it and deletes its ArgoCD and namespace. An agent
//! serving the host cluster picks a provisioned instance up while it runs.

use std::time::Duration;

use gitops_agent::{AgentConfig, Served, run_agent};
use gitops_shared::db::engine_instance::{ProvisionedBy, engine_instance_by_name, engine_instance_cordon};
use gitops_shared::db::tenant_move::tenant_placements;
use gitops_testkit::argocd::operator::{argocd_crd, argocd_resource, run_operator};
use gitops_testkit::cluster::TestCluster;
use gitopsctl::provision::{ProvisionRequest, decommission, provision};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DynamicObject, ListParams};

use crate::support::eventually;
use crate::support::writer::{INSTANCE, env, spec};

const REPO: &str = "https://git.example.invalid/team/app.git";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_instance_provision_place_decommission() {
    let env = env("prov").await;
    let cluster = TestCluster::get().await;
    cluster.install_crds(vec![argocd_crd()]).await.expect("install the ArgoCD CRD");
    // Provision makes the namespace; one that exists is never taken over.
    let target = cluster.reserved_namespace("prov-p");
    let namespace = target.name().to_owned();
    tokio::spawn(run_operator(env.kube.clone(), env.standin.clone(), namespace, env.cancel.child_token()));
    let taken = ProvisionRequest {
        name: "argocd-t".into(),
        namespace: Some(env.tenant.name().to_owned()),
        version: None,
        capacity: 10,
        agents: Vec::new(),
        wait: Duration::from_secs(60),
        host_cluster: None,
        provisioned_by: ProvisionedBy::Gitopsctl,
    };
    let refused = provision(&env.db.url(), env.kube.clone(), &taken).await.expect_err("a tenant's namespace");
    assert!(refused.to_string().contains("was not made for instance"), "{refused}");
    let tenant_argocd: Api<DynamicObject> =
        Api::namespaced_with(env.kube.clone(), env.tenant.name(), &argocd_resource());
    assert!(tenant_argocd.get_opt("argocd").await.expect("read").is_none(), "nothing made in the tenant's namespace");
    assert!(engine_instance_by_name(&env.client, "argocd-t").await.is_err(), "nothing registered");
    let request = ProvisionRequest {
        name: "argocd-p".into(),
        namespace: Some(target.name().to_owned()),
        version: Some("v3.0.2".into()),
        capacity: 10,
        agents: vec![format!("{}/gitops-agent", env.argocd.name())],
        wait: Duration::from_secs(60),
        host_cluster: None,
        provisioned_by: ProvisionedBy::Gitopsctl,
    };
    let id = provision(&env.db.url(), env.kube.clone(), &request).await.expect("provision");
    let instance = engine_instance_by_name(&env.client, "argocd-p").await.expect("registered");
    assert_eq!((instance.id, instance.argocd_namespace.as_str()), (id, target.name()));
    let argocd: Api<DynamicObject> = Api::namespaced_with(env.kube.clone(), target.name(), &argocd_resource());
    let object = argocd.get("argocd").await.expect("the ArgoCD resource");
    assert_eq!(object.data.pointer("/status/phase").and_then(|p| p.as_str()), Some("Available"));
    assert_eq!(object.data.pointer("/spec/resourceTrackingMethod").and_then(|p| p.as_str()), Some("label"));
    // Rights in that namespace only, for the agents named.
    let binding =
        Api::<RoleBinding>::namespaced(env.kube.clone(), target.name()).get("gitops-agent").await.expect("binding");
    assert_eq!(binding.role_ref.kind, "Role");
    let cluster_bindings =
        Api::<ClusterRoleBinding>::all(env.kube.clone()).list(&ListParams::default()).await.expect("list");
    assert!(
        cluster_bindings.items.iter().all(|b| b
            .subjects
            .iter()
            .flatten()
            .all(|s| s.namespace.as_deref() != Some(env.argocd.name()))),
        "no cluster-wide binding for the agents"
    );
    // Bad input is refused before anything is made.
    let bad = ProvisionRequest { name: "Bad_Name".into(), namespace: None, ..request.clone() };
    let refused = provision(&env.db.url(), env.kube.clone(), &bad).await.expect_err("not a DNS label");
    assert!(refused.to_string().contains("not a DNS label"), "{refused}");
    // Provisioning the same name again is refused; nothing changes.
    let again = provision(&env.db.url(), env.kube.clone(), &request).await.expect_err("registered already");
    assert!(again.to_string().contains("registered already"), "{again}");

    // The first instance's agent identity serves the new instance too.
    let kubeconfig = std::env::temp_dir().join(format!("kubeconfig-{}-gitops-agent", env.argocd.name()));
    let agent_cancel = env.cancel.child_token();
    let mut agent = AgentConfig::new(env.db.url(), "argocd-p".into(), env.secrets.clone());
    agent.kubeconfig = Some(kubeconfig);
    agent.metrics_address = "127.0.0.1:0".parse().expect("address");
    agent.poll_interval = Duration::from_secs(1);
    agent.heartbeat_interval = Duration::from_millis(300);
    tokio::spawn(run_agent(agent, agent_cancel.clone()));
    eventually("the new instance's version reported", || async {
        let instance = engine_instance_by_name(&env.client, "argocd-p").await.ok()?;
        (instance.argocd_version.as_deref() == Some("v3.0.2") && instance.heartbeat_at.is_some()).then_some(())
    })
    .await;
    let settings = eventually("the pinned tracking method reported", || async {
        let row = env
            .client
            .query_one("SELECT tracking_method FROM engine_instance WHERE name = 'argocd-p'", &[])
            .await
            .ok()?;
        row.get::<_, Option<String>>(0)
    })
    .await;
    assert_eq!(settings, "label");

    // Placed there: the first instance takes no new tenants.
    engine_instance_cordon(&env.client, INSTANCE, true).await.expect("cordon");
    let _writer = env.writer("writer-a");
    env.create("web", spec(REPO, "apps/web")).await;
    let placed = eventually("the tenant placed on the provisioned instance", || async {
        let placed = tenant_placements(&env.client, Some(env.tenant.name()), None).await.ok()?;
        placed.first()?.instance.clone()
    })
    .await;
    assert_eq!(placed, "argocd-p");
    let ready = || async {
        let object = env.deployments().get_opt("web").await.ok()??;
        object
            .status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation)
            .then_some(())
    };
    eventually("Ready on the provisioned instance", ready).await;

    // Decommission: the tenant moves back, the instance and its history go.
    engine_instance_cordon(&env.client, INSTANCE, false).await.expect("uncordon");
    let purged =
        decommission(&env.db.url(), env.kube.clone(), "argocd-p", Duration::from_secs(60)).await.expect("decommission");
    assert!(purged > 0, "its operation history was purged");
    agent_cancel.cancel();
    assert!(engine_instance_by_name(&env.client, "argocd-p").await.is_err(), "unregistered");
    let left: i64 = env
        .client
        .query_one("SELECT count(*) FROM operation_log WHERE engine_instance_id = $1", &[&id])
        .await
        .expect("count")
        .get(0);
    assert_eq!(left, 0, "no operation refers to it");
    let placed = tenant_placements(&env.client, Some(env.tenant.name()), None).await.expect("placements");
    assert_eq!(placed[0].instance.as_deref(), Some(INSTANCE));
    eventually("Ready on the first instance again", ready).await;
    let gone = argocd.get_opt("argocd").await;
    assert!(!matches!(gone, Ok(Some(ref o)) if o.metadata.deletion_timestamp.is_none()), "the ArgoCD is deleted");
    let namespace = Api::<Namespace>::all(env.kube.clone()).get_opt(target.name()).await.expect("read");
    assert!(namespace.is_none_or(|ns| ns.metadata.deletion_timestamp.is_some()), "its namespace is deleted");
    // An instance registered with `instance add` was not provisioned: decommission
    // refuses before it drains or deletes anything.
    let refused = decommission(&env.db.url(), env.kube.clone(), INSTANCE, Duration::from_secs(5))
        .await
        .expect_err("not provisioned");
    assert!(refused.to_string().contains("was not provisioned by the service"), "{refused}");
    let first = engine_instance_by_name(&env.client, INSTANCE).await.expect("still registered");
    assert!(!first.cordoned, "not drained");
    let kept = Api::<Namespace>::all(env.kube.clone()).get(env.argocd.name()).await.expect("its namespace");
    assert!(kept.metadata.deletion_timestamp.is_none(), "its namespace stays");
}

/// An agent serving a host cluster picks up an instance provisioned there while it
/// runs — no new agent — serves a tenant placed on it, and drops it once it is
/// decommissioned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_host_cluster_agent_serves_a_provisioned_instance() {
    let env = env("hostc").await;
    let cluster = TestCluster::get().await;
    cluster.install_crds(vec![argocd_crd()]).await.expect("install the ArgoCD CRD");
    let kubeconfig = std::env::temp_dir().join(format!("kubeconfig-{}-gitops-agent", env.argocd.name()));
    let mut agent = AgentConfig::new(env.db.url(), String::new(), env.secrets.clone());
    agent.serve = Served::HostCluster("east".into());
    agent.instances_refresh = Duration::from_millis(300);
    agent.kubeconfig = Some(kubeconfig);
    agent.metrics_address = "127.0.0.1:0".parse().expect("address");
    agent.poll_interval = Duration::from_secs(1);
    agent.heartbeat_interval = Duration::from_millis(300);
    let handle = agent.handle.clone();
    let agent_cancel = env.cancel.child_token();
    let task = tokio::spawn(run_agent(agent, agent_cancel.clone()));
    eventually("the agent's endpoint", || async { handle.http_address() }).await;
    assert!(handle.instances().is_empty(), "no instance of host cluster east yet");

    let target = cluster.reserved_namespace("hostc-p");
    let namespace = target.name().to_owned();
    tokio::spawn(run_operator(env.kube.clone(), env.standin.clone(), namespace, env.cancel.child_token()));
    let request = ProvisionRequest {
        name: "argocd-h".into(),
        namespace: Some(target.name().to_owned()),
        version: Some("v3.0.2".into()),
        capacity: 10,
        agents: vec![format!("{}/gitops-agent", env.argocd.name())],
        wait: Duration::from_secs(60),
        host_cluster: Some("east".into()),
        provisioned_by: ProvisionedBy::Gitopsctl,
    };
    let bad = ProvisionRequest { host_cluster: Some("East_1".into()), name: "argocd-x".into(), ..request.clone() };
    let refused = provision(&env.db.url(), env.kube.clone(), &bad).await.expect_err("not a DNS label");
    assert!(refused.to_string().contains("host cluster"), "{refused}");
    provision(&env.db.url(), env.kube.clone(), &request).await.expect("provision");
    let instance = engine_instance_by_name(&env.client, "argocd-h").await.expect("registered");
    assert_eq!(instance.host_cluster.as_deref(), Some("east"));
    assert_eq!(instance.provisioned_by.as_deref(), Some("gitopsctl"));
    eventually("the running agent serves the new instance", || async {
        (handle.instances() == ["argocd-h"]).then_some(())
    })
    .await;
    eventually("its heartbeat and version", || async {
        let instance = engine_instance_by_name(&env.client, "argocd-h").await.ok()?;
        (instance.argocd_version.as_deref() == Some("v3.0.2") && instance.heartbeat_at.is_some()).then_some(())
    })
    .await;

    engine_instance_cordon(&env.client, INSTANCE, true).await.expect("cordon");
    let _writer = env.writer("writer-a");
    env.create("web", spec(REPO, "apps/web")).await;
    let ready = || async {
        let object = env.deployments().get_opt("web").await.ok()??;
        object
            .status?
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation)
            .then_some(())
    };
    eventually("Ready on the picked-up instance", ready).await;
    let placed = tenant_placements(&env.client, Some(env.tenant.name()), None).await.expect("placements");
    assert_eq!(placed[0].instance.as_deref(), Some("argocd-h"));

    // Decommissioned: the agent drops it.
    engine_instance_cordon(&env.client, INSTANCE, false).await.expect("uncordon");
    decommission(&env.db.url(), env.kube.clone(), "argocd-h", Duration::from_secs(60)).await.expect("decommission");
    eventually("the agent no longer serves it", || async { handle.instances().is_empty().then_some(()) }).await;
    agent_cancel.cancel();
    let stopped = tokio::time::timeout(crate::support::DEADLINE, task).await.expect("stops in time");
    stopped.expect("agent task").expect("a clean exit");
}
