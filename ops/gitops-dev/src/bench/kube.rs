//! `gitops-dev bench kube`: how the Kubernetes API emulator holds up with tens of
//! thousands of Argo CD Applications — creating them, listing them (whole, paged,
//! by label) and watching them — through the real kube client. With
//! `--kubeconfig` the same figures come from any cluster, for comparison.
//!
//! Once filled, it measures the steady state a test double must keep flat: one
//! write at a time (a merge patch on an object spread over the whole set) and, for
//! each, when a watcher opened before it receives its event. Their medians at
//! 25,000 and 100,000 objects show whether cost grows with what is stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use gitops_testkit::argocd::application_crd;
use gitops_testkit::kube_emulator::{EmulatorOptions, KubeEmulator};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Config};
use serde_json::json;

/// What to run.
#[derive(Debug, Clone)]
pub struct KubeBenchConfig {
    pub objects: usize,
    /// Requests in flight while creating.
    pub concurrency: usize,
    /// A cluster to measure instead of a fresh in-process emulator.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Writes measured one at a time once the objects exist.
    pub steady_writes: usize,
}

/// Why the benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum KubeBenchError {
    #[error("could not start the Kubernetes emulator: {0}")]
    Emulator(String),
    #[error("could not read the kubeconfig")]
    Kubeconfig { source: kube::config::KubeconfigError },
    #[error("Kubernetes request failed: {step}")]
    Kube { step: &'static str, source: kube::Error },
    #[error("the watch did not deliver every event within {0:?}")]
    WatchStalled(Duration),
    #[error("expected {want} objects back, got {got}")]
    Count { want: usize, got: usize },
}

fn kube(step: &'static str) -> impl FnOnce(kube::Error) -> KubeBenchError {
    move |source| KubeBenchError::Kube { step, source }
}

/// The figures, printed as one JSON object.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KubeBenchReport {
    pub server: String,
    pub objects: usize,
    pub create_per_s: f64,
    /// From the first create until a watch started before it has seen every object.
    pub watch_all_events_s: f64,
    pub list_all_ms: f64,
    pub list_paged_500_ms: f64,
    /// A label selector matching 1 % of the objects.
    pub list_selector_ms: f64,
    /// A fresh watcher (list, then watch) until its initial state is complete.
    pub watcher_initial_ms: f64,
    /// Steady state, one write at a time: the write's round trip (median, p99).
    pub write_p50_ms: f64,
    pub write_p99_ms: f64,
    /// From sending a write until a watcher has its event (median, p99).
    pub watch_event_p50_ms: f64,
    pub watch_event_p99_ms: f64,
    pub steady_writes: usize,
    /// Resident memory of this process (the in-process emulator included), MiB.
    pub rss_mb: Option<f64>,
}

/// Runs the benchmark; the emulator (if started) stops at the end.
pub async fn kube_bench(config: &KubeBenchConfig) -> Result<KubeBenchReport, KubeBenchError> {
    let (client, emulator, server) = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).map_err(|source| KubeBenchError::Kubeconfig { source })?;
            let kube_config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .map_err(|source| KubeBenchError::Kubeconfig { source })?;
            let client = Client::try_from(kube_config).map_err(kube("build a client"))?;
            (client, None, "kubeconfig".to_owned())
        }
        None => {
            let emulator = KubeEmulator::start(EmulatorOptions::default())
                .await
                .map_err(|e| KubeBenchError::Emulator(e.to_string()))?;
            (emulator.client().await, Some(emulator), "emulator".to_owned())
        }
    };
    let outcome = measure(config, &client, server).await;
    drop(emulator);
    outcome
}

async fn measure(config: &KubeBenchConfig, client: &Client, server: String) -> Result<KubeBenchReport, KubeBenchError> {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    let crd = application_crd();
    let crd_name = crd.metadata.name.clone().unwrap_or_default();
    if crds.get_opt(&crd_name).await.map_err(kube("look up the Application CRD"))?.is_none() {
        crds.create(&PostParams::default(), &crd).await.map_err(kube("create the Application CRD"))?;
    }
    kube::runtime::wait::await_condition(crds, &crd_name, kube::runtime::wait::conditions::is_crd_established())
        .await
        .map_err(|_| KubeBenchError::WatchStalled(Duration::ZERO))?;

    let namespace = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let namespaces = Api::<Namespace>::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap_or_default();
    namespaces.create(&PostParams::default(), &ns).await.map_err(kube("create the namespace"))?;

    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    );
    let apps = Api::<DynamicObject>::namespaced_with(client.clone(), &namespace, &resource);

    // A watch that starts before the first create and counts what it sees.
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    let mut stream = watcher::watcher(apps.clone(), watcher::Config::default()).boxed();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let watch_task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(Event::Apply(_)) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    });
    let _ = ready_rx.await;

    eprintln!("creating {} Applications in {namespace}", config.objects);
    let started = Instant::now();
    futures_util::stream::iter(0..config.objects)
        .map(|i| {
            let apps = apps.clone();
            async move {
                let app: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                    "metadata": {"name": format!("app-{i:06}"), "labels": {"bench/shard": (i % 100).to_string()}},
                    "spec": {
                        "project": "default",
                        "source": {"repoURL": "https://git.example.invalid/bench.git", "path": format!("apps/{i}"), "targetRevision": "HEAD"},
                        "destination": {"server": "https://kubernetes.default.svc", "namespace": "bench"}
                    }
                }))
                .map_err(kube::Error::SerdeError)?;
                apps.create(&PostParams::default(), &app).await
            }
        })
        .buffer_unordered(config.concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await
        .map_err(kube("create an Application"))?;
    let create_s = started.elapsed().as_secs_f64();

    let stall = Duration::from_secs(120);
    let deadline = Instant::now() + stall;
    while seen.load(Ordering::Relaxed) < config.objects as u64 {
        if Instant::now() > deadline {
            return Err(KubeBenchError::WatchStalled(stall));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let watch_all_events_s = started.elapsed().as_secs_f64();
    watch_task.abort();

    let timed = Instant::now();
    let all = apps.list(&ListParams::default()).await.map_err(kube("list all"))?;
    let list_all_ms = timed.elapsed().as_secs_f64() * 1000.0;
    assert_count(all.items.len(), config.objects)?;

    let timed = Instant::now();
    let mut paged = 0;
    let mut params = ListParams::default().limit(500);
    loop {
        let page = apps.list(&params).await.map_err(kube("list a page"))?;
        paged += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let list_paged_500_ms = timed.elapsed().as_secs_f64() * 1000.0;
    assert_count(paged, config.objects)?;

    let timed = Instant::now();
    let selected = apps.list(&ListParams::default().labels("bench/shard=7")).await.map_err(kube("list by label"))?;
    let list_selector_ms = timed.elapsed().as_secs_f64() * 1000.0;
    assert_count(selected.items.len(), config.objects / 100 + usize::from(config.objects % 100 > 7))?;

    let timed = Instant::now();
    let mut fresh = watcher::watcher(apps.clone(), watcher::Config::default()).boxed();
    let mut initial = 0usize;
    while let Some(event) = fresh.next().await {
        match event {
            Ok(Event::InitApply(_)) => initial += 1,
            Ok(Event::InitDone) => break,
            _ => {}
        }
    }
    let watcher_initial_ms = timed.elapsed().as_secs_f64() * 1000.0;
    assert_count(initial, config.objects)?;

    drop(fresh);
    let steady = steady_state(&apps, config.objects, config.steady_writes).await?;

    let rss_mb = rss_mb();
    let _ = namespaces.delete(&namespace, &DeleteParams::default()).await;
    Ok(KubeBenchReport {
        server,
        objects: config.objects,
        create_per_s: config.objects as f64 / create_s,
        watch_all_events_s,
        list_all_ms,
        list_paged_500_ms,
        list_selector_ms,
        watcher_initial_ms,
        write_p50_ms: percentile(&steady.writes, 0.5),
        write_p99_ms: percentile(&steady.writes, 0.99),
        watch_event_p50_ms: percentile(&steady.events, 0.5),
        watch_event_p99_ms: percentile(&steady.events, 0.99),
        steady_writes: steady.writes.len(),
        rss_mb,
    })
}

/// Milliseconds per steady-state write and per watch event.
struct Steady {
    writes: Vec<f64>,
    events: Vec<f64>,
}

/// `writes` merge patches, one at a time, each on a different object spread over
/// the set; a raw watch opened before the first gets each one's event.
async fn steady_state(apps: &Api<DynamicObject>, objects: usize, writes: usize) -> Result<Steady, KubeBenchError> {
    let first = apps.list(&ListParams::default().limit(1)).await.map_err(kube("list one"))?;
    let rv = first.metadata.resource_version.unwrap_or_default();
    let mut events = apps.watch(&WatchParams::default().timeout(290), &rv).await.map_err(kube("watch"))?.boxed();
    let mut steady = Steady { writes: Vec::with_capacity(writes), events: Vec::with_capacity(writes) };
    let stall = Duration::from_secs(30);
    for i in 0..writes {
        // A stride co-prime with any object count below it spreads the writes.
        let name = format!("app-{:06}", (i * 7_919) % objects.max(1));
        let patch = json!({"metadata": {"annotations": {"bench/touch": i.to_string()}}});
        let started = Instant::now();
        apps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(kube("patch"))?;
        steady.writes.push(started.elapsed().as_secs_f64() * 1000.0);
        loop {
            let event = tokio::time::timeout(stall, events.next())
                .await
                .map_err(|_| KubeBenchError::WatchStalled(stall))?
                .ok_or(KubeBenchError::WatchStalled(stall))?
                .map_err(kube("watch event"))?;
            if let WatchEvent::Modified(object) = event
                && object.metadata.name.as_deref() == Some(name.as_str())
            {
                break;
            }
        }
        steady.events.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(steady)
}

/// The `q` quantile of `samples` (0 when empty).
fn percentile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(index).copied().unwrap_or(0.0)
}

fn assert_count(got: usize, want: usize) -> Result<(), KubeBenchError> {
    if got == want { Ok(()) } else { Err(KubeBenchError::Count { want, got }) }
}

/// VmRSS of this process, from /proc.
fn rss_mb() -> Option<f64> {
    let stats = gitops_shared::process::ProcessStats::of_pid("self");
    stats.resident_bytes.map(|bytes| bytes as f64 / (1024.0 * 1024.0))
}
