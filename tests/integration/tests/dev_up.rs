//! `gitops-dev up` end to end, as the README's walk-through runs it: two stacks side
//! by side (each child on ports of its own), the ready summary, then, with the
//! environment file of one of them, ordinary kubectl habits — `create namespace`,
//! `apply`, `wait --for=condition=Ready`, `get` (the server's columns), `explain`,
//! `get events`, a server-side dry run — and a clean stop on SIGTERM. The binaries
//! are the ones built next to this test binary (`cargo build --bins`, as `ops/test`
//! does); the test is skipped, saying so, without kubectl.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a stack may take to print `ready` (PostgreSQL, emulator, children).
const READY_DEADLINE: Duration = Duration::from_secs(240);

pub(crate) fn binary_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // target/<profile>/deps/integration-… → target/<profile>
    exe.parent().and_then(Path::parent).expect("the target directory").to_owned()
}

/// Fails, saying what to run, unless the stack's binaries are built in `bin`.
pub(crate) fn assert_binaries_built(bin: &Path) {
    for binary in ["gitops-dev", "gitops-writer", "gitops-agent", "gitops-appstudio"] {
        assert!(
            bin.join(binary).is_file(),
            "{binary} is not built in {}: run `cargo build --bins` first",
            bin.display()
        );
    }
}

pub(crate) struct Stack {
    child: Child,
    pub(crate) dir: PathBuf,
    summary: Vec<String>,
}

impl Stack {
    /// SIGTERM, then its exit status (it stops its children, the emulator and
    /// PostgreSQL first).
    pub(crate) async fn stop(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().expect("running").to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status().await;
        tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await.expect("stops in time").expect("wait")
    }
}

/// A stack left running by a failed test is asked to stop (SIGTERM: it stops what it
/// started).
impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        }
    }
}

/// Starts `gitops-dev up` in a fresh directory and reads its stdout up to the end of
/// the ready summary.
pub(crate) async fn start_stack(bin: &Path, name: &str) -> Stack {
    let dir = std::env::temp_dir().join(format!("gitops-dev-up-{name}-{}", uuid::Uuid::new_v4().simple()));
    let mut child = Command::new(bin.join("gitops-dev"))
        .args(["up", "--dir"])
        .arg(&dir)
        .env_remove("GITOPS_DEV_VERBOSE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gitops-dev up");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let read = async {
        let mut summary = Vec::new();
        let mut ready = false;
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if line == "ready" {
                ready = true;
                continue;
            }
            if ready {
                let done = line.starts_with("database");
                summary.push(line);
                if done {
                    return summary;
                }
            }
        }
        panic!("gitops-dev up ended before it was ready (log in {})", dir.display());
    };
    let summary = tokio::time::timeout(READY_DEADLINE, read).await.expect("gitops-dev up ready in time");
    Stack { child, dir, summary }
}

/// The `NAME=value` lines of the env file.
pub(crate) fn env_file(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .expect("read the env file")
        .lines()
        .filter_map(|line| line.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

pub(crate) async fn kubectl(
    env: &HashMap<String, String>,
    cache: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    let mut command = Command::new("kubectl");
    command.envs(env).arg("--cache-dir").arg(cache).args(args);
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = command.spawn().expect("run kubectl");
    if let Some(input) = stdin {
        use tokio::io::AsyncWriteExt as _;
        let mut pipe = child.stdin.take().expect("stdin");
        pipe.write_all(input.as_bytes()).await.expect("write stdin");
    }
    let output = child.wait_with_output().await.expect("kubectl output");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

pub(crate) async fn kubectl_ok(
    env: &HashMap<String, String>,
    cache: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> String {
    let (ok, stdout, stderr) = kubectl(env, cache, args, stdin).await;
    assert!(ok, "kubectl {args:?} failed: {stderr}\n{stdout}");
    stdout
}

/// GET on loopback; the status code.
async fn http_status(url: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (address, path) = rest.split_once('/').map(|(a, p)| (a, format!("/{p}"))).unwrap_or((rest, "/".into()));
    assert!(address.starts_with("127.0.0.1:"), "loopback only: {url}");
    let mut stream = tokio::net::TcpStream::connect(address).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response).await;
    response.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// The URL after `label` on the summary line of `component`.
fn url_of(summary: &[String], component: &str, label: &str) -> String {
    let line =
        summary.iter().find(|l| l.starts_with(component)).unwrap_or_else(|| panic!("{component} in {summary:?}"));
    let mut words = line.split_whitespace();
    words.find(|w| *w == label).and_then(|_| words.next()).unwrap_or_else(|| panic!("{label} in {line}")).to_owned()
}

const DEPLOYMENT: &str = "apiVersion: managed-gitops.redhat.com/v1alpha1
kind: GitOpsDeployment
metadata: {name: demo, namespace: team-a}
spec:
  source: {repoURL: https://git.example.invalid/team-a/config.git, path: apps/demo}
  destination: {namespace: team-a}
  type: automated
";

const ENVIRONMENT: &str = "apiVersion: v1
kind: Secret
metadata: {name: staging-cluster, namespace: team-a}
type: managed-gitops.redhat.com/managed-environment
stringData: {kubeconfig: not-a-real-kubeconfig}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: Environment
metadata: {name: staging, namespace: team-a}
spec:
  displayName: Staging
  deploymentStrategy: AppStudioAutomated
  configuration: {target: {deploymentTargetClaim: {claimName: \"\"}}}
  unstableConfigurationFields:
    targetNamespace: staging
    apiURL: https://cluster.example.invalid:6443
    clusterCredentialsSecret: staging-cluster
    allowInsecureSkipTLSVerify: false
";

#[tokio::test]
async fn dev_up_runs_side_by_side_and_answers_the_readme_walkthrough() {
    if !std::process::Command::new("kubectl").args(["version", "--client"]).output().is_ok_and(|o| o.status.success()) {
        eprintln!("kubectl is not installed: the gitops-dev up walk-through was skipped");
        return;
    }
    let bin = binary_dir();
    assert_binaries_built(&bin);
    let (first, second) = tokio::join!(start_stack(&bin, "a"), start_stack(&bin, "b"));
    let mut first = first;

    // Each child on a port of its own, each answering.
    let mut urls = Vec::new();
    for stack in [&first, &second] {
        for component in ["gitops-writer", "gitops-agent", "gitops-appstudio"] {
            let metrics = url_of(&stack.summary, component, "metrics");
            let health = url_of(&stack.summary, component, "health");
            assert_eq!(http_status(&metrics).await, 200, "{metrics}");
            assert_eq!(http_status(&health).await, 200, "{health}");
            let log = url_of(&stack.summary, component, "log");
            assert!(Path::new(&log).is_file(), "{component}'s log {log}");
            urls.push(metrics);
        }
    }
    let distinct: std::collections::HashSet<&String> = urls.iter().collect();
    assert_eq!(distinct.len(), urls.len(), "every child has its own port: {urls:?}");
    let mut second = second;
    assert!(second.stop().await.success());
    let _ = std::fs::remove_dir_all(&second.dir);

    // Quiet: the in-process components log into a file, not on stderr.
    let log = std::fs::read_to_string(first.dir.join("gitops-dev.log")).expect("gitops-dev.log");
    assert!(log.contains("Argo CD stand-in started"), "{log}");

    // The walk-through, with the env file.
    let env = env_file(&first.dir.join("env"));
    assert!(env.contains_key("KUBECONFIG") && env.contains_key("DATABASE_URL"), "{env:?}");
    let cache = first.dir.join("kubectl-cache");
    let out = kubectl_ok(&env, &cache, &["create", "namespace", "team-a"], None).await;
    assert!(out.contains("namespace/team-a created"), "{out}");
    kubectl_ok(&env, &cache, &["apply", "-f", "-"], Some(DEPLOYMENT)).await;
    kubectl_ok(
        &env,
        &cache,
        &["wait", "--for=condition=Ready", "gitopsdeployment/demo", "-n", "team-a", "--timeout=120s"],
        None,
    )
    .await;
    let table = kubectl_ok(&env, &cache, &["get", "gitopsdeployments", "-A"], None).await;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAMESPACE", "NAME", "SYNC", "STATUS", "HEALTH", "STATUS", "READY", "AGE"], "{table}");
    assert!(
        table.lines().any(|l| l.split_whitespace().take(5).eq(["team-a", "demo", "Synced", "Healthy", "True"])),
        "{table}"
    );
    let apps =
        kubectl_ok(&env, &cache, &["get", "applications.argoproj.io", "-n", "argocd", "--no-headers"], None).await;
    assert_eq!(apps.lines().count(), 1, "{apps}");
    let explained = kubectl_ok(&env, &cache, &["explain", "gitopsdeployment.spec"], None).await;
    assert!(explained.contains("source") && explained.contains("destination"), "{explained}");
    kubectl_ok(&env, &cache, &["get", "events", "-A"], None).await;
    let dry = DEPLOYMENT.replace("name: demo", "name: rehearsal");
    let out = kubectl_ok(&env, &cache, &["apply", "--dry-run=server", "-f", "-"], Some(&dry)).await;
    assert!(out.contains("created (server dry run)"), "{out}");
    let (found, ..) = kubectl(&env, &cache, &["get", "gitopsdeployment", "rehearsal", "-n", "team-a"], None).await;
    assert!(!found, "a server-side dry run stored nothing");

    // The AppStudio layer runs too: an Environment becomes a ManagedEnvironment.
    kubectl_ok(&env, &cache, &["apply", "-f", "-"], Some(ENVIRONMENT)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let args = ["get", "gitopsdeploymentmanagedenvironment", "managed-environment-staging", "-n", "team-a"];
        if kubectl(&env, &cache, &args, None).await.0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no ManagedEnvironment for the Environment in time");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let envs = kubectl_ok(&env, &cache, &["get", "env", "-n", "team-a", "--no-headers"], None).await;
    assert!(envs.starts_with("staging"), "the short name `env` works: {envs}");

    // Ctrl-C or SIGTERM stops everything.
    let status = first.stop().await;
    assert!(status.success(), "gitops-dev up exited with {status}");
    let mut stderr = String::new();
    if let Some(mut pipe) = first.child.stderr.take() {
        use tokio::io::AsyncReadExt as _;
        let _ = pipe.read_to_string(&mut stderr).await;
    }
    assert!(!stderr.contains("status written"), "stand-in logs stay out of stderr: {stderr}");
    let _ = std::fs::remove_dir_all(&first.dir);
}
