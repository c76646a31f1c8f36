//! Chaos, small enough for CI: two writers and two agents run as child processes
//! against a PostgreSQL of this test's own; while tenants create, change and delete
//! GitOpsDeployments, children are killed with SIGKILL at random and started again,
//! and PostgreSQL is restarted once. Afterwards the service converges by itself:
//! every deployment's Application matches its current spec and it reads Ready,
//! nothing deleted is left, nothing is duplicated, and no operation failed.
//! The random seed is printed (`GITOPS_CHAOS_SEED` replays one).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gitops_agent::engine::argocd::application_resource;
use gitops_shared::config;
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_testkit::argocd::{self, StandinOptions, app_project_crd, application_crd};
use gitops_testkit::cluster::TestCluster;
use gitops_testkit::random::Random;
use gitops_testkit::{PgCluster, PgOptions};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::children::{signal, spawn};
use crate::support::{DEADLINE, eventually};

const REPO: &str = "https://git.example.invalid/team/app.git";
/// How long children are killed at random.
const CHAOS: Duration = Duration::from_secs(25);

struct Process {
    which: &'static str,
    args: Vec<String>,
    child: tokio::process::Child,
}

/// Starts again every process that stopped by itself; returns how many.
fn supervise(processes: &mut [Process], env: &[(&str, String)], logs: &std::path::Path, round: u32) -> usize {
    let mut exits = 0;
    for process in processes.iter_mut() {
        if let Ok(Some(status)) = process.child.try_wait() {
            println!("a {} stopped by itself ({status}); starting it again", process.which);
            let log = logs.join(format!("{}-{round}-again.log", process.which));
            process.child = spawn(process.which, &process.args, env, Some(&log));
            exits += 1;
        }
    }
    exits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writer_agent_chaos_converges_with_nothing_lost_duplicated_or_stale() {
    let seed = Random::seed_from_env("GITOPS_CHAOS_SEED");
    println!("chaos seed {seed} (GITOPS_CHAOS_SEED={seed} replays it)");
    let mut random = Random::new(seed);

    // A PostgreSQL of this test's own: it is restarted below.
    let postgres = PgCluster::start(PgOptions::default()).await.expect("start PostgreSQL");
    let url = postgres.url("postgres");
    gitops_writer::migrate(&url).await.expect("migrate");
    let client = gitops_shared::db::connect(&url, "chaos-test").await.expect("connect");

    let cluster = TestCluster::get().await;
    let mut crds = gitops_writer::api::crds();
    crds.extend([application_crd(), app_project_crd()]);
    cluster.install_crds(crds).await.expect("install the CRDs");
    let tenant = cluster.namespace("chaos").await;
    let argocd_ns = cluster.namespace("chaos-argo").await;
    let home = cluster.namespace("chaos-home").await;
    let kube = cluster.admin().await;
    let standin = CancellationToken::new();
    tokio::spawn({
        let (kube, name, cancel) = (kube.clone(), argocd_ns.name().to_owned(), standin.clone());
        async move { argocd::run(kube, &name, StandinOptions::default(), cancel).await }
    });
    let _stop_standin = standin.drop_guard();
    engine_instance_add(&client, "argocd-chaos", argocd_ns.name(), 100).await.expect("add the instance");

    let key = SecretBox::generate_key("k1").expect("a key");
    let env = [(config::ENCRYPTION_KEYS, key), (config::ENCRYPTION_ACTIVE_KEY, "k1".to_owned())];
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let logs = std::env::temp_dir().join(format!("gitops-chaos-{seed}"));
    std::fs::create_dir_all(&logs).expect("a log directory");
    let args = |extra: &[&str]| -> Vec<String> {
        ["run", "--database-url", &url, "--kubeconfig", &kubeconfig, "--metrics-address", "127.0.0.1:0"]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    };
    let mut processes: Vec<Process> = Vec::new();
    for id in ["w1", "w2"] {
        let args = args(&[
            "--writer-id",
            id,
            "--namespaces",
            tenant.name(),
            "--home-namespace",
            home.name(),
            "--allow-unverified-home-deployments",
        ]);
        let child = spawn("writer", &args, &env, Some(&logs.join(format!("{id}.log"))));
        processes.push(Process { which: "writer", args, child });
    }
    for id in ["a1", "a2"] {
        let args = args(&["--instance", "argocd-chaos", "--lease", "5s", "--sweep-interval", "10s"]);
        let child = spawn("agent", &args, &env, Some(&logs.join(format!("{id}.log"))));
        processes.push(Process { which: "agent", args, child });
    }

    let deployments: Api<GitOpsDeployment> = Api::namespaced(kube.clone(), tenant.name());
    let create = |name: String, path: String| {
        let deployments = deployments.clone();
        async move {
            let object: GitOpsDeployment = serde_json::from_value(json!({
                "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
                "metadata": {"name": name},
                "spec": {"source": {"repoURL": REPO, "path": path}, "destination": {}, "type": "automated"},
            }))
            .expect("a GitOpsDeployment");
            deployments.create(&PostParams::default(), &object).await.expect("create a GitOpsDeployment");
        }
    };
    // name -> path the tenant wants now; deleted names are removed.
    let mut wanted: BTreeMap<String, String> = BTreeMap::new();
    let mut deleted: Vec<String> = Vec::new();
    for i in 0..12 {
        let (name, path) = (format!("app-{i}"), format!("apps/{i}/v0"));
        create(name.clone(), path.clone()).await;
        wanted.insert(name, path);
    }

    let started = Instant::now();
    let mut exits = 0;
    let mut restarted_postgres = false;
    let mut round = 0u32;
    while started.elapsed() < CHAOS {
        round += 1;
        // A tenant at work: a change, sometimes a deletion or a new deployment.
        let names: Vec<String> = wanted.keys().cloned().collect();
        let name = names[random.below(names.len())].clone();
        let path = format!("apps/{name}/v{round}");
        let patch = json!({"spec": {"source": {"path": path}}});
        deployments.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change a deployment");
        wanted.insert(name.clone(), path);
        match random.below(6) {
            0 if wanted.len() > 6 => {
                deployments.delete(&name, &DeleteParams::default()).await.expect("delete a deployment");
                wanted.remove(&name);
                deleted.push(name);
            }
            1 => {
                let (name, path) = (format!("late-{round}"), format!("apps/late/{round}"));
                create(name.clone(), path.clone()).await;
                wanted.insert(name, path);
            }
            _ => {}
        }
        // A process dies without warning and comes back.
        let victim = random.below(processes.len());
        let process = &mut processes[victim];
        signal(&process.child, "-KILL").await;
        let _ = process.child.wait().await;
        let log = logs.join(format!("{}-{round}.log", process.which));
        process.child = spawn(process.which, &process.args, &env, Some(&log));
        if !restarted_postgres && started.elapsed() > CHAOS / 2 {
            postgres.restart().await.expect("restart PostgreSQL");
            restarted_postgres = true;
        }
        tokio::time::sleep(Duration::from_millis(500 + random.below(1500) as u64)).await;
        exits += supervise(&mut processes, &env, &logs, round);
    }
    assert!(restarted_postgres, "PostgreSQL was restarted once");
    // As a Deployment's pods are: one that stopped by itself (a start while the
    // database was away ends with an error) is started again.
    exits += supervise(&mut processes, &env, &logs, round + 1);
    println!("{round} kills; {exits} processes stopped by themselves and were started again");

    // Converged by itself: no deadline beyond the test's usual one.
    let chaos_over = Instant::now();
    let apps: Api<DynamicObject> = Api::namespaced_with(kube.clone(), argocd_ns.name(), &application_resource());
    let check = || async {
        let selector = format!("{}={}", gitops_agent::names::MANAGED_BY_LABEL, gitops_agent::names::MANAGED_BY_VALUE);
        let listed = apps.list(&ListParams::default().labels(&selector)).await.ok()?;
        let by_name: BTreeMap<String, String> = listed
            .items
            .iter()
            .map(|app| {
                let path = app.data["spec"]["source"]["path"].as_str().unwrap_or_default().to_owned();
                (app.metadata.name.clone().unwrap_or_default(), path)
            })
            .collect();
        let mut stale = Vec::new();
        for (name, path) in &wanted {
            let object = deployments.get_opt(name).await.ok()??;
            let uid = object.metadata.uid.clone()?;
            let app = by_name.get(&gitops_agent::names::application_name(uid.parse().ok()?));
            let ready = object.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation
                })
            });
            if app != Some(path) || !ready {
                stale.push(name.clone());
            }
        }
        let extra = by_name.len().saturating_sub(wanted.len());
        (stale.is_empty() && extra == 0).then_some(())
    };
    eventually("every deployment converged, nothing left over", check).await;
    println!("converged {:.1}s after the chaos ended (seed {seed})", chaos_over.elapsed().as_secs_f64());
    for name in &deleted {
        assert!(deployments.get_opt(name).await.expect("read").is_none(), "{name} stays deleted");
    }
    // The restart cut the test's own connection too.
    let client = gitops_shared::db::connect(&url, "chaos-test").await.expect("connect again");
    let failed: i64 = client
        .query_one("SELECT count(*) AS failed FROM operation WHERE state = 'failed'", &[])
        .await
        .expect("count")
        .get("failed");
    assert_eq!(failed, 0, "no operation was dead-lettered (logs in {})", logs.display());
    let live: i64 = client
        .query_one("SELECT count(*) AS live FROM application WHERE row_state = 'active'", &[])
        .await
        .expect("count")
        .get("live");
    assert_eq!(live, wanted.len() as i64, "one live row per deployment, none lost or doubled");
    assert!(chaos_over.elapsed() < DEADLINE);
    for process in &processes {
        signal(&process.child, "-TERM").await;
    }
    for process in &mut processes {
        let _ = tokio::time::timeout(DEADLINE, process.child.wait()).await;
    }
    let _ = std::fs::remove_dir_all(&logs);
}
