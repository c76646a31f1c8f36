//! `gitops-dev bench soak`: memory through a long stretch of ordinary churn. The
//! `dev` stack (PostgreSQL, the emulator and the Argo CD stand-in in this process,
//! a writer and an agent as child processes) receives T tenants × N
//! GitOpsDeployments; once every one is Ready, tenants keep working through the
//! Kubernetes API for M minutes — C path changes every few seconds, R deletions
//! each with a new deployment in its place every minute — while every sample
//! interval records each process's resident memory (now, and its peak since the
//! previous sample: the peak is reset after each reading), heap in use
//! (the allocator's statistics), threads and open files, the operation queue by
//! state and the sizes of the service's tables. Then the service must converge
//! (every deployment Ready with its Application at the wanted path, nothing
//! failed, nothing queued).
//!
//! The verdict per process: the largest resident memory in each sweep interval
//! (the peaks since each previous sample, so a rise between two samples counts),
//! from the one that starts once the service settled (minute 5, or a quarter of a
//! shorter run) to the last; memory is flat when the last grew at most 10% over
//! the first. The local stack (this process) is judged the same way.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt, stream};
use gitops_shared::process::{ProcessStats, reset_peak_resident};
use gitops_testkit::argocd::StandinOptions;
use gitops_testkit::random::Random;
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DeleteParams};
use serde::Serialize;

use super::chaos::{Wanted, converge, failed_operations};
use super::e2e::{E2eBenchError, create_deployment, create_namespace, set_path};
use crate::up::{DevError, DevStack, StackShape};

/// The most a process's memory may grow from the settled interval to the last.
const FLAT_GROWTH: f64 = 0.10;
/// When the service counts as settled in a long run.
const SETTLED_AFTER: Duration = Duration::from_secs(300);

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakBenchConfig {
    pub tenants: usize,
    /// GitOpsDeployments per tenant.
    pub per_tenant: usize,
    /// How long the churn goes on.
    pub duration: Duration,
    /// Path changes per round, and how often a round comes.
    pub changes: usize,
    pub change_every: Duration,
    /// Deployments deleted (each replaced by a new one) per round, and how often.
    pub recreates: usize,
    pub recreate_every: Duration,
    /// The agent's sweep interval (the memory verdict's window).
    pub sweep_every: Duration,
    pub sample_every: Duration,
    /// The agent's `--completed-retention` (None: its default).
    pub completed_retention: Option<Duration>,
    /// Replays a run's choices; random when None.
    pub seed: Option<u64>,
    /// How long to wait for the first convergence, and the last.
    pub deadline: Duration,
    pub dir: PathBuf,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum SoakBenchError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("could not start the service")]
    Start { source: DevError },
    #[error("a child process stopped")]
    Child { source: DevError },
    #[error("a tenant's request failed")]
    Tenant { source: E2eBenchError },
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("the deployments were not all Ready within {deadline:?}; logs in {dir}")]
    NotReady { deadline: Duration, dir: PathBuf },
}

/// One process's resources at one sample.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessSample {
    pub resident_mb: Option<f64>,
    /// The largest resident memory since the previous sample.
    pub peak_since_last_sample_mb: Option<f64>,
    pub heap_mb: Option<f64>,
    pub threads: Option<u64>,
    pub open_fds: Option<u64>,
}

/// Everything read at one sample.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds since the churn started.
    pub t_s: f64,
    /// `gitops-writer`, `gitops-agent` and `stack` (this process: the emulator and the stand-in).
    pub processes: BTreeMap<String, ProcessSample>,
    /// Operations by state.
    pub operations: BTreeMap<String, i64>,
    /// Total size (with indexes and TOAST) of the service's largest tables, in kB.
    pub tables_kb: BTreeMap<String, i64>,
}

/// One process's memory over the run.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryVerdict {
    /// The largest resident memory of each sweep interval, from the settled one on (MB).
    pub max_resident_per_interval_mb: Vec<f64>,
    /// Growth of the last interval's maximum over the settled one's (0.05 = 5%).
    pub growth: Option<f64>,
    pub flat: bool,
    /// The largest resident memory of the whole run.
    pub peak_resident_mb: Option<f64>,
    pub last_heap_mb: Option<f64>,
}

/// What the benchmark prints.
#[derive(Debug, Clone, Serialize)]
pub struct SoakBenchReport {
    pub seed: u64,
    pub tenants: usize,
    pub deployments: usize,
    pub minutes: f64,
    pub sweep_interval_s: f64,
    pub completed_retention_s: Option<f64>,
    pub changes: usize,
    pub recreates: usize,
    /// Seconds from the churn's start that count as settled.
    pub settled_after_s: f64,
    pub memory: BTreeMap<String, MemoryVerdict>,
    /// Seconds after the churn until the service converged (None: not within the deadline).
    pub converge_s: Option<f64>,
    pub lost: usize,
    pub duplicated: usize,
    pub stale: usize,
    pub failed_operations: i64,
    /// Operations waiting or claimed at the end.
    pub queued_at_end: i64,
    pub samples: Vec<Sample>,
}

fn kube_step(step: &'static str) -> impl FnOnce(kube::Error) -> SoakBenchError {
    move |source| SoakBenchError::Kube { step, source }
}

/// Starts the stack, soaks it and stops it.
pub async fn soak_bench(config: &SoakBenchConfig) -> Result<SoakBenchReport, SoakBenchError> {
    if config.tenants == 0 || config.per_tenant == 0 {
        return Err(SoakBenchError::Usage("need at least one tenant with one deployment"));
    }
    if config.sample_every.is_zero() || config.sweep_every.is_zero() {
        return Err(SoakBenchError::Usage("the sample and sweep intervals must be positive"));
    }
    let seconds = |d: Duration| format!("{}ms", d.as_millis());
    let mut agent_env = vec![("GITOPS_AGENT_SWEEP_INTERVAL".to_owned(), seconds(config.sweep_every))];
    if let Some(retention) = config.completed_retention {
        agent_env.push(("GITOPS_AGENT_COMPLETED_RETENTION".to_owned(), seconds(retention)));
    }
    let shape = StackShape { webhook: false, agent_env, ..StackShape::default() };
    let mut stack = DevStack::start_shaped(&config.dir, StandinOptions::default(), &shape)
        .await
        .map_err(|source| SoakBenchError::Start { source })?;
    eprintln!("service up; run directory {}", stack.info.dir.display());
    let outcome = run(config, &mut stack).await;
    stack.stop().await;
    outcome
}

async fn run(config: &SoakBenchConfig, stack: &mut DevStack) -> Result<SoakBenchReport, SoakBenchError> {
    let seed = config.seed.unwrap_or_else(Random::fresh_seed);
    eprintln!("seed {seed}");
    let mut random = Random::new(seed);
    let client = stack.kube.clone();
    let namespaces: Vec<String> = (0..config.tenants).map(|t| format!("soak-t{t:04}")).collect();
    stream::iter(namespaces.iter().map(|name| create_namespace(&client, name)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| SoakBenchError::Tenant { source })?;
    let mut wanted: Wanted = namespaces
        .iter()
        .flat_map(|namespace| {
            (0..config.per_tenant).map(move |d| {
                let name = format!("d{d:03}");
                ((namespace.clone(), name.clone()), format!("apps/{namespace}/{name}"))
            })
        })
        .collect();
    stream::iter(wanted.keys().map(|(namespace, name)| create_deployment(&client, namespace, name)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| SoakBenchError::Tenant { source })?;
    eprintln!("{} deployments created; waiting until every one is Ready", wanted.len());
    if converge(&client, &wanted, config.deadline).await.0.is_none() {
        return Err(SoakBenchError::NotReady { deadline: config.deadline, dir: stack.info.dir.clone() });
    }

    let metrics: BTreeMap<String, String> = stack
        .info
        .components
        .iter()
        .filter(|c| c.name.starts_with("gitops-writer") || c.name.starts_with("gitops-agent"))
        .map(|c| (c.name.clone(), c.metrics_url.clone()))
        .collect();
    let database = gitops_shared::db::connect(&stack.info.database_url, "gitops-dev-bench")
        .await
        .map_err(|_| SoakBenchError::Usage("could not connect to the stack's database"))?;
    eprintln!("churn for {:?}", config.duration);
    let started = Instant::now();
    let mut samples = Vec::new();
    let (mut next_change, mut next_recreate, mut next_sample) = (Duration::ZERO, config.recreate_every, Duration::ZERO);
    let (mut round, mut made) = (0usize, 0usize);
    while started.elapsed() < config.duration {
        stack.check_children().map_err(|source| SoakBenchError::Child { source })?;
        let now = started.elapsed();
        if now >= next_sample {
            let sample = sample(stack, &metrics, &database, now).await;
            eprintln!("  {:.0}s: {}", now.as_secs_f64(), summary(&sample));
            samples.push(sample);
            next_sample += config.sample_every;
        }
        if now >= next_change {
            round += 1;
            change_paths(&client, &mut wanted, &mut random, round, config.changes).await?;
            next_change += config.change_every;
        }
        if now >= next_recreate {
            made = recreate(&client, &mut wanted, &mut random, made, config.recreates).await?;
            next_recreate += config.recreate_every;
        }
        let next = next_sample.min(next_change).min(next_recreate);
        tokio::time::sleep(next.saturating_sub(started.elapsed()).min(Duration::from_secs(1))).await;
    }
    let churned = started.elapsed();
    samples.push(sample(stack, &metrics, &database, churned).await);
    eprintln!("churn over after {round} rounds; waiting for convergence");
    let (converge_s, misses) = converge(&client, &wanted, config.deadline).await;
    let queued_at_end = queued(&database, config.deadline).await;
    let settled = SETTLED_AFTER.min(config.duration / 4);
    let names: Vec<String> = samples.first().map(|s| s.processes.keys().cloned().collect()).unwrap_or_default();
    let memory = names
        .into_iter()
        .map(|name| {
            let verdict = verdict(&samples, &name, settled, config.sweep_every);
            (name, verdict)
        })
        .collect();
    Ok(SoakBenchReport {
        seed,
        tenants: config.tenants,
        deployments: wanted.len(),
        minutes: churned.as_secs_f64() / 60.0,
        sweep_interval_s: config.sweep_every.as_secs_f64(),
        completed_retention_s: config.completed_retention.map(|d| d.as_secs_f64()),
        changes: round * config.changes,
        recreates: made,
        settled_after_s: settled.as_secs_f64(),
        memory,
        converge_s,
        lost: misses.lost,
        duplicated: misses.duplicated,
        stale: misses.stale,
        failed_operations: failed_operations(&stack.info.database_url).await,
        queued_at_end,
        samples,
    })
}

/// A round of path changes over `changes` deployments chosen at random.
async fn change_paths(
    client: &kube::Client,
    wanted: &mut Wanted,
    random: &mut Random,
    round: usize,
    changes: usize,
) -> Result<(), SoakBenchError> {
    let keys: Vec<(String, String)> = wanted.keys().cloned().collect();
    let mut chosen = BTreeMap::new();
    while chosen.len() < changes.min(keys.len()) {
        let (namespace, name) = keys[random.below(keys.len())].clone();
        let path = format!("apps/{namespace}/{name}/v{round}");
        chosen.insert((namespace, name), path);
    }
    stream::iter(chosen.iter().map(|((namespace, name), path)| set_path(client, namespace, name, path)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| SoakBenchError::Tenant { source })?;
    wanted.extend(chosen);
    Ok(())
}

/// Deletes `count` deployments chosen at random, each replaced by a new one in its
/// namespace; returns how many were made so far.
async fn recreate(
    client: &kube::Client,
    wanted: &mut Wanted,
    random: &mut Random,
    mut made: usize,
    count: usize,
) -> Result<usize, SoakBenchError> {
    for _ in 0..count.min(wanted.len()) {
        let keys: Vec<(String, String)> = wanted.keys().cloned().collect();
        let (namespace, name) = keys[random.below(keys.len())].clone();
        Api::<GitOpsDeployment>::namespaced(client.clone(), &namespace)
            .delete(&name, &DeleteParams::default())
            .await
            .map_err(kube_step("delete a GitOpsDeployment"))?;
        wanted.remove(&(namespace.clone(), name));
        made += 1;
        let name = format!("r{made:05}");
        create_deployment(client, &namespace, &name).await.map_err(|source| SoakBenchError::Tenant { source })?;
        wanted.insert((namespace.clone(), name.clone()), format!("apps/{namespace}/{name}"));
    }
    Ok(made)
}

fn mb(bytes: Option<u64>) -> Option<f64> {
    bytes.map(|b| b as f64 / (1024.0 * 1024.0))
}

fn process_sample(stats: ProcessStats) -> ProcessSample {
    ProcessSample {
        resident_mb: mb(stats.resident_bytes),
        peak_since_last_sample_mb: mb(stats.peak_resident_bytes),
        heap_mb: mb(stats.heap_allocated_bytes),
        threads: stats.threads,
        open_fds: stats.open_fds,
    }
}

async fn sample(
    stack: &DevStack,
    metrics: &BTreeMap<String, String>,
    database: &tokio_postgres::Client,
    at: Duration,
) -> Sample {
    let mut processes = BTreeMap::new();
    processes.insert("stack".to_owned(), process_sample(ProcessStats::current()));
    // Each peak is read, then started afresh: the next sample's is the largest since.
    // (Where it cannot be reset, the peak is the run's so far.)
    let _ = reset_peak_resident("self");
    for binary in ["gitops-writer", "gitops-agent"] {
        let Some(pid) = stack.pid(binary) else { continue };
        let mut stats = ProcessStats::of_pid(&pid.to_string());
        let _ = reset_peak_resident(&pid.to_string());
        if let Some((_, url)) = metrics.iter().find(|(name, _)| name.starts_with(binary)) {
            stats.heap_allocated_bytes = super::scrape(url, "process_heap_allocated_bytes").await.map(|v| v as u64);
        }
        processes.insert(binary.to_owned(), process_sample(stats));
    }
    let operations = database
        .query(
            "SELECT state::text, count(*) FROM operation GROUP BY state
             UNION ALL SELECT state::text, count(*) FROM operation_history GROUP BY state",
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1))).collect())
        .unwrap_or_default();
    let tables_kb = database
        .query(
            "SELECT relname::text, (pg_total_relation_size(relid) / 1024)::bigint FROM pg_stat_user_tables
              ORDER BY pg_total_relation_size(relid) DESC LIMIT 8",
            &[],
        )
        .await
        .map(|rows| rows.iter().map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1))).collect())
        .unwrap_or_default();
    Sample { t_s: at.as_secs_f64(), processes, operations, tables_kb }
}

fn summary(sample: &Sample) -> String {
    let mut parts: Vec<String> = sample
        .processes
        .iter()
        .map(|(name, p)| format!("{name} {:.1} MB", p.resident_mb.unwrap_or_default()))
        .collect();
    parts.push(format!("operations {:?}", sample.operations));
    parts.join(", ")
}

/// Waits until nothing is waiting or claimed; what is left at the deadline.
async fn queued(database: &tokio_postgres::Client, deadline: Duration) -> i64 {
    let started = Instant::now();
    loop {
        let left = database
            .query_one("SELECT count(*) FROM operation WHERE state IN ('waiting', 'claimed')", &[])
            .await
            .map_or(-1, |row| row.get::<_, i64>(0));
        if left == 0 || started.elapsed() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The largest resident memory a sample saw: its peak since the previous sample, or
/// the reading itself.
fn largest(process: &ProcessSample) -> Option<f64> {
    match (process.resident_mb, process.peak_since_last_sample_mb) {
        (Some(now), Some(peak)) => Some(now.max(peak)),
        (now, peak) => now.or(peak),
    }
}

/// Process `name`'s memory over the run: the largest resident memory of each sweep
/// interval from `settled` on, and whether the last grew at most [`FLAT_GROWTH`].
pub fn verdict(samples: &[Sample], name: &str, settled: Duration, interval: Duration) -> MemoryVerdict {
    // window → (largest reading, readings)
    let mut windows: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
    let (settled_s, interval_s) = (settled.as_secs_f64(), interval.as_secs_f64().max(1e-3));
    for sample in samples.iter().filter(|s| s.t_s >= settled_s) {
        let Some(process) = sample.processes.get(name) else { continue };
        let Some(rss) = largest(process) else { continue };
        let window = ((sample.t_s - settled_s) / interval_s) as u64;
        let (max, count) = windows.entry(window).or_insert((rss, 0));
        *max = max.max(rss);
        *count += 1;
    }
    // A last interval cut short (the reading after the churn, say) saw less of the
    // interval than the others: it would judge a low point against whole intervals.
    let full = windows.values().map(|(_, count)| *count).max().unwrap_or(0);
    if windows.len() > 2 && windows.values().next_back().is_some_and(|(_, count)| *count < full) {
        windows.pop_last();
    }
    let per_interval: Vec<f64> = windows.into_values().map(|(max, _)| max).collect();
    let growth = match (per_interval.first(), per_interval.last()) {
        (Some(first), Some(last)) if per_interval.len() >= 2 && *first > 0.0 => Some(last / first - 1.0),
        _ => None,
    };
    let last = samples.iter().rev().find_map(|s| s.processes.get(name));
    let peak = samples.iter().filter_map(|s| s.processes.get(name).and_then(largest)).reduce(f64::max);
    MemoryVerdict {
        flat: growth.is_some_and(|g| g <= FLAT_GROWTH),
        growth,
        max_resident_per_interval_mb: per_interval,
        peak_resident_mb: peak,
        last_heap_mb: last.and_then(|p| p.heap_mb),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t_s: f64, rss: f64) -> Sample {
        let process = ProcessSample {
            resident_mb: Some(rss),
            peak_since_last_sample_mb: Some(rss),
            heap_mb: None,
            threads: None,
            open_fds: None,
        };
        Sample {
            t_s,
            processes: BTreeMap::from([("agent".to_owned(), process)]),
            operations: BTreeMap::new(),
            tables_kb: BTreeMap::new(),
        }
    }

    #[test]
    fn memory_is_judged_by_the_largest_reading_of_each_sweep_interval_after_settling() {
        let minute = Duration::from_secs(60);
        // Before settling (t < 120 s) anything goes; then 40-44 MB, one spike per interval.
        let samples: Vec<Sample> = [
            (0.0, 10.0),
            (60.0, 90.0),
            (120.0, 40.0),
            (150.0, 42.0),
            (180.0, 41.0),
            (210.0, 43.0),
            (240.0, 44.0),
            (270.0, 43.0),
        ]
        .into_iter()
        .map(|(t, rss)| at(t, rss))
        .collect();
        let verdict = verdict(&samples, "agent", 2 * minute, minute);
        assert_eq!(verdict.max_resident_per_interval_mb, [42.0, 43.0, 44.0]);
        let growth = verdict.growth.expect("a growth");
        assert!((growth - (44.0 / 42.0 - 1.0)).abs() < 1e-9, "{growth}");
        assert!(verdict.flat);

        let growing: Vec<Sample> =
            [(0.0, 40.0), (60.0, 44.0), (120.0, 48.0)].into_iter().map(|(t, rss)| at(t, rss)).collect();
        let verdict = super::verdict(&growing, "agent", Duration::ZERO, minute);
        assert!(!verdict.flat, "20% growth: {verdict:?}");
        // A last interval with one reading of two is left out.
        let cut: Vec<Sample> = [(0.0, 40.0), (30.0, 50.0), (60.0, 42.0), (90.0, 54.0), (120.0, 20.0)]
            .into_iter()
            .map(|(t, rss)| at(t, rss))
            .collect();
        let verdict = super::verdict(&cut, "agent", Duration::ZERO, minute);
        assert_eq!(verdict.max_resident_per_interval_mb, [50.0, 54.0]);
        assert!(verdict.flat, "8% growth: {verdict:?}");
        let one = super::verdict(&growing[..1], "agent", Duration::ZERO, minute);
        assert_eq!((one.growth, one.flat), (None, false), "one interval judges nothing");
    }

    #[test]
    fn a_rise_between_two_samples_counts_in_its_interval() {
        let minute = Duration::from_secs(60);
        // Every interval rises to 60 MB between its samples; only the peaks say so.
        let mut samples: Vec<Sample> = [(0.0, 30.0), (30.0, 31.0), (60.0, 30.0), (90.0, 31.0), (120.0, 30.0)]
            .into_iter()
            .map(|(t, rss)| at(t, rss))
            .collect();
        for (index, sample) in samples.iter_mut().enumerate() {
            let agent = sample.processes.get_mut("agent").expect("the agent");
            agent.peak_since_last_sample_mb = Some(if index % 2 == 1 { 60.0 } else { 58.0 });
        }
        let verdict = verdict(&samples, "agent", Duration::ZERO, minute);
        assert_eq!(verdict.max_resident_per_interval_mb, [60.0, 60.0]);
        assert_eq!(verdict.peak_resident_mb, Some(60.0));
        assert!(verdict.flat);
    }
}
