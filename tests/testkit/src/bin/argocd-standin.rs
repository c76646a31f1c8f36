//! The `argocd-standin` binary: runs the Argo CD stand-in (see
//! `gitops_testkit::argocd`) over one namespace of any API server — a real
//! cluster or the emulator — until SIGINT or SIGTERM, optionally installing the
//! Application and AppProject CRDs first. Exit codes: 0 stopped by a signal,
//! 1 failure, 2 usage.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use gitops_testkit::argocd::{self, ForeignCrds, StandinOptions};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Behaves like Argo CD's application controller for the Applications of one namespace.
#[derive(Debug, Parser)]
#[command(name = "argocd-standin", version)]
struct Cli {
    /// Kubeconfig of the API server (its current context); without it, the
    /// usual inference (KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, env = "ARGOCD_STANDIN_KUBECONFIG", value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The Argo CD namespace: Applications and AppProjects are read there.
    #[arg(long, env = "ARGOCD_STANDIN_NAMESPACE", default_value = "argocd")]
    namespace: String,
    /// Create or update the Application and AppProject CRDs first and wait until
    /// they are established. CRDs not installed by the test kit (e.g. a real Argo
    /// CD's) are kept unless --replace-foreign-crds is given.
    #[arg(long, env = "ARGOCD_STANDIN_INSTALL_CRDS")]
    install_crds: bool,
    /// With --install-crds: replace argoproj.io CRDs someone else installed.
    #[arg(long, env = "ARGOCD_STANDIN_REPLACE_FOREIGN_CRDS", requires = "install_crds")]
    replace_foreign_crds: bool,
    /// Re-reconcile unchanged Applications (refreshing reconciledAt) this often; 0: never.
    #[arg(long, env = "ARGOCD_STANDIN_RESYNC_SECONDS", default_value_t = 180)]
    resync_seconds: u64,
    /// Applications reconciled at once (0: unbounded).
    #[arg(long, env = "ARGOCD_STANDIN_CONCURRENCY", default_value_t = 8)]
    concurrency: u16,
    /// How long --install-crds waits for each CRD to be established.
    #[arg(long, env = "ARGOCD_STANDIN_CRD_TIMEOUT_SECONDS", default_value_t = 60)]
    crd_timeout_seconds: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    gitops_shared::telemetry::init_logging();
    match execute(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(cli: Cli) -> anyhow::Result<()> {
    let client = match &cli.kubeconfig {
        Some(path) => argocd::client_from_kubeconfig(path).await?,
        None => kube::Client::try_default().await.context("infer a Kubernetes client configuration")?,
    };
    if cli.install_crds {
        let foreign = if cli.replace_foreign_crds { ForeignCrds::Replace } else { ForeignCrds::Keep };
        argocd::install_crds(&client, foreign, Duration::from_secs(cli.crd_timeout_seconds)).await?;
    }
    let cancel = CancellationToken::new();
    let mut terminate = signal(SignalKind::terminate()).context("listen for SIGTERM")?;
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping"),
            _ = terminate.recv() => info!("SIGTERM: stopping"),
        }
        on_signal.cancel();
    });
    let options = StandinOptions {
        resync: Duration::from_secs(cli.resync_seconds),
        concurrency: cli.concurrency,
        ..StandinOptions::default()
    };
    argocd::run(client, &cli.namespace, options, cancel).await?;
    Ok(())
}
