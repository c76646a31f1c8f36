//! `gitops-dev bench appstudio`: the AppStudio layer at scale on the `dev` stack
//! (writer, agent, Argo CD stand-in and gitops-appstudio as child processes). N
//! namespaces each get one Application with C Components, E Environments (no
//! target: home deployments), a Snapshot and a SnapshotEnvironmentBinding per
//! Environment, so N × C × E GitOpsDeployments. The benchmark plays the repository
//! generator: it writes each binding's `status.components` (a path per component and
//! Environment, and the commit the Argo CD stand-in will report for it). It times
//! from the first binding created until every binding says "C of C components
//! deployed". Then P namespaces promote a second Snapshot into their last
//! Environment at once; the generator answers each re-pointed binding with new
//! paths and commits (otherwise a promotion would find its deployments done at
//! once), and each PromotionRun is timed until `Complete`/`Success`.
//!
//! Compare the first figure with `bench e2e` for the same number of deployments in
//! the same sitting: the layer's share is the difference.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt, stream};
use gitops_appstudio::api::{PromotionRun, SnapshotEnvironmentBinding};
use gitops_testkit::argocd::{StandinOptions, fake_revision};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cpu::process_s;
use super::e2e::{create_namespace, peak_rss_mb, percentile};
use crate::up::{DEFAULT_INSTANCE_CAPACITY, DevError, DevStack, StackShape};

/// The GitOps repository every binding's components live in; never fetched.
const REPO_URL: &str = "https://git.example.invalid/bench/gitops.git";
const BRANCH: &str = "main";
/// The Snapshot every binding starts on, and the one promoted.
const FIRST_SNAPSHOT: &str = "s1";
const PROMOTED_SNAPSHOT: &str = "s2";
const APPLICATION: &str = "app";

/// What to run.
#[derive(Debug, Clone)]
pub struct AppStudioBenchConfig {
    pub namespaces: usize,
    pub components: usize,
    pub environments: usize,
    /// Namespaces that promote a second Snapshot at once.
    pub promotions: usize,
    /// Requests in flight while creating.
    pub concurrency: usize,
    /// How long to wait for every binding, and again for every promotion.
    pub deadline: Duration,
    pub dir: PathBuf,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum AppStudioBenchError {
    #[error("{0}")]
    Usage(&'static str),
    #[error("could not start the service")]
    Start { source: DevError },
    #[error("gitops-appstudio is not running: build it beside gitops-dev (cargo build --release -p gitops-appstudio)")]
    NoLayer,
    #[error("a child process stopped")]
    Child { source: DevError },
    #[error("could not build an AppStudio object")]
    Object(#[source] serde_json::Error),
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("could not create {step}")]
    Create { step: &'static str, source: Box<super::e2e::E2eBenchError> },
    #[error("only {got} of {want} {what} within {deadline:?}; the logs are in {dir}")]
    Timeout { what: &'static str, got: usize, want: usize, deadline: Duration, dir: PathBuf },
}

fn kube(step: &'static str) -> impl FnOnce(kube::Error) -> AppStudioBenchError {
    move |source| AppStudioBenchError::Kube { step, source }
}

/// The figures, printed as one JSON object.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AppStudioBenchReport {
    pub namespaces: usize,
    pub components: usize,
    pub environments: usize,
    pub deployments: usize,
    /// Creating the namespaces' Applications, Components, Environments and Snapshots.
    pub model_created_s: f64,
    /// From the first binding created until every binding said "C of C components deployed".
    pub bindings_to_deployed_s: f64,
    /// Deployments a second over that stretch.
    pub deployed_per_s: f64,
    /// The layer's binding reconciles over that stretch, per binding (from its
    /// `gitops_appstudio_reconciles_total`; None if it could not be read).
    pub binding_reconciles_per_binding: Option<f64>,
    pub promotions: usize,
    /// From the first PromotionRun created until every one was Complete/Success.
    pub promotions_complete_s: f64,
    /// Each promotion's own time, from its creation to Complete/Success.
    pub promotion_ms: Percentiles,
    /// Peak RSS (VmHWM) of each child, and of this process (emulator, stand-in, clients).
    pub appstudio_rss_mb: f64,
    pub writer_rss_mb: f64,
    pub agent_rss_mb: f64,
    pub stack_rss_mb: f64,
    /// CPU seconds of the layer and of the core over the whole run.
    pub appstudio_cpu_s: f64,
    pub writer_cpu_s: f64,
    pub agent_cpu_s: f64,
}

/// Nearest-rank percentiles.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(mut values: Vec<f64>) -> Percentiles {
        values.sort_by(f64::total_cmp);
        Percentiles { p50: percentile(&values, 0.50), p99: percentile(&values, 0.99), max: percentile(&values, 1.0) }
    }
}

/// What the watches have seen.
#[derive(Debug, Default)]
struct Seen {
    /// Bindings (namespace/name) whose every component is deployed.
    deployed: HashSet<String>,
    /// Promotions (namespace/name) complete and successful, with when that was seen.
    promoted: HashMap<String, Instant>,
    /// Promotions (namespace/name) complete without success.
    failed: HashSet<String>,
}

/// Runs the benchmark; the stack is stopped whatever the outcome.
pub async fn appstudio_bench(config: &AppStudioBenchConfig) -> Result<AppStudioBenchReport, AppStudioBenchError> {
    if config.namespaces == 0 || config.components == 0 || config.environments == 0 {
        return Err(AppStudioBenchError::Usage("need at least one namespace, component and environment"));
    }
    if config.promotions > config.namespaces {
        return Err(AppStudioBenchError::Usage("--promotions cannot exceed --namespaces"));
    }
    let options = StandinOptions { resync: Duration::ZERO, ..StandinOptions::default() };
    let shape = StackShape {
        instance_capacity: i32::try_from(config.namespaces).unwrap_or(i32::MAX).max(DEFAULT_INSTANCE_CAPACITY),
        ..StackShape::default()
    };
    let mut stack = DevStack::start_shaped(&config.dir, options, &shape)
        .await
        .map_err(|source| AppStudioBenchError::Start { source })?;
    eprintln!("service up; run directory {}", stack.info.dir.display());
    let cancel = CancellationToken::new();
    let outcome = match stack.pid("gitops-appstudio") {
        None => Err(AppStudioBenchError::NoLayer),
        Some(_) => measure(config, &mut stack, &cancel).await,
    };
    let rss = |binary: &str| stack.pid(binary).map(peak_rss_mb).unwrap_or_default();
    let cpu = |binary: &str| process_s(stack.pid(binary));
    let (appstudio_rss_mb, writer_rss_mb, agent_rss_mb) =
        (rss("gitops-appstudio"), rss("gitops-writer"), rss("gitops-agent"));
    let (appstudio_cpu_s, writer_cpu_s, agent_cpu_s) =
        (cpu("gitops-appstudio"), cpu("gitops-writer"), cpu("gitops-agent"));
    let stack_rss_mb = peak_rss_mb(std::process::id());
    cancel.cancel();
    stack.stop().await;
    let measured = outcome?;
    let deployments = config.namespaces * config.components * config.environments;
    Ok(AppStudioBenchReport {
        namespaces: config.namespaces,
        components: config.components,
        environments: config.environments,
        deployments,
        model_created_s: measured.model_created_s,
        bindings_to_deployed_s: measured.bindings_to_deployed_s,
        deployed_per_s: deployments as f64 / measured.bindings_to_deployed_s,
        binding_reconciles_per_binding: measured
            .binding_reconciles
            .map(|n| n / (deployments / config.components) as f64),
        promotions: config.promotions,
        promotions_complete_s: measured.promotions_complete_s,
        promotion_ms: measured.promotion_ms,
        appstudio_rss_mb,
        writer_rss_mb,
        agent_rss_mb,
        stack_rss_mb,
        appstudio_cpu_s,
        writer_cpu_s,
        agent_cpu_s,
    })
}

struct Measured {
    model_created_s: f64,
    bindings_to_deployed_s: f64,
    binding_reconciles: Option<f64>,
    promotions_complete_s: f64,
    promotion_ms: Percentiles,
}

fn namespace_name(index: usize) -> String {
    format!("bench-as{index:04}")
}

fn environment_name(index: usize) -> String {
    format!("env{index}")
}

fn component_name(index: usize) -> String {
    format!("c{index}")
}

fn binding_name(environment: &str) -> String {
    format!("{APPLICATION}-{environment}")
}

async fn measure(
    config: &AppStudioBenchConfig,
    stack: &mut DevStack,
    cancel: &CancellationToken,
) -> Result<Measured, AppStudioBenchError> {
    let client = stack.kube.clone();
    let layer_metrics = stack.info.components.iter().find(|c| c.name.starts_with("gitops-appstudio"));
    let layer_metrics = layer_metrics.map(|c| c.metrics_url.clone()).unwrap_or_default();
    let binding_reconciles =
        || super::scrape(&layer_metrics, "gitops_appstudio_reconciles_total{controller=\"binding\"}");
    let (seen_tx, seen) = watch::channel(Seen::default());
    let seen_tx = Arc::new(seen_tx);
    let generator = Generator { client: client.clone(), components: config.components };
    tokio::spawn(watch_bindings(generator, config.components, seen_tx.clone(), cancel.clone()));
    tokio::spawn(watch_promotions(client.clone(), seen_tx, cancel.clone()));

    let namespaces: Vec<String> = (0..config.namespaces).map(namespace_name).collect();
    let started = Instant::now();
    stream::iter(namespaces.iter().map(|namespace| create_model(&client, config, namespace)))
        .buffer_unordered(config.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let model_created_s = started.elapsed().as_secs_f64();
    eprintln!("{} namespaces with their application model created in {model_created_s:.1}s", config.namespaces);

    let bindings: Vec<(String, String)> = namespaces
        .iter()
        .flat_map(|namespace| (0..config.environments).map(move |e| (namespace.clone(), environment_name(e))))
        .collect();
    let reconciles_before = binding_reconciles().await;
    let started = Instant::now();
    stream::iter(
        bindings.iter().map(|(namespace, environment)| create_binding(&client, config, namespace, environment)),
    )
    .buffer_unordered(config.concurrency)
    .try_collect::<Vec<()>>()
    .await?;
    eprintln!("{} bindings created in {:.1}s", bindings.len(), started.elapsed().as_secs_f64());
    let want = bindings.len();
    wait(stack, config, seen.clone(), "bindings with every component deployed", |s| s.deployed.len(), want).await?;
    let bindings_to_deployed_s = started.elapsed().as_secs_f64();
    let binding_reconciles = binding_reconciles().await.zip(reconciles_before).map(|(after, before)| after - before);
    eprintln!("every binding deployed after {bindings_to_deployed_s:.2}s");

    let target = environment_name(config.environments - 1);
    let promoting: Vec<String> = namespaces.iter().take(config.promotions).cloned().collect();
    for namespace in &promoting {
        create_snapshot(&client, config, namespace, PROMOTED_SNAPSHOT).await?;
    }
    let started = Instant::now();
    let created: Vec<(String, Instant)> =
        stream::iter(promoting.iter().map(|namespace| create_promotion(&client, namespace, &target)))
            .buffer_unordered(config.concurrency)
            .try_collect()
            .await?;
    let want = promoting.len();
    wait(stack, config, seen.clone(), "promotions complete", |s| s.promoted.len() + s.failed.len(), want).await?;
    let promotions_complete_s = started.elapsed().as_secs_f64();
    let seen = seen.borrow();
    if !seen.failed.is_empty() {
        eprintln!("{} promotions failed: {:?}", seen.failed.len(), seen.failed.iter().take(5).collect::<Vec<_>>());
        return Err(AppStudioBenchError::Timeout {
            what: "promotions successful",
            got: seen.promoted.len(),
            want,
            deadline: config.deadline,
            dir: stack.info.dir.clone(),
        });
    }
    eprintln!("every promotion complete after {promotions_complete_s:.2}s");
    let promotion_ms = Percentiles::of(
        created
            .iter()
            .filter_map(|(key, at)| seen.promoted.get(key).map(|done| done.saturating_duration_since(*at)))
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect(),
    );
    Ok(Measured { model_created_s, bindings_to_deployed_s, binding_reconciles, promotions_complete_s, promotion_ms })
}

/// Waits until `count` reaches `want` (see [`super::wait_until`]).
async fn wait(
    stack: &mut DevStack,
    config: &AppStudioBenchConfig,
    seen: watch::Receiver<Seen>,
    what: &'static str,
    count: fn(&Seen) -> usize,
    want: usize,
) -> Result<(), AppStudioBenchError> {
    let progress = |s: &Seen| format!("{what}: {} of {want}", count(s));
    match super::wait_until(stack, config.deadline, seen, count, want, progress).await {
        Ok(_) => Ok(()),
        Err(super::WaitFailed::Child(source)) => Err(AppStudioBenchError::Child { source }),
        Err(super::WaitFailed::Deadline { got }) => Err(AppStudioBenchError::Timeout {
            what,
            got,
            want,
            deadline: config.deadline,
            dir: stack.info.dir.clone(),
        }),
    }
}

/// `namespace/name` of an object, as the report keys them.
fn key(meta: &kube::core::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

fn appstudio_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("appstudio.redhat.com", "v1alpha1", kind), plural)
}

async fn create(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
    plural: &str,
    object: Value,
) -> Result<(), AppStudioBenchError> {
    let resource = appstudio_resource(kind, plural);
    let mut object: DynamicObject = serde_json::from_value(object).map_err(AppStudioBenchError::Object)?;
    object.types = Some(kube::core::TypeMeta { api_version: resource.api_version.clone(), kind: kind.to_owned() });
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .create(&PostParams::default(), &object)
        .await
        .map_err(kube("create an AppStudio object"))?;
    Ok(())
}

/// A namespace's Application, Components, Environments and first Snapshot.
async fn create_model(
    client: &kube::Client,
    config: &AppStudioBenchConfig,
    namespace: &str,
) -> Result<(), AppStudioBenchError> {
    create_namespace(client, namespace)
        .await
        .map_err(|source| AppStudioBenchError::Create { step: "a namespace", source: Box::new(source) })?;
    let application = json!({"metadata": {"name": APPLICATION}, "spec": {"displayName": "Bench"}});
    create(client, namespace, "Application", "applications", application).await?;
    for c in 0..config.components {
        let component = json!({"metadata": {"name": component_name(c)},
                               "spec": {"application": APPLICATION, "componentName": component_name(c)}});
        create(client, namespace, "Component", "components", component).await?;
    }
    for e in 0..config.environments {
        let environment = json!({"metadata": {"name": environment_name(e)},
                                 "spec": {"displayName": environment_name(e), "deploymentStrategy": "Manual"}});
        create(client, namespace, "Environment", "environments", environment).await?;
    }
    create_snapshot(client, config, namespace, FIRST_SNAPSHOT).await
}

async fn create_snapshot(
    client: &kube::Client,
    config: &AppStudioBenchConfig,
    namespace: &str,
    name: &str,
) -> Result<(), AppStudioBenchError> {
    let components: Vec<Value> = (0..config.components)
        .map(|c| json!({"name": component_name(c), "containerImage": format!("registry.example.invalid/{namespace}/c{c}:{name}")}))
        .collect();
    let snapshot = json!({"metadata": {"name": name}, "spec": {"application": APPLICATION, "components": components}});
    create(client, namespace, "Snapshot", "snapshots", snapshot).await
}

async fn create_binding(
    client: &kube::Client,
    config: &AppStudioBenchConfig,
    namespace: &str,
    environment: &str,
) -> Result<(), AppStudioBenchError> {
    let components: Vec<Value> = (0..config.components).map(|c| json!({"name": component_name(c)})).collect();
    let binding = json!({"metadata": {"name": binding_name(environment)},
                         "spec": {"application": APPLICATION, "environment": environment,
                                  "snapshot": FIRST_SNAPSHOT, "components": components}});
    create(client, namespace, "SnapshotEnvironmentBinding", "snapshotenvironmentbindings", binding).await
}

async fn create_promotion(
    client: &kube::Client,
    namespace: &str,
    target: &str,
) -> Result<(String, Instant), AppStudioBenchError> {
    let name = format!("promote-{PROMOTED_SNAPSHOT}");
    let run = json!({"metadata": {"name": name},
                     "spec": {"application": APPLICATION, "snapshot": PROMOTED_SNAPSHOT,
                              "manualPromotion": {"targetEnvironment": target}}});
    let at = Instant::now();
    create(client, namespace, "PromotionRun", "promotionruns", run).await?;
    Ok((format!("{namespace}/{name}"), at))
}

/// What the repository generator commits for one component of a binding: its path
/// for the Environment and Snapshot, and the commit the stand-in reports for it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Generated {
    component: String,
    path: String,
    commit: String,
}

fn generated(components: usize, environment: &str, snapshot: &str) -> Vec<Generated> {
    (0..components)
        .map(|c| {
            let path = format!("components/c{c}/overlays/{environment}/{snapshot}");
            let commit = fake_revision(REPO_URL, &path, BRANCH);
            Generated { component: component_name(c), path, commit }
        })
        .collect()
}

/// Plays the repository generator for every binding.
#[derive(Clone)]
struct Generator {
    client: kube::Client,
    components: usize,
}

impl Generator {
    /// Writes the status for the binding's current snapshot unless it is there.
    async fn answer(&self, binding: &SnapshotEnvironmentBinding) -> Result<(), kube::Error> {
        let (Some(namespace), Some(name)) = (&binding.metadata.namespace, &binding.metadata.name) else {
            return Ok(());
        };
        let want = generated(self.components, &binding.spec.environment, &binding.spec.snapshot);
        let have: Vec<Generated> = binding
            .status
            .iter()
            .flat_map(|status| &status.components)
            .map(|c| Generated {
                component: c.name.clone(),
                path: c.gitops_repository.path.clone(),
                commit: c.gitops_repository.commit_id.clone(),
            })
            .collect();
        if have == want {
            return Ok(());
        }
        let components: Vec<Value> = want
            .iter()
            .map(|g| {
                json!({"name": g.component,
                       "gitopsRepository": {"url": REPO_URL, "branch": BRANCH, "path": g.path,
                                            "generatedResources": [], "commitID": g.commit}})
            })
            .collect();
        let patch = json!({"status": {"components": components}});
        Api::<SnapshotEnvironmentBinding>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }
}

/// Every binding: answered as the repository generator, and counted once every
/// component is deployed.
async fn watch_bindings(
    generator: Generator,
    components: usize,
    seen: Arc<watch::Sender<Seen>>,
    cancel: CancellationToken,
) {
    let api: Api<SnapshotEnvironmentBinding> = Api::all(generator.client.clone());
    let all_deployed = format!("{components} of {components} components deployed");
    super::for_each_applied(api, cancel, "SnapshotEnvironmentBinding", |binding| {
        let deployed = binding.status.as_ref().is_some_and(|status| {
            status.component_deployment_conditions.iter().any(|c| {
                c.type_ == gitops_appstudio::binding::status::ALL_COMPONENTS_DEPLOYED
                    && c.status == "True"
                    && c.message == all_deployed
            })
        });
        if deployed && binding.spec.snapshot == FIRST_SNAPSHOT {
            let key = key(&binding.metadata);
            seen.send_if_modified(|s| s.deployed.insert(key));
        }
        // In a task of its own, so a slow patch does not hold the watch; a second
        // event for the binding may overlap it, and the later patch wins.
        let generator = generator.clone();
        tokio::spawn(async move {
            if let Err(error) = generator.answer(&binding).await {
                tracing::warn!(%error, "could not write a binding's status");
            }
        });
    })
    .await;
}

async fn watch_promotions(client: kube::Client, seen: Arc<watch::Sender<Seen>>, cancel: CancellationToken) {
    let api: Api<PromotionRun> = Api::all(client);
    super::for_each_applied(api, cancel, "PromotionRun", |run| {
        let Some(status) = run.status.as_ref() else { return };
        if status.state != gitops_appstudio::promotion::STATE_COMPLETE {
            return;
        }
        let key = key(&run.metadata);
        let success = status.completion_result.as_deref() == Some(gitops_appstudio::promotion::RESULT_SUCCESS);
        let now = Instant::now();
        seen.send_if_modified(|s| if success { s.promoted.insert(key, now).is_none() } else { s.failed.insert(key) });
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let p = Percentiles::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((p.p50, p.p99, p.max), (50.0, 99.0, 100.0));
        let none = Percentiles::of(Vec::new());
        assert_eq!((none.p50, none.max), (0.0, 0.0));
    }

    #[test]
    fn the_generator_commits_a_path_per_component_environment_and_snapshot() {
        let first = generated(2, "env0", FIRST_SNAPSHOT);
        let promoted = generated(2, "env0", PROMOTED_SNAPSHOT);
        let elsewhere = generated(2, "env1", FIRST_SNAPSHOT);
        assert_eq!(first.len(), 2);
        assert_eq!(first[1].component, "c1");
        assert_eq!(first[0].path, "components/c0/overlays/env0/s1");
        assert_eq!(first[0].commit, fake_revision(REPO_URL, "components/c0/overlays/env0/s1", BRANCH));
        assert_ne!(first[0].commit, promoted[0].commit, "a promoted snapshot is a new commit");
        assert_ne!(first[0].commit, elsewhere[0].commit, "each environment has its own");
        assert_ne!(first[0].commit, first[1].commit, "each component has its own");
    }
}
