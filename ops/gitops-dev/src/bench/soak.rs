//! `gitops-dev bench soak`: whether memory stays flat through a day's kind of
//! churn. The `dev` stack gets T tenants × D GitOpsDeployments, then for M minutes
//! tenants change paths (a batch every tick) and delete and recreate deployments
//! (every minute), all through the Kubernetes API as tenants would. Every sample
//! interval it records each process's RSS, peak RSS, open files, threads and CPU,
//! the queue's states and table sizes; at the end it checks convergence (every
//! deployment's Application at its current path, nothing else, none failed,
//! nothing queued). The verdict on flatness: the largest RSS per sweep interval,
//! from minute 5 to the end, grows by at most 10% per process.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gitops_testkit::argocd::{StandinOptions, application_resource};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};

use super::cpu::process_s;
use super::e2e::{create_deployment, create_namespace, set_path};
use crate::up::{DEV_ARGOCD_NAMESPACE, DevError, DevStack, StackShape};

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakBenchConfig {
    pub minutes: u64,
    pub tenants: usize,
    pub deployments_per_tenant: usize,
    /// Path changes per tick.
    pub changes: usize,
    pub tick: Duration,
    /// Deletions and recreations per minute.
    pub recreates: usize,
    /// The agent's sweep interval.
    pub sweep_interval: Duration,
    /// The agent's completed-operation retention (its default when None).
    pub completed_retention: Option<Duration>,
    pub sample_every: Duration,
    /// How long the end state may take to converge.
    pub converge_deadline: Duration,
    pub dir: PathBuf,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum SoakBenchError {
    #[error("could not start the service")]
    Start { source: DevError },
    #[error("a child process stopped")]
    Child { source: DevError },
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("a tenant's request failed")]
    Tenant { source: super::e2e::E2eBenchError },
    #[error("could not reach the database")]
    Db { source: gitops_shared::db::DbError },
}

fn tenant(source: super::e2e::E2eBenchError) -> SoakBenchError {
    SoakBenchError::Tenant { source }
}

/// One process at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcessSample {
    pub rss_mb: f64,
    pub peak_rss_mb: f64,
    pub open_files: usize,
    pub threads: usize,
    pub cpu_s: f64,
}

/// One sample of the whole stack.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    pub at_s: f64,
    /// writer, agent, and stack (this process: emulator, stand-in, the churn's clients).
    pub processes: BTreeMap<&'static str, ProcessSample>,
    /// Operations by state.
    pub queue: BTreeMap<String, i64>,
    /// Table sizes in bytes (with indexes and TOAST).
    pub table_bytes: BTreeMap<String, i64>,
    pub changes: usize,
    pub recreates: usize,
}

/// The end state.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Convergence {
    pub converged: bool,
    pub seconds: f64,
    /// Deployments whose Application is missing or at another path.
    pub mismatched: usize,
    /// Applications no current deployment calls for.
    pub extra: usize,
    pub failed_operations: i64,
    pub queued_operations: i64,
}

/// The figures, printed as one JSON object.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SoakReport {
    pub minutes: u64,
    pub tenants: usize,
    pub deployments: usize,
    pub changes: usize,
    pub recreates: usize,
    pub sweep_interval_s: f64,
    /// Per process: the largest RSS of the last sweep interval over that of the first
    /// interval after minute 5 (None when the run is too short to tell).
    pub rss_growth_after_5_min: BTreeMap<&'static str, Option<f64>>,
    /// Per process: ≤ 1.10.
    pub flat: BTreeMap<&'static str, Option<bool>>,
    pub heap_in_use: &'static str,
    pub convergence: Convergence,
    pub samples: Vec<Sample>,
}

/// Runs the soak; the stack is stopped whatever the outcome.
pub async fn soak_bench(config: &SoakBenchConfig) -> Result<SoakReport, SoakBenchError> {
    let mut shape = StackShape::default();
    shape.agent_env.push(("GITOPS_AGENT_SWEEP_INTERVAL".into(), format!("{}ms", config.sweep_interval.as_millis())));
    if let Some(retention) = config.completed_retention {
        shape.agent_env.push(("GITOPS_AGENT_COMPLETED_RETENTION".into(), format!("{}s", retention.as_secs())));
    }
    let mut stack = DevStack::start_shaped(&config.dir, StandinOptions::default(), &shape)
        .await
        .map_err(|source| SoakBenchError::Start { source })?;
    eprintln!("service up; run directory {}", stack.info.dir.display());
    let outcome = run(config, &mut stack).await;
    stack.stop().await;
    outcome
}

async fn run(config: &SoakBenchConfig, stack: &mut DevStack) -> Result<SoakReport, SoakBenchError> {
    let client = stack.kube.clone();
    let db = gitops_shared::db::connect(&stack.info.database_url, "gitops-bench-soak")
        .await
        .map_err(|source| SoakBenchError::Db { source })?;
    // (namespace, name) → the path the deployment should have now.
    let mut wanted: BTreeMap<(String, String), String> = BTreeMap::new();
    for t in 0..config.tenants {
        let namespace = format!("soak-t{t:04}");
        create_namespace(&client, &namespace).await.map_err(tenant)?;
        for d in 0..config.deployments_per_tenant {
            let name = format!("d{d:03}");
            create_deployment(&client, &namespace, &name).await.map_err(tenant)?;
            wanted.insert((namespace.clone(), name.clone()), format!("apps/{namespace}/{name}"));
        }
    }
    let first = converge(&client, &db, &wanted, config.converge_deadline).await?;
    eprintln!(
        "{} deployments in sync after {:.1}s; churning for {} minutes",
        wanted.len(),
        first.seconds,
        config.minutes
    );

    let started = Instant::now();
    let end = started + Duration::from_secs(config.minutes * 60);
    let mut samples = vec![sample(stack, &db, started, 0, 0).await?];
    let (mut changes, mut recreates, mut next_change, mut generation) = (0usize, 0usize, 0usize, 0usize);
    let mut next_sample = started + config.sample_every;
    let mut next_recreate = started + Duration::from_secs(60);
    let mut tick = tokio::time::interval(config.tick);
    while Instant::now() < end {
        tick.tick().await;
        stack.check_children().map_err(|source| SoakBenchError::Child { source })?;
        let keys: Vec<(String, String)> = wanted.keys().cloned().collect();
        for _ in 0..config.changes.min(keys.len()) {
            let (namespace, name) = &keys[next_change % keys.len()];
            next_change += 1;
            let path = format!("soak/{namespace}/{name}/{next_change}");
            set_path(&client, namespace, name, &path).await.map_err(tenant)?;
            wanted.insert((namespace.clone(), name.clone()), path);
            changes += 1;
        }
        if Instant::now() >= next_recreate {
            next_recreate += Duration::from_secs(60);
            generation += 1;
            let mut picked: Vec<&(String, String)> =
                (0..config.recreates.min(keys.len())).map(|k| &keys[(generation * 7 + k * 13) % keys.len()]).collect();
            picked.sort();
            picked.dedup();
            for (namespace, name) in picked {
                let deployments: Api<GitOpsDeployment> = Api::namespaced(client.clone(), namespace);
                deployments
                    .delete(name, &DeleteParams::default())
                    .await
                    .map_err(|source| SoakBenchError::Kube { step: "delete a deployment", source })?;
                wanted.remove(&(namespace.clone(), name.clone()));
                let base = name.split('-').next().unwrap_or(name);
                let fresh = format!("{base}-g{generation}");
                create_deployment(&client, namespace, &fresh).await.map_err(tenant)?;
                wanted.insert((namespace.clone(), fresh.clone()), format!("apps/{namespace}/{fresh}"));
                recreates += 1;
            }
        }
        if Instant::now() >= next_sample {
            next_sample += config.sample_every;
            let taken = sample(stack, &db, started, changes, recreates).await?;
            let processes: Vec<String> =
                taken.processes.iter().map(|(name, p)| format!("{name} {:.1} MB", p.rss_mb)).collect();
            eprintln!("  {:.0}s: {}; {changes} changes, {recreates} recreates", taken.at_s, processes.join(", "));
            samples.push(taken);
        }
    }
    let convergence = converge(&client, &db, &wanted, config.converge_deadline).await?;
    samples.push(sample(stack, &db, started, changes, recreates).await?);
    let (growth, flat) = flatness(&samples, config.sweep_interval);
    Ok(SoakReport {
        minutes: config.minutes,
        tenants: config.tenants,
        deployments: wanted.len(),
        changes,
        recreates,
        sweep_interval_s: config.sweep_interval.as_secs_f64(),
        rss_growth_after_5_min: growth,
        flat,
        heap_in_use: "not measured: the binaries use the system allocator, which keeps no statistics to read",
        convergence,
        samples,
    })
}

type Flatness = (BTreeMap<&'static str, Option<f64>>, BTreeMap<&'static str, Option<bool>>);

/// Per process: the largest RSS in the last sweep interval over that in the first
/// interval from minute 5 on.
fn flatness(samples: &[Sample], interval: Duration) -> Flatness {
    let mut growth = BTreeMap::new();
    let mut flat = BTreeMap::new();
    let interval_s = interval.as_secs_f64().max(1.0);
    let last_at = samples.last().map_or(0.0, |s| s.at_s);
    for name in ["writer", "agent", "stack"] {
        let max_in = |from: f64, to: f64| {
            samples
                .iter()
                .filter(|s| s.at_s >= from && s.at_s <= to)
                .filter_map(|s| s.processes.get(name).map(|p| p.rss_mb))
                .fold(None, |max: Option<f64>, rss| Some(max.map_or(rss, |m| m.max(rss))))
        };
        let ratio = if last_at >= 300.0 + interval_s {
            match (max_in(300.0, 300.0 + interval_s), max_in(last_at - interval_s, last_at)) {
                (Some(first), Some(last)) if first > 0.0 => Some(last / first),
                _ => None,
            }
        } else {
            None
        };
        growth.insert(name, ratio);
        flat.insert(name, ratio.map(|r| r <= 1.10));
    }
    (growth, flat)
}

fn process(pid: Option<u32>) -> Option<ProcessSample> {
    let pid = pid?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .unwrap_or_default()
    };
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or_default();
    Some(ProcessSample {
        rss_mb: field("VmRSS:") / 1024.0,
        peak_rss_mb: field("VmHWM:") / 1024.0,
        open_files,
        threads: field("Threads:") as usize,
        cpu_s: process_s(Some(pid)),
    })
}

const QUEUE: &str = "SELECT state::text AS state, count(*) AS n FROM operation GROUP BY state";
const TABLES: &str = "SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
                        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                       WHERE n.nspname = 'public' AND c.relkind = 'r'";

async fn sample(
    stack: &DevStack,
    db: &tokio_postgres::Client,
    started: Instant,
    changes: usize,
    recreates: usize,
) -> Result<Sample, SoakBenchError> {
    let mut processes = BTreeMap::new();
    for (name, pid) in [
        ("writer", stack.pid("gitops-writer")),
        ("agent", stack.pid("gitops-agent")),
        ("stack", Some(std::process::id())),
    ] {
        if let Some(taken) = process(pid) {
            processes.insert(name, taken);
        }
    }
    let query = |e| SoakBenchError::Db { source: gitops_shared::db::DbError::query("sample the database")(e) };
    let queue = db.query(QUEUE, &[]).await.map_err(query)?;
    let tables = db.query(TABLES, &[]).await.map_err(query)?;
    Ok(Sample {
        at_s: started.elapsed().as_secs_f64(),
        processes,
        queue: queue.iter().map(|row| (row.get::<_, String>("state"), row.get::<_, i64>("n"))).collect(),
        table_bytes: tables.iter().map(|row| (row.get::<_, String>("name"), row.get::<_, i64>("bytes"))).collect(),
        changes,
        recreates,
    })
}

/// Waits until the Applications are exactly the wanted paths, none failed and
/// nothing is queued, or the deadline passes; reports what it saw last.
async fn converge(
    client: &kube::Client,
    db: &tokio_postgres::Client,
    wanted: &BTreeMap<(String, String), String>,
    deadline: Duration,
) -> Result<Convergence, SoakBenchError> {
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), DEV_ARGOCD_NAMESPACE, &application_resource());
    let want: HashSet<&str> = wanted.values().map(String::as_str).collect();
    let started = Instant::now();
    loop {
        let mut paths = HashSet::new();
        let mut params = ListParams::default().limit(500);
        loop {
            let page = apps.list(&params).await.map_err(|source| SoakBenchError::Kube { step: "list", source })?;
            for app in &page.items {
                // Only the tenants' Applications (not the agent's progress probe).
                if app.metadata.deletion_timestamp.is_none()
                    && let Some(path) = app.data.pointer("/spec/source/path").and_then(|p| p.as_str())
                    && (path.starts_with("apps/soak-") || path.starts_with("soak/"))
                {
                    paths.insert(path.to_owned());
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        let query = |e| SoakBenchError::Db { source: gitops_shared::db::DbError::query("check the queue")(e) };
        let row = db
            .query_one(
                "SELECT count(*) FILTER (WHERE state = 'failed') AS failed,
                        count(*) FILTER (WHERE state IN ('waiting', 'claimed')) AS queued FROM operation",
                &[],
            )
            .await
            .map_err(query)?;
        let outcome = Convergence {
            converged: false,
            seconds: started.elapsed().as_secs_f64(),
            mismatched: want.iter().filter(|path| !paths.contains(**path)).count(),
            extra: paths.iter().filter(|path| !want.contains(path.as_str())).count(),
            failed_operations: row.get("failed"),
            queued_operations: row.get("queued"),
        };
        let done = outcome.mismatched + outcome.extra == 0 && outcome.queued_operations == 0;
        if done || started.elapsed() >= deadline {
            return Ok(Convergence { converged: done && outcome.failed_operations == 0, ..outcome });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at_s: f64, rss_mb: f64) -> Sample {
        let process = ProcessSample { rss_mb, peak_rss_mb: rss_mb, open_files: 0, threads: 1, cpu_s: 0.0 };
        Sample {
            at_s,
            processes: BTreeMap::from([("agent", process)]),
            queue: BTreeMap::new(),
            table_bytes: BTreeMap::new(),
            changes: 0,
            recreates: 0,
        }
    }

    #[test]
    fn flatness_compares_the_first_interval_after_minute_five_with_the_last() {
        let samples: Vec<Sample> = (0..=40).map(|i| at(f64::from(i) * 30.0, 20.0 + f64::from(i))).collect();
        let (growth, flat) = flatness(&samples, Duration::from_secs(60));
        // Minute 5–6: at most 32 MB; the last minute: 60 MB.
        assert_eq!(growth["agent"], Some(60.0 / 32.0));
        assert_eq!(flat["agent"], Some(false));
        assert_eq!(growth["writer"], None, "no samples of it");
        let short: Vec<Sample> = (0..=4).map(|i| at(f64::from(i) * 30.0, 20.0)).collect();
        assert_eq!(flatness(&short, Duration::from_secs(60)).0["agent"], None, "too short to tell");
        let steady: Vec<Sample> = (0..=40).map(|i| at(f64::from(i) * 30.0, 20.0 + f64::from(i % 2))).collect();
        assert_eq!(flatness(&steady, Duration::from_secs(60)).1["agent"], Some(true));
    }
}
