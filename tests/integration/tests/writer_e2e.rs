//! The writer end to end: `run_writer` in-process with an in-process agent and the
//! Argo CD stand-in on the test tier's API server. A GitOpsDeployment becomes an
//! Argo CD Application; invalid ones get their condition and write nothing;
//! deletion releases the finalizer and the Application goes; two writers share the
//! shards. Tests wait on conditions and rows with deadlines, never on time.

use std::time::Duration;

use gitops_agent::names;
use gitops_testkit::cluster::TestCluster;
use gitops_writer::api::GitOpsDeployment;
use gitops_writer::controller::{
    CONDITION, FINALIZER, REASON_ACCEPTED, REASON_DEPLOYMENT_AUTOMATED, REASON_DEPLOYMENT_NOT_FOUND,
    REASON_QUOTA_EXCEEDED, RESOURCES_FINALIZER, WAIT_FOR_PRUNING,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::writer::{Env, env, manual, spec};
use crate::support::{eventually, sample};

#[tokio::test]
async fn writer_e2e_deployment_becomes_an_application_and_goes_on_delete() {
    let env = env("we-deploy").await;
    let address = std::sync::Arc::new(std::sync::OnceLock::new());
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| c.http_address = address.clone());
    let created = env.create("web", spec("https://git.example.invalid/org/repo.git", "apps/web")).await;
    let (status, reason, _) = env.condition("web").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_ACCEPTED));
    let uid = uuid::Uuid::parse_str(created.metadata.uid.as_deref().expect("uid")).expect("uuid");
    let app_name = names::application_name(uid);
    eventually("the Application", || async { env.apps().get_opt(&app_name).await.ok()? }).await;
    let object = env.deployments().get("web").await.expect("read");
    assert!(object.metadata.finalizers.unwrap_or_default().iter().any(|f| f == FINALIZER));
    let address = *address.get().expect("the endpoint is bound");
    eventually("/readyz answers 200", || async {
        (crate::support::http_get(address, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    // One refusal, so the validation series has a sample.
    env.create("bad", spec("https://git.example.invalid/org/repo.git", "a/../b")).await;
    assert_eq!(env.condition("bad").await.1, "InvalidPath");
    let deployment_ok = "gitops_writer_reconciles_total{kind=\"GitOpsDeployment\",outcome=\"ok\"}";
    let invalid_path = "gitops_writer_validation_failures_total{kind=\"GitOpsDeployment\",reason=\"InvalidPath\"}";
    // Counters move just after the condition is written: scrape until they did.
    let metrics = eventually("both reconciles counted", || async {
        let (code, metrics) = crate::support::http_get(address, "/metrics").await;
        assert_eq!(code, 200);
        (sample(&metrics, deployment_ok)? >= 1.0 && sample(&metrics, invalid_path)? >= 1.0).then_some(metrics)
    })
    .await;
    assert!(metrics.contains("gitops_writer_shards_owned 64"), "{metrics}");
    let value = |series: &str| sample(&metrics, series).unwrap_or_else(|| panic!("no {series} in\n{metrics}"));
    // Each status write is a watch event, so an object may be reconciled more than once.
    assert!(value("gitops_writer_reconciles_total{kind=\"GitOpsDeployment\",outcome=\"invalid\"}") >= 1.0);
    for outcome in ["failed", "retry"] {
        // Every outcome has its series, zero or not (`value` panics on a missing one).
        value(&format!("gitops_writer_reconciles_total{{kind=\"GitOpsDeployment\",outcome=\"{outcome}\"}}"));
    }
    assert_eq!(value("gitops_writer_tenants"), 1.0, "the one tenant namespace");
    assert_eq!(value("gitops_writer_deployments"), 2.0, "'web' and 'bad'");
    // 'web' wrote its intent in at least one timed transaction.
    let transactions = value("gitops_writer_transaction_seconds_count");
    assert!(transactions >= 1.0, "{metrics}");
    assert_eq!(value("gitops_writer_transaction_seconds_bucket{le=\"+Inf\"}"), transactions);
    let sum = value("gitops_writer_transaction_seconds_sum");
    assert!(sum > 0.0 && sum < 60.0 * transactions, "{sum} s for {transactions} transactions");
    assert!(value("gitops_writer_transaction_seconds_bucket{le=\"10\"}") <= transactions);
    assert_eq!(crate::support::http_get(address, "/healthz").await.0, 200);

    env.deployments().delete("web", &DeleteParams::default()).await.expect("delete");
    eventually("the GitOpsDeployment gone", || async {
        env.deployments().get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    eventually("the Application gone", || async { env.apps().get_opt(&app_name).await.ok()?.is_none().then_some(()) })
        .await;
}

#[tokio::test]
async fn writer_e2e_invalid_inputs_get_their_condition_and_write_nothing() {
    let env = env("we-invalid").await;
    let _writer = env.writer("writer-a");
    let repo = "https://git.example.invalid/org/repo.git";
    // What the schema cannot refuse reaches the writer, which refuses it (the rest
    // is refused at apply time: `writer_admission`).
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("dotdot", spec(repo, "a/../../etc"), "InvalidPath"),
        ("password", spec("https://u:p@git.example.invalid/x", "p"), "InvalidRepositoryURL"),
        ("too-long", spec(repo, &"é".repeat(600)), "FieldTooLong"),
        (
            "no-env",
            json!({"source": {"repoURL": repo, "path": "p"}, "destination": {"environment": "elsewhere"},
                   "type": "automated"}),
            "EnvironmentNotFound",
        ),
    ];
    for (name, spec, _) in &cases {
        env.create(name, spec.clone()).await;
    }
    for (name, _, want) in &cases {
        let (status, reason, message) = env.condition(name).await;
        assert_eq!((status.as_str(), reason.as_str()), ("True", *want), "{name}: {message}");
        assert_eq!(env.rows(name).await, 0, "{name} wrote nothing");
    }
    // Metacharacters are plain text where the field allows them.
    env.create("meta", spec(repo, "apps/x;$(rm -rf)'--")).await;
    let (status, reason, _) = env.condition("meta").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_ACCEPTED));
    assert_eq!(env.rows("meta").await, 1);
}

#[tokio::test]
async fn writer_e2e_update_changes_the_application_and_recreate_is_a_new_row() {
    let env = env("we-update").await;
    let _writer = env.writer("writer-a");
    let repo = "https://git.example.invalid/org/repo.git";
    env.create("web", spec(repo, "apps/v1")).await;
    env.condition("web").await;
    let app = env.application_of("web").await;
    let patch = json!({"spec": {"source": {"path": "apps/v2"}}});
    env.deployments().patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("update");
    let (status, reason, _) = env.condition("web").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_ACCEPTED));
    eventually("the Application at the new path", || async {
        let object = env.apps().get_opt(&app).await.ok()??;
        (object.data.pointer("/spec/source/path")?.as_str()? == "apps/v2").then_some(())
    })
    .await;
    let generation: i64 = env
        .client
        .query_one("SELECT generation FROM application WHERE resource_name = 'web'", &[])
        .await
        .expect("generation")
        .get(0);
    assert_eq!(generation, 2);

    env.deployments().delete("web", &DeleteParams::default()).await.expect("delete");
    eventually("the GitOpsDeployment gone", || async {
        env.deployments().get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    env.create("web", spec(repo, "apps/v1")).await;
    env.condition("web").await;
    let rows = env
        .client
        .query("SELECT row_state::text FROM application WHERE resource_name = 'web' ORDER BY id", &[])
        .await
        .expect("rows");
    let states: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(states.len(), 2, "the recreated resource is a new row: {states:?}");
    assert_ne!(states[0], "active", "the first row is tombstoned: {states:?}");
    assert_eq!(states[1], "active");
    assert_ne!(env.application_of("web").await, app, "a new Application for the new UID");
}

#[tokio::test]
async fn writer_e2e_wait_for_pruning_keeps_the_finalizer_until_the_row_is_deleted() {
    // The annotation, and the original service's finalizer with the same meaning
    // (which the writer releases with its own).
    for (purpose, metadata) in [
        ("we-prune", json!({"name": "web", "annotations": {WAIT_FOR_PRUNING: "true"}})),
        ("we-prune-fin", json!({"name": "web", "finalizers": [RESOURCES_FINALIZER]})),
    ] {
        wait_for_pruning(purpose, metadata).await;
    }
}

async fn wait_for_pruning(purpose: &str, metadata: serde_json::Value) {
    let env = env(purpose).await;
    // No second look on a timer: the agent's confirmation, through the status feed,
    // is what releases the finalizer.
    let _writer = env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |c| {
        c.controllers.prune_poll = Duration::from_secs(3600);
    });
    let object: GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
        "metadata": metadata,
        "spec": spec("https://git.example.invalid/org/repo.git", "apps/web"),
    }))
    .expect("GitOpsDeployment");
    env.deployments().create(&PostParams::default(), &object).await.expect("create");
    env.condition("web").await;
    let app = env.application_of("web").await;
    eventually("the Application", || async { env.apps().get_opt(&app).await.ok()? }).await;
    env.deployments().delete("web", &DeleteParams::default()).await.expect("delete");
    eventually("the GitOpsDeployment gone", || async {
        env.deployments().get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    let state: String = env
        .client
        .query_one("SELECT row_state::text FROM application WHERE resource_name = 'web'", &[])
        .await
        .expect("row")
        .get(0);
    assert_eq!(state, "deleted", "{purpose}: the finalizer went only after the agent confirmed the prune");
    assert!(env.apps().get_opt(&app).await.expect("read").is_none());
}

#[tokio::test]
async fn writer_e2e_sync_run_syncs_a_manual_deployment_and_is_refused_for_an_automated_one() {
    let env = env("we-sync").await;
    let _writer = env.writer("writer-a");
    let repo = "https://git.example.invalid/org/repo.git";
    // A run that arrives before its deployment waits.
    env.create_sync_run("early", "web", "main").await;
    env.sync_run_reason("early", REASON_DEPLOYMENT_NOT_FOUND).await;
    assert!(env.sync_state("early").await.is_none());
    env.create("web", manual(repo, "apps/web")).await;
    env.condition("web").await;
    env.sync_run_reason("early", REASON_ACCEPTED).await;
    eventually("the sync succeeded", || async {
        let (state, revision) = env.sync_state("early").await?;
        (state == "succeeded").then_some(revision)
    })
    .await;

    env.create("auto", spec(repo, "apps/auto")).await;
    env.condition("auto").await;
    env.create_sync_run("refused", "auto", "main").await;
    env.sync_run_reason("refused", REASON_DEPLOYMENT_AUTOMATED).await;
    assert!(env.sync_state("refused").await.is_none(), "a refused run writes nothing");

    env.sync_runs().delete("early", &DeleteParams::default()).await.expect("delete");
    eventually("the SyncRun gone", || async { env.sync_runs().get_opt("early").await.ok()?.is_none().then_some(()) })
        .await;
    let terminate: bool = env
        .client
        .query_one("SELECT terminate_requested FROM sync_operation WHERE resource_name = 'early'", &[])
        .await
        .expect("row")
        .get(0);
    assert!(terminate);
}

#[tokio::test]
async fn writer_e2e_quota_is_counted_per_namespace() {
    let env = env("we-quota").await;
    let namespaces = vec![env.tenant.name().to_owned()];
    let _writer = env.writer_for("writer-a", namespaces, |config| config.controllers.max_deployments = 2);
    let repo = "https://git.example.invalid/org/repo.git";
    for name in ["one", "two"] {
        env.create(name, spec(repo, name)).await;
        let (status, reason, _) = env.condition(name).await;
        assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_ACCEPTED), "{name}");
    }
    env.create("three", spec(repo, "three")).await;
    let (status, reason, _) = env.condition("three").await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", REASON_QUOTA_EXCEEDED));
    assert_eq!(env.rows("three").await, 0);
    // Room again once one goes.
    env.deployments().delete("one", &DeleteParams::default()).await.expect("delete");
    eventually("the row of 'one' deleted", || async {
        let row = env
            .client
            .query_one("SELECT row_state::text FROM application WHERE resource_name = 'one'", &[])
            .await
            .ok()?;
        (row.get::<_, String>(0) == "deleted").then_some(())
    })
    .await;
    eventually("'three' accepted", || async {
        let (_, reason, _) = env.condition("three").await;
        (reason == REASON_ACCEPTED).then_some(())
    })
    .await;
    assert_eq!(env.rows("three").await, 1);
}

#[tokio::test]
async fn writer_e2e_two_writers_share_the_shards_and_handle_each_namespace_once() {
    let env = env("we-two").await;
    let cluster = TestCluster::get().await;
    let mut extra = Vec::new();
    for i in 0..5 {
        extra.push(cluster.namespace(&format!("we-two-{i}")).await);
    }
    let mut namespaces: Vec<String> = extra.iter().map(|ns| ns.name().to_owned()).collect();
    namespaces.push(env.tenant.name().to_owned());
    let metrics_a = std::sync::Arc::new(gitops_writer::metrics::WriterMetrics::default());
    let metrics_b = std::sync::Arc::new(gitops_writer::metrics::WriterMetrics::default());
    let _a = env.writer_for("writer-a", namespaces.clone(), |c| c.metrics = metrics_a.clone());
    let b = env.writer_for("writer-b", namespaces.clone(), |c| c.metrics = metrics_b.clone());
    eventually("the shards split evenly", || async {
        let rows = env
            .client
            .query(
                "SELECT writer_id, count(*) FROM writer_shard WHERE lease_expires_at > now() GROUP BY writer_id ORDER BY 1",
                &[],
            )
            .await
            .ok()?;
        let split: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        (split == [("writer-a".to_owned(), 32), ("writer-b".to_owned(), 32)]).then_some(())
    })
    .await;
    let repo = "https://git.example.invalid/org/repo.git";
    for namespace in &namespaces {
        let api: Api<GitOpsDeployment> = Api::namespaced(env.kube.clone(), namespace);
        let object: GitOpsDeployment = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
            "metadata": {"name": "web"}, "spec": spec(repo, "apps/web"),
        }))
        .expect("GitOpsDeployment");
        api.create(&PostParams::default(), &object).await.expect("create");
    }
    for namespace in &namespaces {
        let api: Api<GitOpsDeployment> = Api::namespaced(env.kube.clone(), namespace);
        eventually("accepted", || async {
            let object = api.get_opt("web").await.ok()??;
            let condition = object.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
            (condition.reason.as_deref() == Some(REASON_ACCEPTED)).then_some(())
        })
        .await;
    }
    // One tenant and one application per namespace, each on the shard of its name,
    // and exactly one operation per application (generation 1 was written once),
    // whether it still waits or is claimed, or an agent already finished it.
    let rows = env
        .client
        .query(
            "SELECT t.namespace_name, t.writer_shard, count(DISTINCT a.id), count(o.id)
               FROM tenant t JOIN application a ON a.tenant_id = t.id
               LEFT JOIN (SELECT id, resource_id FROM operation WHERE resource_type = 'application'
                          UNION ALL
                          SELECT id, resource_id FROM operation_history WHERE resource_type = 'application') o
                      ON o.resource_id = a.id
              GROUP BY t.namespace_name, t.writer_shard ORDER BY 1",
            &[],
        )
        .await
        .expect("tenants");
    assert_eq!(rows.len(), namespaces.len());
    for row in rows {
        let (namespace, shard, apps, operations): (String, Option<i32>, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(shard, Some(gitops_writer::shard::shard_of(&namespace)), "{namespace}");
        assert_eq!((apps, operations), (1, 1), "{namespace} handled once");
    }
    // A writer reconciles only the namespaces on its shards: one that owns none of
    // them reconciled nothing.
    let owners = env.client.query("SELECT shard, writer_id FROM writer_shard", &[]).await.expect("owners");
    let owner_of = |namespace: &str| -> String {
        let shard = gitops_writer::shard::shard_of(namespace);
        owners.iter().find(|r| r.get::<_, i32>(0) == shard).map(|r| r.get(1)).expect("owned")
    };
    for (id, metrics) in [("writer-a", &metrics_a), ("writer-b", &metrics_b)] {
        let mine = namespaces.iter().filter(|ns| owner_of(ns) == id).count() as u64;
        let reconciled = metrics.reconciles_total(gitops_writer::metrics::Outcome::Ok);
        assert!(reconciled >= mine, "{id}: {reconciled} reconciles for {mine} namespaces");
        if mine == 0 {
            assert_eq!(reconciled, 0, "{id} owns none of the namespaces");
        }
    }
    // A writer that stops gives its shards back; the other takes them all.
    b.cancel();
    eventually("writer-a holds every shard", || async {
        let row = env
            .client
            .query_one(
                "SELECT count(*) FILTER (WHERE writer_id = 'writer-a' AND lease_expires_at > now()) FROM writer_shard",
                &[],
            )
            .await
            .ok()?;
        (row.get::<_, i64>(0) == 64).then_some(())
    })
    .await;
}

/// A writer identity as `ops/deploy` makes it: a ServiceAccount bound by a
/// ClusterRoleBinding to a ClusterRole with exactly `support::writer_rbac_rules()`.
/// Cluster-scoped, so [`WriterIdentity::remove`] deletes the role and binding.
pub(crate) struct WriterIdentity {
    name: String,
}

impl WriterIdentity {
    /// Deletes the ClusterRole and ClusterRoleBinding (the ServiceAccount goes with
    /// its namespace).
    pub(crate) async fn remove(self, kube: &kube::Client) {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let params = DeleteParams::default();
        let _ = Api::<ClusterRoleBinding>::all(kube.clone()).delete(&self.name, &params).await;
        let _ = Api::<ClusterRole>::all(kube.clone()).delete(&self.name, &params).await;
    }
}

impl Env {
    /// A writer for the tenant namespace that runs as a ServiceAccount (in the Argo CD
    /// namespace of this test) allowed exactly `support::writer_rbac_rules()`
    /// cluster-wide, instead of as the admin. Opt-in: the other tests keep the admin.
    pub(crate) async fn writer_as_service_account(&self, id: &str) -> (CancellationToken, WriterIdentity) {
        use k8s_openapi::api::authentication::v1::TokenRequest;
        use k8s_openapi::api::core::v1::ServiceAccount;
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

        let name = format!("gitops-writer-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let namespace = self.argocd.name();
        let post = PostParams::default();
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("a ServiceAccount");
        Api::<ServiceAccount>::namespaced(self.kube.clone(), namespace)
            .create(&post, &account)
            .await
            .expect("create the writer's ServiceAccount");
        let role: ClusterRole =
            serde_json::from_value(json!({"metadata": {"name": name}, "rules": crate::support::writer_rbac_rules()}))
                .expect("a ClusterRole");
        Api::<ClusterRole>::all(self.kube.clone()).create(&post, &role).await.expect("create the writer's ClusterRole");
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]
        }))
        .expect("a ClusterRoleBinding");
        Api::<ClusterRoleBinding>::all(self.kube.clone())
            .create(&post, &binding)
            .await
            .expect("create the writer's ClusterRoleBinding");
        let request: TokenRequest =
            serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
                .expect("a TokenRequest");
        let token = Api::<ServiceAccount>::namespaced(self.kube.clone(), namespace)
            .create_token_request(&name, &post, &request)
            .await
            .expect("a token for the writer's ServiceAccount")
            .status
            .map(|status| status.token)
            .expect("a token");
        let mut kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("the admin kubeconfig");
        for user in &mut kubeconfig.auth_infos {
            user.auth_info = serde_json::from_value(json!({ "token": token })).ok();
        }
        let path = std::env::temp_dir().join(format!("kubeconfig-{namespace}-{name}"));
        std::fs::write(&path, serde_json::to_string(&kubeconfig).expect("a kubeconfig serialises"))
            .expect("write the writer's kubeconfig");
        let cancel = self.writer_for(id, vec![self.tenant.name().to_owned()], |config| config.kubeconfig = Some(path));
        (cancel, WriterIdentity { name })
    }
}

#[tokio::test]
async fn writer_e2e_runs_with_exactly_its_deployed_rbac_rules() {
    let env = env("we-rbac").await;
    let (writer, identity) = env.writer_as_service_account("writer-sa").await;
    let created = env.create("web", spec("https://git.example.invalid/org/repo.git", "apps/web")).await;
    let (status, reason, message) = env.condition("web").await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", REASON_ACCEPTED), "{message}");
    let uid = uuid::Uuid::parse_str(created.metadata.uid.as_deref().expect("uid")).expect("uuid");
    let app_name = names::application_name(uid);
    eventually("the Application", || async { env.apps().get_opt(&app_name).await.ok()? }).await;
    // Deletion patches the finalizer away with the same rights.
    env.deployments().delete("web", &DeleteParams::default()).await.expect("delete");
    eventually("the GitOpsDeployment gone", || async {
        env.deployments().get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    writer.cancel();
    identity.remove(&env.kube).await;
}

/// The writer's install as kustomize renders it from `ops/deploy/writer`, by `Kind/name`.
fn writer_manifests() -> std::collections::BTreeMap<String, serde_json::Value> {
    crate::support::rendered_install("writer")
}

#[test]
fn writer_e2e_deploy_cluster_role_grants_exactly_the_tested_rules() {
    let m = writer_manifests();
    let keys: Vec<&str> =
        m.keys().map(String::as_str).filter(|k| !k.starts_with("CustomResourceDefinition/")).collect();
    assert_eq!(
        keys,
        [
            "ClusterRole/gitops-writer",
            "ClusterRoleBinding/gitops-writer",
            "Deployment/gitops-writer",
            "Namespace/gitops-service",
            "Namespace/gitops-service-home",
            "NetworkPolicy/gitops-writer",
            "PodDisruptionBudget/gitops-writer",
            "Service/gitops-writer-metrics",
            "Service/gitops-writer-webhook",
            "ServiceAccount/gitops-writer",
            "ValidatingWebhookConfiguration/gitops-service"
        ]
    );
    // The tenant CRDs come with the writer, exactly those the Rust types generate.
    let crds: Vec<&str> = m.keys().filter_map(|k| k.strip_prefix("CustomResourceDefinition/")).collect();
    let generated: Vec<String> =
        gitops_writer::api::crds().into_iter().map(|crd| crd.metadata.name.expect("a name")).collect();
    let mut generated: Vec<&str> = generated.iter().map(String::as_str).collect();
    generated.sort_unstable();
    assert_eq!(crds, generated);
    assert_eq!(m["ClusterRole/gitops-writer"]["rules"], crate::support::writer_rbac_rules());

    let namespace = &m["ServiceAccount/gitops-writer"]["metadata"]["namespace"];
    assert!(namespace.is_string(), "the ServiceAccount has a namespace");
    assert_eq!(&m["Deployment/gitops-writer"]["metadata"]["namespace"], namespace);
    let binding = &m["ClusterRoleBinding/gitops-writer"];
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], m["ClusterRole/gitops-writer"]["metadata"]["name"]);
    let subjects = binding["subjects"].as_array().expect("subjects");
    assert_eq!(subjects.len(), 1, "bound to the writer only");
    assert_eq!(subjects[0]["kind"], "ServiceAccount");
    assert_eq!(subjects[0]["name"], m["ServiceAccount/gitops-writer"]["metadata"]["name"]);
    assert_eq!(&subjects[0]["namespace"], namespace);
    assert_eq!(
        m["Deployment/gitops-writer"]["spec"]["template"]["spec"]["serviceAccountName"],
        m["ServiceAccount/gitops-writer"]["metadata"]["name"]
    );
}

/// The webhook reaches the writer (Service → the Deployment's `webhook` port, where
/// the writer listens with the mounted certificate), for every tenant kind's CREATE
/// and UPDATE, failing closed within 5 s; the home namespace is the writer's default.
#[test]
fn writer_e2e_deploy_registers_the_webhook_and_the_home_namespace() {
    let m = writer_manifests();
    let container = &m["Deployment/gitops-writer"]["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().expect("env");
    let value =
        |name: &str| env.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str()).map(str::to_owned);
    let address = value("GITOPS_WRITER_WEBHOOK_ADDRESS").expect("a webhook address");
    let port: u64 = address.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).expect("a port");
    let ports = container["ports"].as_array().expect("ports");
    assert!(ports.iter().any(|p| p["name"] == "webhook" && p["containerPort"] == port));
    let service = &m["Service/gitops-writer-webhook"];
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "webhook");
    let webhook = &m["ValidatingWebhookConfiguration/gitops-service"]["webhooks"][0];
    let client = &webhook["clientConfig"]["service"];
    assert_eq!(client["name"], service["metadata"]["name"]);
    assert_eq!(client["namespace"], service["metadata"]["namespace"]);
    assert_eq!(client["port"], service["spec"]["ports"][0]["port"]);
    assert_eq!(client["path"], "/validate");
    assert_eq!((webhook["failurePolicy"].as_str(), webhook["timeoutSeconds"].as_u64()), (Some("Fail"), Some(5)));
    let rule = &webhook["rules"][0];
    assert_eq!(rule["operations"], json!(["CREATE", "UPDATE"]));
    let resources: Vec<&str> =
        rule["resources"].as_array().expect("resources").iter().filter_map(|r| r.as_str()).collect();
    for crd in gitops_writer::api::crds() {
        assert!(
            resources.contains(&crd.spec.names.plural.as_str()),
            "{} is not sent to the webhook",
            crd.spec.names.plural
        );
    }
    assert!(!resources.iter().any(|r| r.contains('/')), "no subresource (status) is sent");
    let home = format!("Namespace/{}", gitops_writer::controller::DEFAULT_HOME_NAMESPACE);
    assert!(m.contains_key(&home), "the install makes the writer's default home namespace");
    assert_eq!(
        m["ValidatingWebhookConfiguration/gitops-service"]["metadata"]["name"], "gitops-service",
        "the writer's default registration name"
    );
    let mounted = container["volumeMounts"][0]["mountPath"].as_str().expect("a mounted certificate");
    assert!(value("GITOPS_WRITER_WEBHOOK_CERT_FILE").expect("a certificate").starts_with(mounted));
    assert!(value("GITOPS_TENANT_NAMESPACE_SELECTOR").is_some(), "a production install selects its tenant namespaces");
}

#[test]
fn writer_e2e_deploy_sets_only_variables_the_writer_reads() {
    let m = writer_manifests();
    let container = &m["Deployment/gitops-writer"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["command"], json!(["gitops-writer", "run"]));

    let known = gitops_writer::run_env_vars();
    assert!(known.iter().any(|k| k == "GITOPS_WRITER_METRICS_ADDRESS"), "the flags were found: {known:?}");
    let env = container["env"].as_array().expect("env");
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().expect("a name")).collect();
    for name in &names {
        assert!(known.iter().any(|k| k == name), "{name} is not read by gitops-writer run ({known:?})");
    }
    for secret in ["DATABASE_URL", "GITOPS_ENCRYPTION_KEYS", "GITOPS_ENCRYPTION_ACTIVE_KEY"] {
        let var = env.iter().find(|e| e["name"] == secret).unwrap_or_else(|| panic!("{secret} not set"));
        assert!(var.get("value").is_none(), "{secret} must come from a Secret");
        assert!(var["valueFrom"]["secretKeyRef"]["name"].is_string(), "{secret} must come from a Secret");
    }

    // The probes reach the metrics listener, which must listen beyond loopback.
    let address = env.iter().find(|e| e["name"] == "GITOPS_WRITER_METRICS_ADDRESS").and_then(|e| e["value"].as_str());
    crate::support::assert_probes_reach_metrics(container, address);
}

/// The metrics Service, the disruption budget and the network policy select the
/// writer's pods; the policy lets in the API server (webhook port) and scraping
/// (metrics port) only, and lets out DNS, PostgreSQL, API servers and Git only; the
/// production overlay runs several writers with resource requests.
#[test]
fn writer_e2e_deploy_service_budget_policy_and_production_overlay() {
    let m = writer_manifests();
    let deployment = &m["Deployment/gitops-writer"];
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selects = |selector: &serde_json::Value| {
        let wanted = selector.as_object().expect("matchLabels");
        !wanted.is_empty() && wanted.iter().all(|(k, v)| &pod_labels[k] == v)
    };
    assert!(selects(&m["Service/gitops-writer-metrics"]["spec"]["selector"]));
    assert_eq!(m["Service/gitops-writer-metrics"]["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(m["PodDisruptionBudget/gitops-writer"]["apiVersion"], "policy/v1");
    assert!(selects(&m["PodDisruptionBudget/gitops-writer"]["spec"]["selector"]["matchLabels"]));

    let policy = &m["NetworkPolicy/gitops-writer"]["spec"];
    assert!(selects(&policy["podSelector"]["matchLabels"]));
    assert_eq!(policy["policyTypes"], json!(["Ingress", "Egress"]));
    let ingress_ports: Vec<&serde_json::Value> =
        policy["ingress"].as_array().expect("ingress rules").iter().map(|rule| &rule["ports"][0]["port"]).collect();
    assert_eq!(ingress_ports, [&json!("webhook"), &json!("metrics")]);
    assert_eq!(crate::support::egress_ports(policy), ["TCP/22", "TCP/443", "TCP/53", "TCP/5432", "TCP/6443", "UDP/53"]);

    let production = crate::support::rendered_install("overlays/production/writer");
    let deployment = &production["Deployment/gitops-writer"];
    assert!(deployment["spec"]["replicas"].as_u64().expect("replicas") >= 2);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(container["resources"]["requests"]["cpu"].is_string());
    let image = container["image"].as_str().expect("an image");
    assert!(image.contains('/') && image.ends_with("/gitops-writer:0.1.0"), "{image}");
}
