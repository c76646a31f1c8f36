//! The long-running binaries stop on SIGTERM whatever became of their output: a
//! writer or an agent whose stdout and stderr are closed pipes (`… 2>&1 | head`)
//! still shuts down cleanly. Each runs as a child process of this test binary, its
//! command line handled as its `main` handles it.

use std::time::Instant;

use clap::Parser as _;
use gitops_shared::config;
use gitops_shared::crypto::SecretBox;
use gitops_shared::db::engine_instance::engine_instance_add;
use gitops_testkit::TestDb;
use gitops_testkit::argocd::{app_project_crd, application_crd};
use gitops_testkit::cluster::TestCluster;

use crate::support::children::{CHILD, CHILD_ARGS, signal, spawn};
use crate::support::{DEADLINE, eventually};

/// The child process's body, not a test of its own: runs the binary named by
/// `GITOPS_TEST_CHILD` and exits with its code (before the harness prints anything).
#[test]
#[ignore = "the body of the child processes of process_signals' tests"]
fn child() {
    let Ok(which) = std::env::var(CHILD) else { return };
    let args: Vec<String> = std::env::var(CHILD_ARGS).unwrap_or_default().lines().map(str::to_owned).collect();
    gitops_shared::telemetry::init_logging();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let code = runtime.block_on(async move {
        match which.as_str() {
            "writer" => {
                let cli = gitops_writer::Cli::parse_from(std::iter::once("gitops-writer".to_owned()).chain(args));
                i32::from(gitops_writer::execute(cli.command).await.is_err())
            }
            "agent" => {
                let cli = gitops_agent::Cli::parse_from(std::iter::once("gitops-agent".to_owned()).chain(args));
                i32::from(gitops_agent::execute(cli.command).await.is_err())
            }
            "egress-checks" => crate::writer_egress_proxy::child(&args).await,
            other => panic!("no binary {other:?}"),
        }
    });
    std::process::exit(code);
}

/// Starts `which` with `args`, waits until `running` says it works, closes its
/// output, sends SIGTERM and returns its exit status.
async fn stop_with_output_closed<F, Fut>(
    which: &str,
    args: &[String],
    env: &[(&str, String)],
    running: F,
) -> std::process::ExitStatus
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let mut child = spawn(which, args, env, None);
    eventually(&format!("the {which} at work"), running).await;
    // Nobody reads its output any more: every line it logs from now on fails to write.
    drop(child.stdout.take());
    drop(child.stderr.take());
    signal(&child, "-TERM").await;
    let started = Instant::now();
    match tokio::time::timeout(DEADLINE, child.wait()).await {
        Ok(status) => status.expect("wait for the child"),
        Err(_) => panic!("the {which} still runs {:?} after SIGTERM with its output closed", started.elapsed()),
    }
}

#[tokio::test]
async fn writer_and_agent_stop_on_sigterm_with_their_output_closed() {
    let cluster = TestCluster::get().await;
    let mut crds = gitops_writer::api::crds();
    crds.extend([application_crd(), app_project_crd()]);
    cluster.install_crds(crds).await.expect("install the CRDs");
    let tenant = cluster.namespace("sig-tenant").await;
    let argocd = cluster.namespace("sig-argo").await;
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    engine_instance_add(&client, "argocd-sig", argocd.name(), 10).await.expect("add the instance");
    let key = SecretBox::generate_key("k1").expect("a key");
    let env = [(config::ENCRYPTION_KEYS, key), (config::ENCRYPTION_ACTIVE_KEY, "k1".to_owned())];
    let kubeconfig = cluster.kubeconfig_path().display().to_string();
    let common = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> =
            ["run", "--database-url", &db.url(), "--kubeconfig", &kubeconfig].iter().map(|s| (*s).to_owned()).collect();
        args.extend(["--metrics-address".to_owned(), "127.0.0.1:0".to_owned()]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        args
    };

    let writer_args = common(&["--writer-id", "sig-writer", "--namespaces", tenant.name()]);
    let status = stop_with_output_closed("writer", &writer_args, &env, || async {
        let row = client
            .query_one("SELECT count(*) AS shards FROM writer_shard WHERE writer_id = 'sig-writer'", &[])
            .await
            .ok()?;
        (row.get::<_, i64>("shards") > 0).then_some(())
    })
    .await;
    assert!(status.success(), "the writer stopped cleanly: {status}");
    let row = client
        .query_one("SELECT count(*) AS shards FROM writer_shard WHERE writer_id = 'sig-writer'", &[])
        .await
        .expect("count");
    assert_eq!(row.get::<_, i64>("shards"), 0, "it gave its shards back on the way out");

    let agent_args = common(&["--instance", "argocd-sig", "--sweep-interval", "1h"]);
    let status = stop_with_output_closed("agent", &agent_args, &env, || async {
        let row = client
            .query_one("SELECT heartbeat_at IS NOT NULL AS beating FROM engine_instance WHERE name = 'argocd-sig'", &[])
            .await
            .ok()?;
        row.get::<_, bool>("beating").then_some(())
    })
    .await;
    assert!(status.success(), "the agent stopped cleanly: {status}");
}
