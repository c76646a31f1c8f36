//! `gitops-dev bench e2e`: the whole service, measured from the tenant's side. The
//! `dev` stack (PostgreSQL, the emulator, the Argo CD stand-in without resync, a
//! writer and an agent as child processes) receives D GitOpsDeployments over T
//! tenant namespaces; watches time how long until every one has its Argo CD
//! Application and until every one shows a sync status. With `--noisy N`, one
//! tenant floods N updates while quiet tenants change one deployment at a time,
//! and each quiet change is timed until its Application shows the new path. The
//! children's peak RSS closes the report, with each component's CPU seconds (see
//! `cpu`) in total and per stage (create, until every Application, until every
//! status, the noisy phase), so the next bottleneck shows.
//!
//! The stack's own peak RSS (the emulator, the stand-in and the benchmark's
//! clients) is reported with the history the emulator kept, and its heap at the
//! end before and right after the emulator forgets that history: their ratio is
//! what the history costs, read in one run. With `--minimal-history` the emulator
//! keeps as little as its clients can work with ([`MINIMAL_HISTORY`]), so a second
//! run measures the live objects' footprint under load.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt, stream};
use gitops_testkit::argocd::{StandinOptions, application_resource};
use gitops_testkit::kube_emulator::{ExpiredAnswers, HistoryWindows};
use gitops_writer::api::GitOpsDeployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cpu::{CpuSeconds, HostShare, HostTicks, own_s, process_s, tree_s};
use crate::up::{DEFAULT_INSTANCE_CAPACITY, DEV_ARGOCD_NAMESPACE, DevError, DevStack, StackShape};

/// The repository every deployment names; the stand-in never fetches it.
const REPO_URL: &str = "https://git.example.invalid/bench/repo.git";
/// Quiet changes made at least.
const QUIET_CHANGES_MIN: usize = 100;
/// How long one quiet change may take to reach its Application.
const QUIET_DEADLINE: Duration = Duration::from_secs(60);

/// The least history the service's clients work with, so a run measures what
/// the live objects cost. No watch window by age: a watch resumes only from the
/// last few events of its resource (a kube watcher resumes from its last event or
/// bookmark, so a handful covers a stream that ended; one that fell a whole
/// broadcast channel behind relists instead). Lists keep 10 s: a `continue` token
/// must outlive one paged list (the service's watchers list 500 a page, so 25,000
/// objects are 50 pages), or the list answers 410 and starts over.
/// [`E2eBenchReport::expired`] shows whether that was enough: every 410 is counted.
pub const MINIMAL_HISTORY: HistoryWindows =
    HistoryWindows { watch_age: Duration::ZERO, watch_events: 8, list_age: Duration::from_secs(10) };

/// What to run.
#[derive(Debug, Clone)]
pub struct E2eBenchConfig {
    pub tenants: usize,
    pub deployments: usize,
    /// Updates the noisy tenant makes; none: no noisy phase.
    pub noisy: Option<usize>,
    /// Requests in flight while creating and flooding.
    pub concurrency: usize,
    /// How long to wait for all Applications, and for all statuses.
    pub deadline: Duration,
    /// The run directory: kubeconfig, env file, the children's logs.
    pub dir: PathBuf,
    /// Keep only [`MINIMAL_HISTORY`] in the emulator (default: the API server's windows).
    pub minimal_history: bool,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum E2eBenchError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("could not start the service")]
    Start { source: DevError },
    #[error("a child process stopped")]
    Child { source: DevError },
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("only {got} of {want} {what} within {deadline:?}; the logs are in {dir}")]
    Timeout { what: &'static str, got: usize, want: usize, deadline: Duration, dir: PathBuf },
    #[error("the quiet change to {path} did not reach its Application within {QUIET_DEADLINE:?}")]
    QuietTimeout { path: String },
}

fn kube(step: &'static str) -> impl FnOnce(kube::Error) -> E2eBenchError {
    move |source| E2eBenchError::Kube { step, source }
}

/// Quiet-tenant latency percentiles.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

/// The figures, printed as one JSON object.
#[derive(Debug, Clone, serde::Serialize)]
pub struct E2eBenchReport {
    pub tenants: usize,
    pub deployments: usize,
    pub apply_to_argocd_s: f64,
    pub apply_to_status_s: f64,
    pub per_s: f64,
    pub quiet_tenant_latency_ms: Option<Latency>,
    pub writer_rss_mb: f64,
    pub agent_rss_mb: f64,
    /// Peak RSS of this process: the emulator, the stand-in and the benchmark's clients.
    pub stack_rss_mb: f64,
    /// The heap this process held at the end, before the stack stopped (jemalloc's
    /// `stats.allocated`).
    pub stack_heap_mb: f64,
    /// The same heap right after the emulator forgot its history (None on an
    /// existing cluster): the live objects' footprint, read in the same run.
    pub stack_live_heap_mb: Option<f64>,
    /// `stack_heap_mb` over `stack_live_heap_mb`: what the history costs.
    pub history_cost: Option<f64>,
    /// The history the emulator kept.
    pub history: HistoryReport,
    /// Watches and paged lists the emulator answered 410 Gone: history too short
    /// for its clients (each costs a relist).
    pub expired: ExpiredAnswers,
    /// CPU seconds per component from the first create to the end.
    pub cpu_s: CpuSeconds,
    /// Wall and CPU seconds per stage, in order.
    pub stages: Vec<Stage>,
    /// What counts as a deployment's status being back ([`STATUS_COUNTED_BY`]).
    pub status_counted_by: &'static str,
}

/// The emulator's history windows, as the report shows them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HistoryReport {
    /// `api-server` (the API server's windows) or `minimal` ([`MINIMAL_HISTORY`]).
    pub name: &'static str,
    pub watch_age_s: f64,
    pub watch_events: usize,
    pub list_age_s: f64,
}

impl HistoryReport {
    fn of(name: &'static str, windows: &HistoryWindows) -> HistoryReport {
        HistoryReport {
            name,
            watch_age_s: windows.watch_age.as_secs_f64(),
            watch_events: windows.watch_events,
            list_age_s: windows.list_age.as_secs_f64(),
        }
    }
}

/// One stage of the run: how long it took and where the CPU time went.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stage {
    pub name: &'static str,
    pub seconds: f64,
    pub cpu_s: CpuSeconds,
    /// The machine's steal and I/O wait over the stage.
    pub host: HostShare,
}

/// Every component's CPU seconds now.
fn cpu_now(stack: &DevStack) -> CpuSeconds {
    CpuSeconds {
        writer: process_s(stack.pid("gitops-writer")),
        agent: process_s(stack.pid("gitops-agent")),
        postgres: tree_s(stack.postgres_pid()),
        stack: own_s(),
    }
}

/// Stage boundaries: when, and the CPU seconds then (the components' and the
/// machine's).
#[derive(Debug, Default)]
struct Stages {
    marks: Vec<(&'static str, Instant, CpuSeconds, HostTicks)>,
}

impl Stages {
    fn mark(&mut self, name: &'static str, stack: &DevStack) {
        self.marks.push((name, Instant::now(), cpu_now(stack), HostTicks::now()));
    }

    /// Each stage ends at its mark and starts at the previous one (the first mark starts).
    fn stages(&self) -> Vec<Stage> {
        self.marks
            .windows(2)
            .map(|pair| Stage {
                name: pair[1].0,
                seconds: pair[1].1.duration_since(pair[0].1).as_secs_f64(),
                cpu_s: pair[1].2 - pair[0].2,
                host: pair[1].3.since(pair[0].3),
            })
            .collect()
    }

    fn total(&self) -> CpuSeconds {
        match (self.marks.first(), self.marks.last()) {
            (Some(first), Some(last)) => last.2 - first.2,
            _ => CpuSeconds::default(),
        }
    }
}

/// A deployment's status is back once it reports a health and its applied
/// generation: not its sync status, which for a manual deployment never synced
/// stays `OutOfSync` as Argo CD reports it.
pub const STATUS_COUNTED_BY: &str = "health reported and observedGeneration equal to generation (sync status not required: a never-synced manual deployment stays OutOfSync)";

/// What the watches have seen.
#[derive(Debug, Default)]
struct Seen {
    /// Applications by name.
    applications: HashSet<String>,
    /// When each `spec.source.path` first appeared on an Application.
    paths: HashMap<String, Instant>,
    /// GitOpsDeployments (namespace/name) whose status is back ([`STATUS_COUNTED_BY`]).
    synced: HashSet<String>,
}

/// Runs the benchmark; the stack is stopped whatever the outcome.
pub async fn e2e_bench(config: &E2eBenchConfig) -> Result<E2eBenchReport, E2eBenchError> {
    if config.tenants == 0 || config.deployments < config.tenants {
        return Err(E2eBenchError::Usage("need at least one tenant and a deployment per tenant"));
    }
    if config.noisy.is_some() && config.tenants < 2 {
        return Err(E2eBenchError::Usage("--noisy needs a second (quiet) tenant"));
    }
    let options = StandinOptions { resync: Duration::ZERO, ..StandinOptions::default() };
    let history = if config.minimal_history {
        HistoryReport::of("minimal", &MINIMAL_HISTORY)
    } else {
        HistoryReport::of("api-server", &HistoryWindows::default())
    };
    let shape = StackShape {
        // One instance takes every tenant of the run, however many.
        instance_capacity: i32::try_from(config.tenants).unwrap_or(i32::MAX).max(DEFAULT_INSTANCE_CAPACITY),
        history: if config.minimal_history { MINIMAL_HISTORY } else { HistoryWindows::default() },
        ..StackShape::default()
    };
    let mut stack =
        DevStack::start_shaped(&config.dir, options, &shape).await.map_err(|source| E2eBenchError::Start { source })?;
    eprintln!("service up; run directory {}", stack.info.dir.display());
    let cancel = CancellationToken::new();
    let mut stages = Stages::default();
    let outcome = measure(config, &mut stack, &cancel, &mut stages).await;
    let writer_rss_mb = stack.pid("gitops-writer").map(peak_rss_mb).unwrap_or_default();
    let agent_rss_mb = stack.pid("gitops-agent").map(peak_rss_mb).unwrap_or_default();
    let stack_rss_mb = peak_rss_mb(std::process::id());
    let stack_heap_mb = mb(gitops_shared::process::ProcessStats::current().heap_allocated_bytes);
    let expired = stack.expired_answers().unwrap_or_default();
    crate::heap_profile::dump(&config.dir, "end");
    // Read at once: a watch that resumes from an older version now relists, and
    // its list would count as live.
    let stack_live_heap_mb =
        stack.compact_history().then(|| mb(gitops_shared::process::ProcessStats::current().heap_allocated_bytes));
    let history_cost = stack_live_heap_mb.filter(|live| *live > 0.0).map(|live| stack_heap_mb / live);
    cancel.cancel();
    stack.stop().await;
    let (apply_to_argocd_s, apply_to_status_s, quiet_tenant_latency_ms) = outcome?;
    Ok(E2eBenchReport {
        tenants: config.tenants,
        deployments: config.deployments,
        apply_to_argocd_s,
        apply_to_status_s,
        per_s: config.deployments as f64 / apply_to_status_s,
        quiet_tenant_latency_ms,
        writer_rss_mb,
        agent_rss_mb,
        stack_rss_mb,
        stack_heap_mb,
        stack_live_heap_mb,
        history_cost,
        history,
        expired,
        cpu_s: stages.total(),
        stages: stages.stages(),
        status_counted_by: STATUS_COUNTED_BY,
    })
}

type Measured = (f64, f64, Option<Latency>);

async fn measure(
    config: &E2eBenchConfig,
    stack: &mut DevStack,
    cancel: &CancellationToken,
    stages: &mut Stages,
) -> Result<Measured, E2eBenchError> {
    let client = stack.kube.clone();
    let (seen_tx, seen) = watch::channel(Seen::default());
    let seen_tx = std::sync::Arc::new(seen_tx);
    tokio::spawn(watch_applications(client.clone(), seen_tx.clone(), cancel.clone()));
    tokio::spawn(watch_deployments(client.clone(), seen_tx, cancel.clone()));

    let namespaces: Vec<String> = (0..config.tenants).map(|t| format!("bench-t{t:04}")).collect();
    stream::iter(namespaces.iter().map(|name| create_namespace(&client, name)))
        .buffer_unordered(config.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!("{} namespaces created; creating {} GitOpsDeployments", config.tenants, config.deployments);

    let deployments: Vec<(String, String)> =
        (0..config.deployments).map(|d| (namespaces[d % config.tenants].clone(), format!("d{d:05}"))).collect();
    let started = Instant::now();
    stages.mark("start", stack);
    stream::iter(deployments.iter().map(|(namespace, name)| create_deployment(&client, namespace, name)))
        .buffer_unordered(config.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    eprintln!("created in {:.1}s", started.elapsed().as_secs_f64());
    stages.mark("create", stack);

    let want = config.deployments;
    let applied = wait(stack, config, seen.clone(), "Applications", |s| s.applications.len(), want).await?;
    stages.mark("to_argocd", stack);
    let apply_to_argocd_s = applied.duration_since(started).as_secs_f64();
    eprintln!("every Application in Argo CD after {apply_to_argocd_s:.2}s");
    let statused = wait(stack, config, seen.clone(), "sync statuses", |s| s.synced.len(), want).await?;
    stages.mark("to_status", stack);
    let apply_to_status_s = statused.duration_since(started).as_secs_f64();
    eprintln!("every sync status back after {apply_to_status_s:.2}s");

    let latency = match config.noisy {
        None => None,
        Some(updates) => Some(noisy_phase(config, stack, &deployments, &namespaces[0], updates, seen).await?),
    };
    if latency.is_some() {
        stages.mark("noisy", stack);
    }
    Ok((apply_to_argocd_s, apply_to_status_s, latency))
}

/// Waits until `count` reaches `want`; returns when (see [`super::wait_until`]).
async fn wait(
    stack: &mut DevStack,
    config: &E2eBenchConfig,
    seen: watch::Receiver<Seen>,
    what: &'static str,
    count: fn(&Seen) -> usize,
    want: usize,
) -> Result<Instant, E2eBenchError> {
    let progress = |s: &Seen| format!("{} Applications, {} sync statuses", s.applications.len(), s.synced.len());
    super::wait_until(stack, config.deadline, seen, count, want, progress).await.map_err(|failed| match failed {
        super::WaitFailed::Child(source) => E2eBenchError::Child { source },
        super::WaitFailed::Deadline { got } => {
            E2eBenchError::Timeout { what, got, want, deadline: config.deadline, dir: stack.info.dir.clone() }
        }
    })
}

/// The noisy tenant floods `updates` path changes while quiet tenants change one
/// deployment at a time; returns the quiet changes' latency.
async fn noisy_phase(
    config: &E2eBenchConfig,
    stack: &mut DevStack,
    deployments: &[(String, String)],
    noisy_namespace: &str,
    updates: usize,
    mut seen: watch::Receiver<Seen>,
) -> Result<Latency, E2eBenchError> {
    let client = stack.kube.clone();
    let (noisy, quiet): (Vec<_>, Vec<_>) = deployments.iter().partition(|(namespace, _)| namespace == noisy_namespace);
    eprintln!("noisy tenant {noisy_namespace}: {updates} updates over {} deployments", noisy.len());
    let flood = {
        let client = client.clone();
        let noisy: Vec<(String, String)> = noisy.into_iter().cloned().collect();
        let concurrency = config.concurrency;
        tokio::spawn(async move {
            stream::iter((0..updates).map(|k| {
                let (namespace, name) = &noisy[k % noisy.len()];
                let path = format!("noisy/{name}/{k}");
                let client = client.clone();
                async move { set_path(&client, namespace, name, &path).await }
            }))
            .buffer_unordered(concurrency)
            .try_collect::<Vec<()>>()
            .await
        })
    };
    let flood_started = Instant::now();
    let mut latencies = Vec::new();
    let mut flood_done = false;
    let mut next = 0;
    while !flood_done || latencies.len() < QUIET_CHANGES_MIN {
        if !flood_done && flood.is_finished() {
            let sent_s = flood_started.elapsed().as_secs_f64();
            eprintln!("flood of {updates} updates sent in {sent_s:.1}s; {} quiet changes during it", latencies.len());
            flood_done = true;
        }
        let (namespace, name) = quiet[next % quiet.len()];
        let path = format!("quiet/{namespace}/{name}/{next}");
        next += 1;
        let sent = Instant::now();
        set_path(&client, namespace, name, &path).await?;
        let shown = tokio::time::timeout(QUIET_DEADLINE, seen.wait_for(|s| s.paths.contains_key(&path))).await;
        let at = match shown {
            Ok(Ok(s)) => s.paths.get(&path).copied().unwrap_or_else(Instant::now),
            _ => {
                stack.check_children().map_err(|source| E2eBenchError::Child { source })?;
                return Err(E2eBenchError::QuietTimeout { path });
            }
        };
        latencies.push(at.saturating_duration_since(sent).as_secs_f64() * 1000.0);
        if latencies.len() % 25 == 0 {
            eprintln!("  {} quiet changes", latencies.len());
        }
    }
    match flood.await {
        Ok(result) => drop(result?),
        Err(join) => eprintln!("the flood task failed: {join}"),
    }
    eprintln!("{} quiet changes measured", latencies.len());
    latencies.sort_by(f64::total_cmp);
    Ok(Latency { p50: percentile(&latencies, 0.50), p99: percentile(&latencies, 0.99) })
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn watch_applications(
    client: kube::Client,
    seen: std::sync::Arc<watch::Sender<Seen>>,
    cancel: CancellationToken,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, DEV_ARGOCD_NAMESPACE, &application_resource());
    super::for_each_applied(api, cancel, "Application", |app| {
        let now = Instant::now();
        let path = app.data.pointer("/spec/source/path").and_then(|p| p.as_str()).map(str::to_owned);
        seen.send_modify(|s| {
            if let Some(name) = app.metadata.name {
                s.applications.insert(name);
            }
            if let Some(path) = path {
                s.paths.entry(path).or_insert(now);
            }
        });
    })
    .await;
}

async fn watch_deployments(client: kube::Client, seen: std::sync::Arc<watch::Sender<Seen>>, cancel: CancellationToken) {
    let api: Api<GitOpsDeployment> = Api::all(client);
    super::for_each_applied(api, cancel, "GitOpsDeployment", |object| {
        let synced = object.status.as_ref().is_some_and(|status| {
            status.health.as_ref().is_some_and(|health| !health.status.is_empty())
                && status.observed_generation.is_some()
                && status.observed_generation == object.metadata.generation
        });
        if synced {
            let key = format!(
                "{}/{}",
                object.metadata.namespace.unwrap_or_default(),
                object.metadata.name.unwrap_or_default()
            );
            seen.send_if_modified(|s| s.synced.insert(key));
        }
    })
    .await;
}

pub(crate) async fn create_namespace(client: &kube::Client, name: &str) -> Result<(), E2eBenchError> {
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).map_err(|_| E2eBenchError::Usage("namespace"))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(kube("create a namespace"))?;
    Ok(())
}

pub(crate) async fn create_deployment(client: &kube::Client, namespace: &str, name: &str) -> Result<(), E2eBenchError> {
    let object: GitOpsDeployment = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeployment",
        "metadata": {"name": name},
        "spec": {"source": {"repoURL": REPO_URL, "path": format!("apps/{namespace}/{name}")},
                 "destination": {}, "type": "automated"},
    }))
    .map_err(|_| E2eBenchError::Usage("GitOpsDeployment"))?;
    Api::<GitOpsDeployment>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &object)
        .await
        .map_err(kube("create a GitOpsDeployment"))?;
    Ok(())
}

pub(crate) async fn set_path(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    path: &str,
) -> Result<(), E2eBenchError> {
    let patch = json!({"spec": {"source": {"path": path}}});
    let api = Api::<GitOpsDeployment>::namespaced(client.clone(), namespace);
    // A patch meets a conflict only when others write the object faster than the API
    // server can re-apply it (kube-apiserver gives up after five tries), as the noisy
    // tenant's flood does: a tenant's client tries again, and so does this one.
    let mut conflicts = 0;
    loop {
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 && conflicts < SET_PATH_CONFLICTS => {
                conflicts += 1;
                tokio::time::sleep(Duration::from_millis(10 * conflicts)).await;
            }
            Err(error) => return Err(kube("update a GitOpsDeployment")(error)),
        }
    }
}

/// How often [`set_path`] tries again after a conflict.
const SET_PATH_CONFLICTS: u64 = 20;

/// Peak resident set size (VmHWM) of a process, in MiB; 0 if unreadable.
pub(crate) fn peak_rss_mb(pid: u32) -> f64 {
    mb(gitops_shared::process::ProcessStats::of_pid(&pid.to_string()).peak_resident_bytes)
}

/// Bytes in MiB; 0 if unknown.
fn mb(bytes: Option<u64>) -> f64 {
    bytes.map_or(0.0, |bytes| bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.50), 50.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn our_own_peak_rss_is_read() {
        assert!(peak_rss_mb(std::process::id()) > 0.0);
    }
}
