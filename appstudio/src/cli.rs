//! `gitops-appstudio run`: flags (each also an environment variable), the Kubernetes
//! client, `/metrics`, `/healthz` and `/readyz`, and the controllers until SIGTERM.
//! The configuration is built by taking the arguments apart, so a flag that is not
//! used does not compile.

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use gitops_shared::config::parse_duration;
use gitops_shared::serve::{HealthEndpoints, serve_health};
use tokio_util::sync::CancellationToken;

use crate::context::Settings;
use crate::metrics::Metrics;

#[derive(Debug, Parser)]
#[command(
    name = "gitops-appstudio",
    version,
    about = "The GitOps service's AppStudio layer: AppStudio resources into core resources"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr: `text`, or `json` (one object per line). The level comes
    /// from RUST_LOG (`info` by default).
    #[arg(long, global = true, env = gitops_shared::telemetry::LOG_FORMAT, default_value_t)]
    pub log_format: gitops_shared::telemetry::LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controllers (Kubernetes only; no database).
    Run(RunArgs),
}

/// Flags of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Kubeconfig of the cluster with the AppStudio and core resources (default: as
    /// kube infers it).
    #[arg(long, env = "GITOPS_KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Serve only this namespace (default: all).
    #[arg(long, env = "GITOPS_APPSTUDIO_NAMESPACE")]
    pub namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "GITOPS_APPSTUDIO_METRICS_ADDRESS", default_value = "127.0.0.1:9467")]
    pub metrics_address: std::net::SocketAddr,
    /// How long a binding whose Application does not exist is kept before it is
    /// deleted, e.g. 3m (a bare number is seconds).
    #[arg(long, env = "GITOPS_APPSTUDIO_ORPHAN_BINDING_DELAY", value_parser = parse_duration, default_value = "3m")]
    pub orphan_binding_delay: Duration,
    /// How long a promotion may wait for its deployments to be Synced and Healthy
    /// before it fails, e.g. 10m.
    #[arg(long, env = "GITOPS_APPSTUDIO_PROMOTION_TIMEOUT", value_parser = parse_duration, default_value = "10m")]
    pub promotion_timeout: Duration,
    /// How long the SpaceRequest of a deleted DeploymentTarget (of a `Delete` class)
    /// may be terminating while it reports `UnableToTerminate` before the target's
    /// phase becomes `Failed`, e.g. 2m.
    #[arg(
        long,
        env = "GITOPS_APPSTUDIO_SPACE_REQUEST_TERMINATION_TIMEOUT",
        value_parser = parse_duration,
        default_value = "2m"
    )]
    pub space_request_termination_timeout: Duration,
    /// How often a deleted DeploymentTarget looks again whether its SpaceRequest is
    /// gone, and a deleted claim whether its target is (changes wake them sooner), e.g. 30s.
    #[arg(long, env = "GITOPS_APPSTUDIO_RECLAIM_POLL", value_parser = parse_duration, default_value = "30s")]
    pub reclaim_poll: Duration,
    /// At most this many bindings are reconciled at once (0: no limit).
    #[arg(long, env = "GITOPS_APPSTUDIO_BINDING_CONCURRENCY", default_value_t = 16)]
    pub binding_concurrency: u16,
    /// How often every object is reconciled again whatever happened, e.g. 10m.
    #[arg(long, env = "GITOPS_APPSTUDIO_RESYNC_INTERVAL", value_parser = parse_duration, default_value = "10m")]
    pub resync_interval: Duration,
    /// Accept loopback, link-local and cloud metadata addresses as the API URL of
    /// Environments and DeploymentTargets: set it exactly when the writer has
    /// `--api-url-allow-private` (single-tenant or test installations only).
    #[arg(long, env = "GITOPS_APPSTUDIO_API_URL_ALLOW_PRIVATE")]
    pub api_url_allow_private: bool,
    /// PEM certificate (chain) of the admission webhook's HTTPS server; read again
    /// when it changes. Without it the webhook is not served and the controllers'
    /// own checks are the only ones.
    #[arg(long, env = "GITOPS_APPSTUDIO_WEBHOOK_CERT_FILE", requires = "webhook_key_file")]
    pub webhook_cert_file: Option<std::path::PathBuf>,
    /// PEM private key of the admission webhook's HTTPS server.
    #[arg(long, env = "GITOPS_APPSTUDIO_WEBHOOK_KEY_FILE", requires = "webhook_cert_file")]
    pub webhook_key_file: Option<std::path::PathBuf>,
    /// Address the admission webhook listens on.
    #[arg(long, env = "GITOPS_APPSTUDIO_WEBHOOK_ADDRESS", default_value = "0.0.0.0:9443")]
    pub webhook_address: std::net::SocketAddr,
    /// The ClusterRole Argo CD acts with in a tenant's own namespace (the writer's
    /// `--home-cluster-role`): the webhook lets only who could grant it there make
    /// deployments go home.
    #[arg(long, env = "GITOPS_APPSTUDIO_HOME_CLUSTER_ROLE", default_value = "admin")]
    pub home_cluster_role: String,
    /// The layer's own username (the writer's `--appstudio-identity`): the bindings
    /// its promotions make are not checked again.
    #[arg(
        long,
        env = "GITOPS_APPSTUDIO_IDENTITY",
        default_value = "system:serviceaccount:gitops-service:gitops-appstudio"
    )]
    pub identity: String,
    /// Run the controllers only while holding the Lease `--lease-name` in
    /// `--lease-namespace`, so replicas take turns (the webhook and probes are
    /// served by every replica). Off: this process runs them at once.
    #[arg(long, env = "GITOPS_APPSTUDIO_LEADER_ELECT")]
    pub leader_elect: bool,
    /// The namespace of the leader Lease (the pod's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "gitops-service")]
    pub lease_namespace: String,
    /// The leader Lease's name.
    #[arg(long, env = "GITOPS_APPSTUDIO_LEASE_NAME", default_value = "gitops-appstudio")]
    pub lease_name: String,
    /// The tenant namespaces: the writer's selection, given the same values, so the
    /// layer makes nothing where the core serves nobody.
    #[command(flatten)]
    pub namespaces: gitops_writer::NamespaceSelectionArgs,
}

/// Why the layer stopped.
#[derive(Debug, thiserror::Error)]
pub enum AppStudioError {
    #[error("could not read the kubeconfig {path}")]
    Kubeconfig { path: std::path::PathBuf, source: kube::config::KubeconfigError },
    #[error("could not find a Kubernetes configuration")]
    InferKube { source: kube::config::InferConfigError },
    #[error("could not build a Kubernetes client")]
    KubeClient { source: kube::Error },
    #[error("could not listen on {address}")]
    Bind { address: std::net::SocketAddr, source: std::io::Error },
    #[error("could not start the admission webhook: {message}")]
    Webhook { message: String },
    #[error("stopped leading")]
    Leader { source: crate::leader::LeaderError },
}

/// Every environment variable `gitops-appstudio run` reads (manifests are checked
/// against it).
pub fn run_env_vars() -> Vec<String> {
    use clap::CommandFactory;
    let cli = Cli::command();
    let run = cli.find_subcommand("run").into_iter().flat_map(|run| run.get_arguments());
    cli.get_arguments()
        .chain(run)
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect()
}

/// Runs one command; returns what to print on stdout.
pub async fn execute(command: Command) -> Result<String, AppStudioError> {
    match command {
        Command::Run(args) => run(args).await.map(|()| String::new()),
    }
}

/// What `/metrics` and `/readyz` read.
#[derive(Clone)]
struct Endpoints {
    metrics: Arc<Metrics>,
    client: kube::Client,
}

impl HealthEndpoints for Endpoints {
    fn metrics(&self) -> String {
        self.metrics.render()
    }

    async fn readiness(&self) -> Result<(), String> {
        match self.client.apiserver_version().await {
            Ok(_) => Ok(()),
            Err(_) => Err("kubernetes_api_reachable=false".to_owned()),
        }
    }
}

/// Runs the controllers until SIGTERM or Ctrl-C.
pub async fn run(args: RunArgs) -> Result<(), AppStudioError> {
    let RunArgs {
        kubeconfig,
        namespace,
        metrics_address,
        orphan_binding_delay,
        promotion_timeout,
        space_request_termination_timeout,
        reclaim_poll,
        binding_concurrency,
        resync_interval,
        api_url_allow_private,
        webhook_cert_file,
        webhook_key_file,
        webhook_address,
        home_cluster_role,
        identity,
        leader_elect,
        lease_namespace,
        lease_name,
        namespaces:
            gitops_writer::NamespaceSelectionArgs {
                tenant_namespace_selector,
                tenant_namespaces,
                reserved_namespaces,
                service_namespaces,
            },
    } = args;
    let mut service: std::collections::BTreeSet<String> = service_namespaces.into_iter().collect();
    service.insert(lease_namespace.clone());
    service.insert(gitops_writer::controller::DEFAULT_HOME_NAMESPACE.to_owned());
    let tenancy = gitops_shared::tenancy::NamespacePolicy {
        selector: tenant_namespace_selector,
        patterns: tenant_namespaces,
        reserved: gitops_shared::tenancy::Reserved { service, extra: reserved_namespaces, engines: Default::default() },
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(&path)
                .map_err(|source| AppStudioError::Kubeconfig { path: path.clone(), source })?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|source| AppStudioError::Kubeconfig { path, source })?
        }
        None => kube::Config::infer().await.map_err(|source| AppStudioError::InferKube { source })?,
    };
    let client = kube::Client::try_from(config).map_err(|source| AppStudioError::KubeClient { source })?;
    let settings = Settings {
        orphan_binding_delay,
        promotion_timeout,
        space_request_termination_timeout,
        reclaim_poll,
        resync_interval,
        binding_concurrency,
        namespace,
        api_url_allow_private,
        tenancy,
        ..Settings::default()
    };
    let webhook = match webhook_cert_file.zip(webhook_key_file) {
        Some((cert_file, key_file)) => {
            let settings = gitops_writer::webhook::WebhookSettings { address: webhook_address, cert_file, key_file };
            Some(gitops_writer::webhook::bind(&settings).await.map_err(|source| AppStudioError::Webhook {
                message: gitops_shared::telemetry::error_chain(&source),
            })?)
        }
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(metrics_address)
        .await
        .map_err(|source| AppStudioError::Bind { address: metrics_address, source })?;
    tracing::info!(%metrics_address, namespace = settings.namespace.as_deref().unwrap_or("(all)"), "gitops-appstudio starting");
    let cancel = CancellationToken::new();
    tokio::spawn(gitops_shared::serve::cancel_on_signal(cancel.clone()));
    let metrics = Arc::new(Metrics::default());
    let endpoints = Endpoints { metrics: metrics.clone(), client: client.clone() };
    let http = tokio::spawn(serve_health(listener, endpoints, cancel.clone()));
    let webhook = webhook.map(|(socket, acceptor)| {
        tracing::info!(%webhook_address, "admission webhook serving");
        let reviewer = crate::webhook::Reviewer {
            client: client.clone(),
            allow_private: settings.api_url_allow_private,
            namespace: settings.namespace.clone(),
            metrics: metrics.clone(),
            home: crate::webhook::HomeCheck::new(client.clone(), home_cluster_role, identity),
            tenancy: settings.tenancy.clone(),
        };
        tokio::spawn(gitops_writer::webhook::serve(socket, acceptor, Arc::new(reviewer), cancel.clone()))
    });
    let led = if leader_elect {
        let election = crate::leader::LeaderSettings::new(lease_namespace, lease_name, crate::leader::identity());
        let elector = crate::leader::Elector::new(client.clone(), election);
        let leading = metrics.leading.clone();
        let (client, metrics) = (client.clone(), metrics.clone());
        elector
            .lead(cancel.clone(), leading, move |stop| crate::run::run_with_metrics(client, settings, metrics, stop))
            .await
    } else {
        metrics.leading.store(true, std::sync::atomic::Ordering::Relaxed);
        crate::run::run_with_metrics(client, settings, metrics.clone(), cancel.clone()).await;
        Ok(())
    };
    cancel.cancel();
    let _ = http.await;
    if let Some(webhook) = webhook {
        let _ = webhook.await;
    }
    led.map_err(|source| AppStudioError::Leader { source })?;
    tracing::info!("gitops-appstudio stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_every_flag_has_a_variable() {
        let cli = Cli::try_parse_from([
            "gitops-appstudio",
            "run",
            "--orphan-binding-delay",
            "90",
            "--promotion-timeout",
            "2m",
            "--space-request-termination-timeout",
            "5s",
        ])
        .expect("parses");
        let Command::Run(args) = cli.command;
        assert_eq!(args.orphan_binding_delay, Duration::from_secs(90));
        assert_eq!(args.promotion_timeout, Duration::from_secs(120));
        assert_eq!(args.resync_interval, Duration::from_secs(600));
        assert_eq!(args.space_request_termination_timeout, Duration::from_secs(5));
        assert_eq!(args.reclaim_poll, Duration::from_secs(30), "the original's 30 seconds by default");
        let names = run_env_vars();
        for name in [
            "GITOPS_KUBECONFIG",
            "GITOPS_APPSTUDIO_NAMESPACE",
            "GITOPS_APPSTUDIO_METRICS_ADDRESS",
            "GITOPS_APPSTUDIO_PROMOTION_TIMEOUT",
            "GITOPS_APPSTUDIO_SPACE_REQUEST_TERMINATION_TIMEOUT",
            "GITOPS_APPSTUDIO_RECLAIM_POLL",
        ] {
            assert!(names.iter().any(|n| n == name), "{name} missing from {names:?}");
        }
        assert!(Cli::try_parse_from(["gitops-appstudio", "run", "--promotion-timeout", "soon"]).is_err());
    }
}
