//! `gitops-dev bench chaos`: the service under faults, measured. The `dev` stack
//! runs several writers and agents as child processes; once D GitOpsDeployments
//! over T tenants are Ready, tenants keep changing (in bursts), deleting and creating
//! them while a random child is killed with SIGKILL every few seconds (and replaced at once
//! under a new identity, as a Deployment replaces a pod), and PostgreSQL is stopped
//! once for a few seconds (after a lease without kills, so it is timed on its own),
//! during which some Applications turn Degraded in Argo CD.
//!
//! A monitor reads the leases from the database every 100 ms and times each
//! takeover from the previous holder's last renewal (database clock): a shard
//! passing to another writer, and an expired claim taken back by a live agent (its
//! operation waiting again, or superseded by the resource's newer one). A shard handed
//! to another writer for fairness is timed like a takeover (it is never ownerless);
//! one a writer let go (at shutdown) counts as if its lease had ended the moment it
//! was let go, so the bound (lease + 1 s) means it was taken within a second. Takeovers spanning the database outage are counted apart. Then: how
//! long after PostgreSQL returns the tenants read the Degraded health, how long after
//! the chaos the service converges (every deployment Ready at its generation with
//! its Application at the wanted path, nothing left over), and what did not: lost
//! (no Application), duplicated (an Application or live row too many), stale (an
//! Application or status not at the tenant's intent). The seed replays the choices.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::{StreamExt, TryStreamExt, stream};
use gitops_testkit::argocd::{HEALTH_KNOB, StandinOptions, application_resource};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::e2e::{create_deployment, create_namespace, set_path};
use crate::up::{DEV_ARGOCD_NAMESPACE, DevError, DevStack, StackShape};
use gitops_testkit::random::Random;

/// How often the monitor reads the leases.
const MONITOR_EVERY: Duration = Duration::from_millis(100);
/// How long PostgreSQL stays stopped.
const OUTAGE: Duration = Duration::from_secs(4);
/// How long a kill of an agent waits for it to hold a claim.
const CLAIM_WAIT: Duration = Duration::from_secs(3);
/// How often progress is printed while waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// What to run.
#[derive(Debug, Clone)]
pub struct ChaosBenchConfig {
    pub tenants: usize,
    pub deployments: usize,
    pub writers: usize,
    pub agents: usize,
    /// How long children are killed at random.
    pub chaos: Duration,
    /// The agents' operation lease.
    pub agent_lease: Duration,
    /// Applications turned Degraded while PostgreSQL is down.
    pub degraded: usize,
    /// Deployments changed at once before each kill.
    pub burst: usize,
    /// Replays a run's choices; random when None.
    pub seed: Option<u64>,
    /// How long to wait for the first convergence, and again after the chaos.
    pub deadline: Duration,
    pub dir: PathBuf,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum ChaosBenchError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("could not start the service")]
    Start { source: DevError },
    #[error("could not replace a child process")]
    Child { source: DevError },
    #[error("could not {step} PostgreSQL")]
    Postgres { step: &'static str, source: gitops_testkit::PgError },
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("the deployments did not converge within {deadline:?} before the chaos; the logs are in {dir}")]
    NotReady { deadline: Duration, dir: PathBuf },
    #[error("a step of the end-to-end helpers failed")]
    Helper { source: super::e2e::E2eBenchError },
}

fn kube(step: &'static str) -> impl FnOnce(kube::Error) -> ChaosBenchError {
    move |source| ChaosBenchError::Kube { step, source }
}

/// The figures, printed as one JSON object. Durations in seconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChaosBenchReport {
    pub seed: u64,
    pub tenants: usize,
    pub deployments: usize,
    pub writers: usize,
    pub agents: usize,
    pub chaos_s: f64,
    pub kills: usize,
    /// Children that stopped by themselves (a start while the database was away) and were replaced.
    pub exited: usize,
    pub writer_lease_s: f64,
    pub agent_lease_s: f64,
    /// Expired claims taken back by a live agent, and the longest wait from the
    /// dead holder's last renewal (bound: agent lease + 1 s).
    pub claim_takeovers: usize,
    pub claim_takeover_s: Option<f64>,
    /// Shards that passed to another writer, and the longest time from the previous
    /// holder's last renewal until the next held it (bound: writer lease + 1 s).
    pub shard_handoffs: usize,
    pub shard_unowned_max_s: Option<f64>,
    /// Takeovers spanning the database outage (not in the two maxima above).
    pub takeovers_during_db_outage: usize,
    pub db_outage_s: f64,
    /// From PostgreSQL accepting connections again until every tenant resource shows
    /// the health Argo CD reported meanwhile.
    pub status_after_db_restart_s: Option<f64>,
    /// From the end of the chaos until every deployment converged.
    pub converge_s: Option<f64>,
    pub lost: usize,
    pub duplicated: usize,
    pub stale: usize,
    pub failed_operations: i64,
}

/// Where the deployments should be: (namespace, name) → path.
pub(crate) type Wanted = BTreeMap<(String, String), String>;

/// Runs the benchmark; the stack is stopped whatever the outcome.
pub async fn chaos_bench(config: &ChaosBenchConfig) -> Result<ChaosBenchReport, ChaosBenchError> {
    if config.tenants == 0 || config.deployments < config.tenants {
        return Err(ChaosBenchError::Usage("need at least one tenant and a deployment per tenant"));
    }
    if config.writers < 2 || config.agents < 2 {
        return Err(ChaosBenchError::Usage("takeovers need at least two writers and two agents"));
    }
    let shape = StackShape {
        writers: config.writers,
        agents: config.agents,
        webhook: false,
        agent_lease: Some(config.agent_lease),
        ..StackShape::default()
    };
    // No periodic resync in the stand-in: status after the outage must come from the agents.
    let options = StandinOptions { resync: Duration::ZERO, ..StandinOptions::default() };
    let mut stack = DevStack::start_shaped(&config.dir, options, &shape)
        .await
        .map_err(|source| ChaosBenchError::Start { source })?;
    eprintln!("service up: {}; run directory {}", stack.child_names().join(", "), stack.info.dir.display());
    let outcome = run(config, &mut stack).await;
    stack.stop().await;
    outcome
}

async fn run(config: &ChaosBenchConfig, stack: &mut DevStack) -> Result<ChaosBenchReport, ChaosBenchError> {
    let seed = config.seed.unwrap_or_else(Random::fresh_seed);
    eprintln!("seed {seed}");
    let mut random = Random::new(seed);
    let kube_client = stack.kube.clone();
    let namespaces: Vec<String> = (0..config.tenants).map(|t| format!("chaos-t{t:03}")).collect();
    stream::iter(namespaces.iter().map(|name| create_namespace(&kube_client, name)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| ChaosBenchError::Helper { source })?;
    let mut wanted: Wanted = (0..config.deployments)
        .map(|d| {
            let namespace = namespaces[d % config.tenants].clone();
            let name = format!("d{d:05}");
            let path = format!("apps/{namespace}/{name}");
            ((namespace, name), path)
        })
        .collect();
    stream::iter(wanted.keys().map(|(namespace, name)| create_deployment(&kube_client, namespace, name)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| ChaosBenchError::Helper { source })?;
    eprintln!("{} deployments created; waiting until every one is Ready", wanted.len());
    if converge(&kube_client, &wanted, config.deadline).await.0.is_none() {
        return Err(ChaosBenchError::NotReady { deadline: config.deadline, dir: stack.info.dir.clone() });
    }

    let writer_lease = gitops_writer::shard::ShardConfig::default().lease;
    let monitor = Arc::new(Mutex::new(Monitor::default()));
    let cancel = CancellationToken::new();
    let url = stack.info.database_url.clone();
    let watcher = tokio::spawn(watch_leases(url.clone(), monitor.clone(), cancel.clone()));

    eprintln!("chaos for {:?}", config.chaos);
    let started = Instant::now();
    let (mut kills, mut exited, mut round) = (0, 0, 0usize);
    let mut outage: Option<(f64, f64)> = None;
    let mut status_after_db_restart_s = None;
    let children = stack.child_names();
    while started.elapsed() < config.chaos {
        round += 1;
        tenant_round(&kube_client, &mut wanted, &mut random, round, config.burst).await?;
        if outage.is_none() && started.elapsed() > config.chaos / 2 {
            // The outage is timed on its own: no kill in the lease before it, so no
            // takeover still under way adds to what the database's return costs.
            tokio::time::sleep(writer_lease.max(config.agent_lease) + Duration::from_secs(2)).await;
            exited += stack.replace_exited().map_err(|source| ChaosBenchError::Child { source })?;
            let (window, status_s) = db_outage(stack, &kube_client, &wanted, config.degraded, &mut random).await?;
            outage = Some(window);
            status_after_db_restart_s = status_s;
            monitor.lock().unwrap_or_else(std::sync::PoisonError::into_inner).outage = Some(window);
        }
        let victim = random.below(children.len());
        if children[victim].starts_with("gitops-agent") {
            // Killed while it holds claims (if it gets any soon), so they must be taken over.
            wait_for_claims(&url, stack.child_pid(victim)).await;
        }
        eprintln!("  kill {} at {:.2}", children[victim], epoch_now());
        stack.kill_and_replace(victim).await.map_err(|source| ChaosBenchError::Child { source })?;
        kills += 1;
        tokio::time::sleep(Duration::from_millis(1500 + random.below(2500) as u64)).await;
        exited += stack.replace_exited().map_err(|source| ChaosBenchError::Child { source })?;
        if round % 5 == 0 {
            eprintln!("  {:.0}s: {kills} kills, {} deployments", started.elapsed().as_secs_f64(), wanted.len());
        }
    }
    let chaos_s = started.elapsed().as_secs_f64();
    exited += stack.replace_exited().map_err(|source| ChaosBenchError::Child { source })?;
    eprintln!("chaos over after {round} rounds; waiting for convergence");
    let (converge_s, misses) = converge(&kube_client, &wanted, config.deadline).await;
    // Takeovers still under way at the end are seen by the monitor's last reads.
    tokio::time::sleep(config.agent_lease.max(writer_lease) + Duration::from_secs(2)).await;
    cancel.cancel();
    let _ = watcher.await;
    let failed_operations = failed_operations(&url).await;
    let monitor = monitor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let claim = monitor.claim_takeovers(config.agent_lease);
    let shard = monitor.shard_handoffs(writer_lease);
    for (kind, worst) in [("claim takeover", &claim.worst), ("shard handoff", &shard.worst)] {
        if let Some(worst) = worst {
            eprintln!("longest {kind}: {worst}");
        }
    }
    Ok(ChaosBenchReport {
        seed,
        tenants: config.tenants,
        deployments: wanted.len(),
        writers: config.writers,
        agents: config.agents,
        chaos_s,
        kills,
        exited,
        writer_lease_s: writer_lease.as_secs_f64(),
        agent_lease_s: config.agent_lease.as_secs_f64(),
        claim_takeovers: claim.counted,
        claim_takeover_s: claim.max,
        shard_handoffs: shard.counted,
        shard_unowned_max_s: shard.max,
        takeovers_during_db_outage: claim.during_outage + shard.during_outage,
        db_outage_s: outage.map_or(0.0, |(down, up)| up - down),
        status_after_db_restart_s,
        converge_s,
        lost: misses.lost,
        duplicated: misses.duplicated,
        stale: misses.stale,
        failed_operations,
    })
}

/// Tenants at work: a burst of changes (so agents hold claims when one is killed),
/// sometimes a deletion or a new deployment.
async fn tenant_round(
    client: &kube::Client,
    wanted: &mut Wanted,
    random: &mut Random,
    round: usize,
    burst: usize,
) -> Result<(), ChaosBenchError> {
    let keys: Vec<(String, String)> = wanted.keys().cloned().collect();
    let mut changes: BTreeMap<(String, String), String> = BTreeMap::new();
    while changes.len() < burst.min(keys.len()) {
        let (namespace, name) = keys[random.below(keys.len())].clone();
        let path = format!("apps/{namespace}/{name}/v{round}");
        changes.insert((namespace, name), path);
    }
    stream::iter(changes.iter().map(|((namespace, name), path)| set_path(client, namespace, name, path)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| ChaosBenchError::Helper { source })?;
    wanted.extend(changes);
    match random.below(4) {
        0 if wanted.len() > keys.len() / 2 => {
            let key = keys[random.below(keys.len())].clone();
            Api::<GitOpsDeployment>::namespaced(client.clone(), &key.0)
                .delete(&key.1, &DeleteParams::default())
                .await
                .map_err(kube("delete a GitOpsDeployment"))?;
            wanted.remove(&key);
        }
        1 => {
            let namespace = keys[random.below(keys.len())].0.clone();
            let name = format!("late{round:05}");
            create_deployment(client, &namespace, &name).await.map_err(|source| ChaosBenchError::Helper { source })?;
            wanted.insert((namespace.clone(), name.clone()), format!("apps/{namespace}/{name}"));
        }
        _ => {}
    }
    Ok(())
}

/// Waits up to [`CLAIM_WAIT`] until the agent with process id `pid` holds a claim.
async fn wait_for_claims(url: &str, pid: Option<u32>) {
    let (Some(pid), Ok(client)) = (pid, gitops_shared::db::connect(url, "gitops-dev-bench").await) else { return };
    let pattern = format!("%-{pid}-%");
    let deadline = Instant::now() + CLAIM_WAIT;
    while Instant::now() < deadline {
        let held = client
            .query_one(
                "SELECT count(*) AS held FROM operation WHERE state = 'claimed' AND claimed_by LIKE $1",
                &[&pattern],
            )
            .await
            .map_or(0, |row| row.get::<_, i64>("held"));
        if held > 0 {
            eprintln!("  killing an agent that holds {held} claims");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Stops PostgreSQL for [`OUTAGE`]; meanwhile `count` Applications turn Degraded.
/// Returns the outage (epoch seconds) and how long after PostgreSQL returned every
/// one of those tenants read Degraded; the Applications are Healthy again after.
async fn db_outage(
    stack: &DevStack,
    client: &kube::Client,
    wanted: &Wanted,
    count: usize,
    random: &mut Random,
) -> Result<((f64, f64), Option<f64>), ChaosBenchError> {
    let keys: Vec<&(String, String)> = wanted.keys().collect();
    let mut chosen: Vec<(String, String)> = Vec::new();
    while chosen.len() < count.min(keys.len()) {
        let key = keys[random.below(keys.len())].clone();
        if !chosen.contains(&key) {
            chosen.push(key);
        }
    }
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), DEV_ARGOCD_NAMESPACE, &application_resource());
    let mut names = Vec::new();
    for (namespace, name) in &chosen {
        let object = Api::<GitOpsDeployment>::namespaced(client.clone(), namespace)
            .get(name)
            .await
            .map_err(kube("read a GitOpsDeployment"))?;
        let uid = object.metadata.uid.as_deref().and_then(|u| u.parse().ok()).unwrap_or_default();
        names.push(gitops_agent::names::application_name(uid));
    }
    eprintln!("stopping PostgreSQL for {OUTAGE:?}; {} Applications turn Degraded meanwhile", names.len());
    let down = epoch_now();
    stack.postgres().pause().await.map_err(|source| ChaosBenchError::Postgres { step: "stop", source })?;
    for name in &names {
        let patch = json!({"metadata": {"annotations": {HEALTH_KNOB: "Degraded"}}});
        apps.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube("annotate an Application"))?;
    }
    tokio::time::sleep(OUTAGE).await;
    stack.postgres().resume().await.map_err(|source| ChaosBenchError::Postgres { step: "start", source })?;
    let up = epoch_now();
    let back = Instant::now();
    let deadline = back + Duration::from_secs(120);
    let mut status_s = None;
    while Instant::now() < deadline {
        let mut degraded = 0;
        for (namespace, name) in &chosen {
            let object = Api::<GitOpsDeployment>::namespaced(client.clone(), namespace).get_opt(name).await;
            let health = object.ok().flatten().and_then(|o| o.status).and_then(|s| s.health).map(|h| h.status);
            degraded += usize::from(health.as_deref() == Some("Degraded"));
        }
        if degraded == chosen.len() {
            status_s = Some(back.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("PostgreSQL back; tenants read the Degraded health after {status_s:?} s");
    for name in &names {
        let patch = json!({"metadata": {"annotations": {HEALTH_KNOB: null}}});
        apps.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube("annotate an Application"))?;
    }
    Ok(((down, up), status_s))
}

fn epoch_now() -> f64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// What did not converge.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Misses {
    pub(crate) lost: usize,
    pub(crate) duplicated: usize,
    pub(crate) stale: usize,
}

/// Waits until every wanted deployment is Ready at its generation with its
/// Application at the wanted path and nothing else is left; returns how long it
/// took (None at the deadline) and what was still off at the end.
pub(crate) async fn converge(client: &kube::Client, wanted: &Wanted, deadline: Duration) -> (Option<f64>, Misses) {
    let started = Instant::now();
    let mut progress = Instant::now();
    let mut misses = Misses::default();
    while started.elapsed() < deadline {
        if let Some(found) = check(client, wanted).await {
            misses = found;
            if found.lost + found.duplicated + found.stale == 0 {
                return (Some(started.elapsed().as_secs_f64()), misses);
            }
        }
        if progress.elapsed() >= PROGRESS_EVERY {
            eprintln!("  converging: {misses:?}");
            progress = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (None, misses)
}

/// One look at every deployment and Application; None if a list failed.
async fn check(client: &kube::Client, wanted: &Wanted) -> Option<Misses> {
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), DEV_ARGOCD_NAMESPACE, &application_resource());
    // The agent's own Applications (not its progress probe).
    let selector = format!("{}={}", gitops_agent::names::MANAGED_BY_LABEL, gitops_agent::names::MANAGED_BY_VALUE);
    let listed = apps.list(&ListParams::default().labels(&selector)).await.ok()?;
    let paths: HashMap<String, String> = listed
        .items
        .iter()
        .map(|app| {
            let path = app.data.pointer("/spec/source/path").and_then(|p| p.as_str()).unwrap_or_default().to_owned();
            (app.metadata.name.clone().unwrap_or_default(), path)
        })
        .collect();
    let deployments = Api::<GitOpsDeployment>::all(client.clone()).list(&ListParams::default()).await.ok()?;
    let mut misses = Misses::default();
    let mut matched = 0;
    for object in &deployments.items {
        let key =
            (object.metadata.namespace.clone().unwrap_or_default(), object.metadata.name.clone().unwrap_or_default());
        let Some(path) = wanted.get(&key) else {
            misses.duplicated += 1; // deleted by the tenant, still there
            continue;
        };
        let uid = object.metadata.uid.as_deref().and_then(|u| u.parse().ok()).unwrap_or_default();
        let Some(app_path) = paths.get(&gitops_agent::names::application_name(uid)) else {
            misses.lost += 1;
            continue;
        };
        matched += 1;
        let ready = object.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation
            })
        });
        if app_path != path || !ready {
            misses.stale += 1;
        }
    }
    misses.lost += wanted.len().saturating_sub(deployments.items.len());
    misses.duplicated += paths.len().saturating_sub(matched);
    Some(misses)
}

pub(crate) async fn failed_operations(url: &str) -> i64 {
    let Ok(client) = gitops_shared::db::connect(url, "gitops-dev-bench").await else { return -1 };
    client
        .query_one("SELECT count(*) AS failed FROM operation WHERE state = 'failed'", &[])
        .await
        .map_or(-1, |row| row.get("failed"))
}

/// The leases as last read, and the takeovers seen. Times are epoch seconds of the
/// database's clock.
#[derive(Debug, Default)]
struct Monitor {
    /// shard → (writer, last lease expiry seen).
    shards: HashMap<i32, (String, f64)>,
    /// (previous holder's last lease expiry, next holder's first lease expiry) per
    /// handoff; renewal and claim are expiry − lease, subtracted when figures are made.
    shard_handoffs: Vec<Takeover>,
    /// operation → (lease token, last lease expiry seen, expired leases counted) of
    /// its claim seen live.
    claims: HashMap<i64, (String, f64, i32)>,
    /// (previous holder's last lease expiry, the next claim) per takeover.
    claim_takeovers: Vec<Takeover>,
    /// The database outage (epoch seconds).
    outage: Option<(f64, f64)>,
}

/// One takeover: the previous holder's last lease expiry, when the next took it,
/// and what and who (for the log).
#[derive(Debug, Clone)]
struct Takeover {
    expiry: f64,
    taken: f64,
    what: String,
}

/// A maximum over takeovers outside the outage.
struct Figure {
    counted: usize,
    max: Option<f64>,
    during_outage: usize,
    /// The longest, for the log.
    worst: Option<String>,
}

impl Monitor {
    fn figure(&self, events: &[Takeover], lease: Duration) -> Figure {
        let lease = lease.as_secs_f64();
        let mut figure = Figure { counted: 0, max: None, during_outage: 0, worst: None };
        for event in events {
            let renewal = event.expiry - lease;
            let spans = self.outage.is_some_and(|(down, up)| renewal <= up && event.taken >= down);
            if spans {
                figure.during_outage += 1;
                continue;
            }
            figure.counted += 1;
            let waited = event.taken - renewal;
            if figure.max.is_none_or(|max| waited > max) {
                figure.max = Some(waited);
                figure.worst = Some(format!("{} after {waited:.2}s (last renewal at {renewal:.2})", event.what));
            }
        }
        figure
    }

    fn claim_takeovers(&self, lease: Duration) -> Figure {
        self.figure(&self.claim_takeovers, lease)
    }

    fn shard_handoffs(&self, lease: Duration) -> Figure {
        // A new holder's claim time is its first expiry seen minus the lease.
        let events: Vec<Takeover> = self
            .shard_handoffs
            .iter()
            .map(|event| Takeover { taken: event.taken - lease.as_secs_f64(), ..event.clone() })
            .collect();
        self.figure(&events, lease)
    }
}

// Held shards with their expiry, and shards given back with the moment they were
// (a given-back shard is free from then on: for the figure, its lease ended then).
const SHARDS: &str = "
SELECT shard, writer_id, extract(epoch FROM lease_expires_at)::float8 AS expires
  FROM writer_shard WHERE writer_id IS NOT NULL AND lease_expires_at > now()
UNION ALL
SELECT shard, '', extract(epoch FROM updated_at)::float8
  FROM writer_shard WHERE writer_id IS NULL";

// Claims held now, and those that ended a moment ago. A live agent takes an
// expired claim back by putting its operation back to waiting (run_after = the
// moment it did) or, when the resource has a newer waiting operation, by
// superseding it (into operation_history, completed_at = that moment); either way its
// expiry count grows.
const CLAIMS: &str = "
SELECT id, state::text AS state, lease_token::text AS token,
       extract(epoch FROM lease_expires_at)::float8 AS expires,
       extract(epoch FROM run_after)::float8 AS run_after,
       extract(epoch FROM completed_at)::float8 AS completed_at, lease_expiries
  FROM operation
 WHERE state = 'claimed' OR completed_at > now() - interval '5 seconds'
UNION ALL
SELECT id, state::text, NULL, NULL, NULL, extract(epoch FROM completed_at)::float8, lease_expiries
  FROM operation_history
 WHERE completed_at > now() - interval '5 seconds'";

// Shards expired (or released) for more than a second without a new holder, and the
// transactions open for more than half a second that might hold their rows (for the log: why a
// handoff takes longer than the lease).
const STUCK_SHARDS: &str = "
SELECT shard, writer_id FROM writer_shard
 WHERE coalesce(lease_expires_at, updated_at) < now() - interval '1 second'";
const LONG_TRANSACTIONS: &str = "
SELECT pid, application_name, state, coalesce(wait_event_type || ':' || wait_event, '') AS waiting,
       pg_blocking_pids(pid)::text AS blocked_by,
       extract(epoch FROM now() - xact_start)::float8 AS age_s, left(query, 100) AS query
  FROM pg_stat_activity
 WHERE xact_start < now() - interval '500 milliseconds' AND pid <> pg_backend_pid()
   AND datname = current_database()";

/// Logs, once per shard, a shard left unowned past its lease with the long
/// transactions open at that moment.
async fn report_stuck_shards(db: &tokio_postgres::Client, reported: &mut std::collections::HashSet<(i32, String)>) {
    let Ok(stuck) = db.query(STUCK_SHARDS, &[]).await else { return };
    let fresh: Vec<(i32, String)> = stuck
        .iter()
        .map(|row| (row.get::<_, i32>("shard"), row.get::<_, Option<String>>("writer_id").unwrap_or_default()))
        .filter(|key| !reported.contains(key))
        .collect();
    if fresh.is_empty() {
        return;
    }
    eprintln!("  shards unowned past their lease: {fresh:?}");
    if let Ok(rows) = db.query(LONG_TRANSACTIONS, &[]).await {
        for row in &rows {
            let (pid, app, state): (i32, String, Option<String>) =
                (row.get("pid"), row.get("application_name"), row.get("state"));
            let (waiting, age, query): (String, f64, Option<String>) =
                (row.get("waiting"), row.get("age_s"), row.get("query"));
            let blocked_by: String = row.get("blocked_by");
            eprintln!(
                "    open transaction pid {pid} ({app}) {state:?} {waiting} blocked by {blocked_by} for {age:.1}s: {query:?}"
            );
        }
    }
    reported.extend(fresh);
}

/// How a shard given back is named after its last holder in the log.
const GIVEN_BACK: &str = " (given back)";

/// Reads the leases every [`MONITOR_EVERY`] until `cancel`, reconnecting as needed.
async fn watch_leases(url: String, monitor: Arc<Mutex<Monitor>>, cancel: CancellationToken) {
    let mut client = None;
    let mut reported = std::collections::HashSet::new();
    while !cancel.is_cancelled() {
        tokio::time::sleep(MONITOR_EVERY).await;
        if client.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            client = gitops_shared::db::connect(&url, "gitops-dev-bench").await.ok();
        }
        let Some(db) = &client else { continue };
        let (Ok(shards), Ok(claims)) = (db.query(SHARDS, &[]).await, db.query(CLAIMS, &[]).await) else {
            continue;
        };
        report_stuck_shards(db, &mut reported).await;
        let mut monitor = monitor.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for row in &shards {
            let (shard, writer, expires): (i32, String, f64) =
                (row.get("shard"), row.get("writer_id"), row.get("expires"));
            match monitor.shards.get(&shard).cloned() {
                // Given back: from now on its "expiry" is the moment it was given back
                // (and the handoff to the next holder is timed from there).
                Some((previous, _)) if writer.is_empty() && !previous.is_empty() => {
                    let given_back = if previous.ends_with(GIVEN_BACK) { previous } else { previous + GIVEN_BACK };
                    monitor.shards.insert(shard, (given_back, expires));
                    continue;
                }
                Some((previous, last_expiry)) if previous != writer && !writer.is_empty() => {
                    let what = format!("shard {shard}: {previous} -> {writer}");
                    monitor.shard_handoffs.push(Takeover { expiry: last_expiry, taken: expires, what });
                }
                _ if writer.is_empty() => continue,
                _ => {}
            }
            monitor.shards.insert(shard, (writer, expires));
        }
        for row in &claims {
            let id: i64 = row.get("id");
            let state: String = row.get("state");
            let token: Option<String> = row.get("token");
            let expires: Option<f64> = row.get("expires");
            let expiries: i32 = row.get("lease_expiries");
            if let Some((_, old_expiry, old_expiries)) = monitor.claims.get(&id).cloned()
                && expiries > old_expiries
            {
                // The claim seen before expired and a live agent took it back.
                let taken: Option<f64> =
                    if state == "superseded" { row.get("completed_at") } else { row.get("run_after") };
                if let Some(taken) = taken {
                    let what = format!("operation {id}");
                    monitor.claim_takeovers.push(Takeover { expiry: old_expiry, taken, what });
                }
                monitor.claims.remove(&id);
            }
            match (state.as_str(), token, expires) {
                ("claimed", Some(token), Some(expires)) => {
                    monitor.claims.insert(id, (token, expires, expiries));
                }
                ("claimed", _, _) => {}
                _ => {
                    monitor.claims.remove(&id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takeovers_are_timed_from_the_last_renewal_and_the_outage_is_set_apart() {
        let lease = Duration::from_secs(10);
        let event = |expiry, taken| Takeover { expiry, taken, what: "operation 1".into() };
        let monitor = Monitor {
            // Renewed at 100 and 200; taken at 111 and 205.
            claim_takeovers: vec![event(110.0, 111.0), event(210.0, 205.0), event(310.0, 330.0)],
            outage: Some((305.0, 309.0)),
            ..Monitor::default()
        };
        let figure = monitor.claim_takeovers(lease);
        assert_eq!((figure.counted, figure.during_outage), (2, 1));
        assert_eq!(figure.max, Some(11.0));
        assert!(figure.worst.is_some_and(|w| w.starts_with("operation 1 after 11.00s")));
        // A shard's next holder is seen with its first expiry: claimed at expiry − lease.
        let monitor = Monitor { shard_handoffs: vec![event(115.0, 131.0)], ..Monitor::default() };
        assert_eq!(monitor.shard_handoffs(Duration::from_secs(15)).max, Some(16.0));
        assert_eq!(Monitor::default().shard_handoffs(lease).max, None);
    }
}
