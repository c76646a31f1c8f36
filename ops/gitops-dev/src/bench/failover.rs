//! `gitops-dev bench failover`: an engine instance lost under load, measured. The
//! `dev` stack runs three engine instances (each an Argo CD stand-in with its own
//! agent) and a writer with a short failover grace; D GitOpsDeployments over T
//! tenants are placed across them. Once every one is Ready, one instance is stopped
//! as a lost node would be (its stand-in stops, its agent is killed and not
//! replaced), and the benchmark times, from that moment:
//!
//! - `detect_s`: until the database reads the instance `lost` (the heartbeat
//!   timeout, `gitops.instance_lost_after`, is set short for the run);
//! - `all_replaced_s`: until none of its tenants is placed there or moving;
//! - `all_healthy_s`: until every affected deployment is Ready, Synced and Healthy
//!   with its Application on another instance;
//! - `move_gap_s` p50/p99: per affected deployment, until its Application exists on
//!   its new instance.
//!
//! A watch over every instance's Applications (one stream, ordered by
//! resourceVersion) counts `double_managed`: deployments whose Application exists
//! on two instances at once while neither is fenced. Then the lost instance's agent
//! comes back: `stale_writes` counts Applications it created or whose spec it
//! changed after its fence (its release only removes a finalizer and deletes), and
//! `rejoin_s` times its clean-up until it holds nothing of the tenants placed
//! elsewhere and its fence is lifted.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt, stream};
use gitops_testkit::argocd::{StandinOptions, application_resource};
use gitops_writer::api::GitOpsDeployment;
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use super::e2e::{create_deployment, create_namespace};
use crate::up::{DevError, DevStack, StackShape, instance_names};

/// How often the benchmark looks while waiting.
const LOOK_EVERY: Duration = Duration::from_millis(250);
/// How often progress is printed while waiting.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Engine instances the stack runs.
const INSTANCES: usize = 3;
/// The instance stopped (an index into the stack's instances).
const VICTIM: usize = 1;

/// What to run.
#[derive(Debug, Clone)]
pub struct FailoverBenchConfig {
    pub tenants: usize,
    pub deployments: usize,
    /// The agents' heartbeat (and probe) interval.
    pub heartbeat: Duration,
    /// How long without a heartbeat until an instance is lost.
    pub heartbeat_timeout: Duration,
    /// How long an instance stays lost before it is fenced and its tenants move.
    pub grace: Duration,
    /// How long to wait for each phase.
    pub deadline: Duration,
    pub dir: PathBuf,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum FailoverBenchError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("could not start the service")]
    Start { source: DevError },
    #[error("could not restart the lost instance's agent")]
    Child { source: DevError },
    #[error("database request failed: {step}")]
    Db { step: &'static str, source: tokio_postgres::Error },
    #[error("could not connect to the stack's database")]
    Connect { source: gitops_shared::db::DbError },
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("{what} not within {deadline:?}; the logs are in {dir}")]
    Deadline { what: &'static str, deadline: Duration, dir: PathBuf },
    #[error("a step of the end-to-end helpers failed")]
    Helper { source: super::e2e::E2eBenchError },
}

fn db(step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> FailoverBenchError {
    move |source| FailoverBenchError::Db { step, source }
}

/// The figures, printed as one JSON object. Durations in seconds from the moment
/// the instance was stopped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FailoverBenchReport {
    pub tenants: usize,
    pub deployments: usize,
    pub instances: usize,
    pub heartbeat_s: f64,
    pub heartbeat_timeout_s: f64,
    pub grace_s: f64,
    pub lost_instance: String,
    pub affected_tenants: usize,
    pub affected_deployments: usize,
    pub detect_s: Option<f64>,
    pub all_replaced_s: Option<f64>,
    pub all_healthy_s: Option<f64>,
    pub move_gap_p50_s: Option<f64>,
    pub move_gap_p99_s: Option<f64>,
    pub double_managed: usize,
    pub stale_writes: usize,
    /// From the lost instance's agent restart until it holds none of the moved
    /// tenants' Applications and is no longer fenced.
    pub rejoin_s: Option<f64>,
}

/// Runs the benchmark in `config.dir` and returns the figures.
pub async fn failover_bench(config: &FailoverBenchConfig) -> Result<FailoverBenchReport, FailoverBenchError> {
    if config.tenants < INSTANCES || config.deployments < config.tenants {
        return Err(FailoverBenchError::Usage("need a tenant per instance and a deployment per tenant"));
    }
    if config.heartbeat >= config.heartbeat_timeout {
        return Err(FailoverBenchError::Usage("the heartbeat timeout must be longer than the heartbeat"));
    }
    let millis = |d: Duration| format!("{}ms", d.as_millis());
    let shape = StackShape {
        writers: 1,
        agents: 1,
        instances: INSTANCES,
        webhook: false,
        writer_env: vec![("GITOPS_WRITER_FAILOVER_GRACE".to_owned(), millis(config.grace))],
        agent_env: vec![("GITOPS_AGENT_HEARTBEAT_INTERVAL".to_owned(), millis(config.heartbeat))],
        database_settings: vec![(
            "gitops.instance_lost_after".to_owned(),
            format!("{} milliseconds", config.heartbeat_timeout.as_millis()),
        )],
        ..StackShape::default()
    };
    let options = StandinOptions { resync: Duration::ZERO, ..StandinOptions::default() };
    let mut stack = DevStack::start_shaped(&config.dir, options, &shape)
        .await
        .map_err(|source| FailoverBenchError::Start { source })?;
    eprintln!("service up: {}; run directory {}", stack.child_names().join(", "), stack.info.dir.display());
    let outcome = run(config, &mut stack).await;
    stack.stop().await;
    outcome
}

async fn run(config: &FailoverBenchConfig, stack: &mut DevStack) -> Result<FailoverBenchReport, FailoverBenchError> {
    let kube_client = stack.kube.clone();
    let database = gitops_shared::db::connect(&stack.info.database_url, "gitops-dev-bench")
        .await
        .map_err(|source| FailoverBenchError::Connect { source })?;
    let namespaces: Vec<String> = (0..config.tenants).map(|t| format!("failover-t{t:03}")).collect();
    stream::iter(namespaces.iter().map(|name| create_namespace(&kube_client, name)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| FailoverBenchError::Helper { source })?;
    let keys: Vec<(String, String)> =
        (0..config.deployments).map(|d| (namespaces[d % config.tenants].clone(), format!("d{d:05}"))).collect();
    stream::iter(keys.iter().map(|(namespace, name)| create_deployment(&kube_client, namespace, name)))
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await
        .map_err(|source| FailoverBenchError::Helper { source })?;
    eprintln!("{} deployments created over {} tenants; waiting until every one is Ready", keys.len(), namespaces.len());

    // Every instance's Applications, from one watch.
    let namespace_of: HashMap<String, String> =
        (0..INSTANCES).map(instance_names).map(|(instance, namespace)| (namespace, instance)).collect();
    let watch = Arc::new(Mutex::new(AppWatch::default()));
    let cancel = CancellationToken::new();
    let watch_task = tokio::spawn(watch_applications(
        kube_client.clone(),
        stack.info.database_url.clone(),
        namespace_of.clone(),
        watch.clone(),
        cancel.clone(),
    ));
    let everyone: BTreeSet<(String, String)> = keys.iter().cloned().collect();
    let started = Instant::now();
    wait_for(config, stack, "every deployment Ready before the loss", || async {
        let apps = watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).apps.clone();
        Ok(healthy_count(&kube_client, &everyone, &apps, None).await? == everyone.len())
    })
    .await?;
    eprintln!("all Ready after {:.1}s", started.elapsed().as_secs_f64());

    let (victim, victim_namespace) = instance_names(VICTIM);
    let rows = database
        .query(
            "SELECT t.namespace_name FROM tenant t JOIN engine_instance e ON e.id = t.engine_instance_id
              WHERE e.name = $1 AND t.row_state = 'active'",
            &[&victim],
        )
        .await
        .map_err(db("find the tenants of the instance to stop"))?;
    let affected_tenants: BTreeSet<String> = rows.iter().map(|row| row.get("namespace_name")).collect();
    let affected: BTreeSet<(String, String)> =
        keys.iter().filter(|(namespace, _)| affected_tenants.contains(namespace)).cloned().collect();
    let uids = deployment_uids(&kube_client, &affected).await?;
    eprintln!("stopping instance {victim}: {} tenants, {} deployments", affected_tenants.len(), affected.len());

    let stopped = Instant::now();
    watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).stopped = Some((stopped, victim_namespace.clone()));
    stack.stop_instance(VICTIM).await;

    let (mut detect_s, mut all_replaced_s, mut all_healthy_s) = (None, None, None);
    let mut progress = Instant::now();
    while stopped.elapsed() < config.deadline && all_healthy_s.is_none() {
        let at = stopped.elapsed().as_secs_f64();
        if detect_s.is_none() {
            let row = database
                .query_one(
                    "SELECT engine_instance_health(heartbeat_at, progress_at) AS health FROM engine_instance
                      WHERE name = $1",
                    &[&victim],
                )
                .await
                .map_err(db("read the instance's health"))?;
            if row.get::<_, String>("health") == "lost" {
                detect_s = Some(at);
                eprintln!("  {at:.1}s: {victim} reads lost");
            }
        }
        if all_replaced_s.is_none() {
            let tenants: Vec<&String> = affected_tenants.iter().collect();
            let row = database
                .query_one(
                    "SELECT count(*) AS left FROM tenant t JOIN engine_instance e ON e.name = $1
                      WHERE t.namespace_name = ANY($2) AND t.row_state = 'active'
                        AND (t.engine_instance_id = e.id OR t.move_state IS NOT NULL)",
                    &[&victim, &tenants],
                )
                .await
                .map_err(db("count the tenants left to move"))?;
            if row.get::<_, i64>("left") == 0 {
                all_replaced_s = Some(at);
                eprintln!("  {at:.1}s: every tenant of {victim} placed elsewhere");
            }
        }
        let apps = watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).apps.clone();
        let healthy = healthy_count(&kube_client, &affected, &apps, Some(&victim_namespace)).await?;
        if healthy == affected.len() && all_replaced_s.is_some() {
            all_healthy_s = Some(at);
            eprintln!("  {at:.1}s: every affected deployment healthy elsewhere");
        }
        if progress.elapsed() >= PROGRESS_EVERY {
            eprintln!("  {at:.0}s: {healthy}/{} affected deployments healthy elsewhere", affected.len());
            progress = Instant::now();
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    if all_healthy_s.is_none() {
        cancel.cancel();
        let _ = watch_task.await;
        return Err(FailoverBenchError::Deadline {
            what: "the lost instance's deployments healthy elsewhere",
            deadline: config.deadline,
            dir: stack.info.dir.clone(),
        });
    }

    // The lost instance comes back: it must clean up before anything else.
    eprintln!("restarting {victim}'s agent");
    let restarted = Instant::now();
    stack.restart_instance_agents(VICTIM, None).map_err(|source| FailoverBenchError::Child { source })?;
    let moved_names: HashSet<String> = uids.values().cloned().collect();
    let mut rejoin_s = None;
    while restarted.elapsed() < config.deadline {
        let fenced: bool = database
            .query_one("SELECT fenced_at IS NOT NULL AS fenced FROM engine_instance WHERE name = $1", &[&victim])
            .await
            .map_err(db("read the fence"))?
            .get("fenced");
        let held = {
            let watch = watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            moved_names
                .iter()
                .filter(|name| watch.apps.get(*name).is_some_and(|at| at.contains(&victim_namespace)))
                .count()
        };
        if !fenced && held == 0 {
            rejoin_s = Some(restarted.elapsed().as_secs_f64());
            break;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    // Writes the returning agent might still make are seen by the watch meanwhile.
    tokio::time::sleep(config.heartbeat * 2).await;
    cancel.cancel();
    let _ = watch_task.await;

    let watch = watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut gaps: Vec<f64> = uids.values().filter_map(|name| watch.adopted.get(name).copied()).collect();
    gaps.sort_by(f64::total_cmp);
    let quantile = |q: f64| -> Option<f64> {
        if gaps.is_empty() || gaps.len() < uids.len() {
            return None;
        }
        let index = ((gaps.len() as f64) * q).ceil() as usize;
        gaps.get(index.saturating_sub(1).min(gaps.len() - 1)).copied()
    };
    Ok(FailoverBenchReport {
        tenants: config.tenants,
        deployments: keys.len(),
        instances: INSTANCES,
        heartbeat_s: config.heartbeat.as_secs_f64(),
        heartbeat_timeout_s: config.heartbeat_timeout.as_secs_f64(),
        grace_s: config.grace.as_secs_f64(),
        lost_instance: victim,
        affected_tenants: affected_tenants.len(),
        affected_deployments: affected.len(),
        detect_s,
        all_replaced_s,
        all_healthy_s,
        move_gap_p50_s: quantile(0.5),
        move_gap_p99_s: quantile(0.99),
        double_managed: watch.double_managed.len(),
        stale_writes: watch.stale_writes,
        rejoin_s,
    })
}

/// Polls `done` every [`LOOK_EVERY`] until it says true, or fails at the deadline.
async fn wait_for<F, Fut>(
    config: &FailoverBenchConfig,
    stack: &DevStack,
    what: &'static str,
    mut done: F,
) -> Result<(), FailoverBenchError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, FailoverBenchError>>,
{
    let started = Instant::now();
    while started.elapsed() < config.deadline {
        if done().await? {
            return Ok(());
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    Err(FailoverBenchError::Deadline { what, deadline: config.deadline, dir: stack.info.dir.clone() })
}

/// The Application name of each deployment of `keys`.
async fn deployment_uids(
    client: &kube::Client,
    keys: &BTreeSet<(String, String)>,
) -> Result<BTreeMap<(String, String), String>, FailoverBenchError> {
    let all = Api::<GitOpsDeployment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| FailoverBenchError::Kube { step: "list GitOpsDeployments", source })?;
    Ok(all
        .items
        .iter()
        .filter_map(|object| {
            let key = (object.metadata.namespace.clone()?, object.metadata.name.clone()?);
            let uid = object.metadata.uid.as_deref()?.parse().ok()?;
            keys.contains(&key).then(|| (key, gitops_agent::names::application_name(uid)))
        })
        .collect())
}

/// How many deployments of `keys` are Ready at their generation, Synced and Healthy,
/// with their Application on an instance other than `not_in` (any, when None).
async fn healthy_count(
    client: &kube::Client,
    keys: &BTreeSet<(String, String)>,
    apps: &HashMap<String, BTreeSet<String>>,
    not_in: Option<&str>,
) -> Result<usize, FailoverBenchError> {
    let all = Api::<GitOpsDeployment>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|source| FailoverBenchError::Kube { step: "list GitOpsDeployments", source })?;
    let mut healthy = 0;
    for object in &all.items {
        let key =
            (object.metadata.namespace.clone().unwrap_or_default(), object.metadata.name.clone().unwrap_or_default());
        if !keys.contains(&key) {
            continue;
        }
        let uid = object.metadata.uid.as_deref().and_then(|u| u.parse().ok()).unwrap_or_default();
        let placed = apps
            .get(&gitops_agent::names::application_name(uid))
            .is_some_and(|at| at.iter().any(|namespace| Some(namespace.as_str()) != not_in));
        let good = object.status.as_ref().is_some_and(|status| {
            let ready = status.conditions.iter().any(|c| {
                c.type_ == "Ready" && c.status == "True" && c.observed_generation == object.metadata.generation
            });
            let synced = status.sync.as_ref().is_some_and(|s| s.status == "Synced");
            let health = status.health.as_ref().is_some_and(|h| h.status == "Healthy");
            ready && synced && health
        });
        healthy += usize::from(placed && good);
    }
    Ok(healthy)
}

/// What the watch over every instance's Applications saw.
#[derive(Debug, Default)]
struct AppWatch {
    /// Application name → the Argo CD namespaces holding it now.
    apps: HashMap<String, BTreeSet<String>>,
    /// (namespace, name) → the spec last seen.
    specs: HashMap<(String, String), serde_json::Value>,
    /// When the instance was stopped, and its namespace.
    stopped: Option<(Instant, String)>,
    /// Application name → seconds from the stop until it appeared on another instance.
    adopted: HashMap<String, f64>,
    /// Deployments seen on two unfenced instances at once.
    double_managed: HashSet<String>,
    /// Applications created, or their spec changed, on a fenced instance.
    stale_writes: usize,
}

/// Follows every Application the agents manage, in every namespace, until `cancel`.
async fn watch_applications(
    client: kube::Client,
    url: String,
    namespace_of: HashMap<String, String>,
    state: Arc<Mutex<AppWatch>>,
    cancel: CancellationToken,
) {
    let Ok(database) = gitops_shared::db::connect(&url, "gitops-dev-bench").await else {
        eprintln!("  the Application watch could not reach the database");
        return;
    };
    let api: Api<DynamicObject> = Api::all_with(client, &application_resource());
    let selector = format!("{}={}", gitops_agent::names::MANAGED_BY_LABEL, gitops_agent::names::MANAGED_BY_VALUE);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default().labels(&selector)));
    loop {
        let event = tokio::select! {
            () = cancel.cancelled() => return,
            event = events.next() => event,
        };
        let Some(event) = event else { return };
        let (object, deleted) = match event {
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => (object, false),
            Ok(watcher::Event::Delete(object)) => (object, true),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            Err(error) => {
                eprintln!("  Application watch: {error}");
                continue;
            }
        };
        let (Some(name), Some(namespace)) = (object.metadata.name.clone(), object.metadata.namespace.clone()) else {
            continue;
        };
        if deleted {
            let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(at) = state.apps.get_mut(&name) {
                at.remove(&namespace);
            }
            state.specs.remove(&(namespace, name));
            continue;
        }
        let spec = object.data.get("spec").cloned().unwrap_or_default();
        let (others, spec_changed, after_stop) = {
            let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let previous = state.specs.insert((namespace.clone(), name.clone()), spec.clone());
            let at = state.apps.entry(name.clone()).or_default();
            at.insert(namespace.clone());
            let others: Vec<String> = at.iter().filter(|other| **other != namespace).cloned().collect();
            let after_stop = state.stopped.clone();
            if let Some((stopped, victim)) = &after_stop
                && *victim != namespace
                && !others.is_empty()
            {
                let gap = stopped.elapsed().as_secs_f64();
                state.adopted.entry(name.clone()).or_insert(gap);
            }
            (others, previous.as_ref() != Some(&spec), after_stop)
        };
        // Fences are read after the event: a fence that came before it is seen.
        let mut involved = others.clone();
        involved.push(namespace.clone());
        let instances: Vec<String> = involved.iter().filter_map(|ns| namespace_of.get(ns).cloned()).collect();
        let Ok(rows) = database
            .query(
                "SELECT argocd_namespace, fenced_at IS NOT NULL AS fenced FROM engine_instance WHERE name = ANY($1)",
                &[&instances],
            )
            .await
        else {
            continue;
        };
        let fenced: HashSet<String> =
            rows.iter().filter(|row| row.get::<_, bool>("fenced")).map(|row| row.get("argocd_namespace")).collect();
        let mut state = state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !others.is_empty() && !fenced.contains(&namespace) && others.iter().any(|other| !fenced.contains(other)) {
            eprintln!("  {name} held by {namespace} and {others:?}, none fenced");
            state.double_managed.insert(name.clone());
        }
        if spec_changed && after_stop.is_some() && fenced.contains(&namespace) {
            eprintln!("  {name} written in {namespace} while its instance is fenced");
            state.stale_writes += 1;
        }
    }
}
