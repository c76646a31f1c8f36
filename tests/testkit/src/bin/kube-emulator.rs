//! `kube-emulator`: the Kubernetes API emulator as a process, for the local
//! quickstart and for poking at it with kubectl. Prints the URL on stdout once
//! ready, writes the kubeconfig, and serves until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use gitops_testkit::kube_emulator::{EmulatorOptions, HistoryWindows, KubeEmulator};

/// An in-memory Kubernetes API server for tests and local development.
#[derive(Debug, Parser)]
#[command(name = "kube-emulator", version)]
struct Args {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, env = "KUBE_EMULATOR_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write the admin kubeconfig once ready.
    #[arg(long, env = "KUBE_EMULATOR_KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Static token file, kube-apiserver format: `token,user,uid,"group1,group2"`.
    #[arg(long, env = "KUBE_EMULATOR_TOKENS")]
    tokens: Option<PathBuf>,
    /// Serve HTTPS with a generated CA (written into the kubeconfig).
    #[arg(long, env = "KUBE_EMULATOR_TLS")]
    tls: bool,
    /// Seconds a watch can resume from (kube-apiserver's watch cache: 75).
    #[arg(long, env = "KUBE_EMULATOR_WATCH_HISTORY_SECONDS", default_value_t = 75)]
    watch_history_seconds: u64,
    /// Latest events per resource a watch can always resume from (100).
    #[arg(long, env = "KUBE_EMULATOR_WATCH_HISTORY_EVENTS", default_value_t = 100)]
    watch_history_events: usize,
    /// Seconds continue tokens and lists at an old resourceVersion are served (etcd compaction: 300).
    #[arg(long, env = "KUBE_EMULATOR_LIST_HISTORY_SECONDS", default_value_t = 300)]
    list_history_seconds: u64,
    /// Seconds an Event lives after its last write (kube-apiserver's --event-ttl: 3600).
    #[arg(long, env = "KUBE_EMULATOR_EVENT_TTL_SECONDS", default_value_t = 3600)]
    event_ttl_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let emulator = KubeEmulator::start(EmulatorOptions {
        listen: args.listen,
        kubeconfig: Some(args.kubeconfig),
        tokens: args.tokens,
        tls: args.tls,
        history: HistoryWindows {
            watch_age: Duration::from_secs(args.watch_history_seconds),
            watch_events: args.watch_history_events,
            list_age: Duration::from_secs(args.list_history_seconds),
        },
        event_ttl: Duration::from_secs(args.event_ttl_seconds),
    })
    .await?;
    println!("{}", emulator.url());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    emulator.shutdown().await;
    Ok(())
}
