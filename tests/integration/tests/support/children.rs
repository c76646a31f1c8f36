//! The service's binaries as child processes of this test binary: a child runs
//! `process_signals::child` (an ignored test) with `GITOPS_TEST_CHILD` naming the
//! binary and `GITOPS_TEST_CHILD_ARGS` its command line, which it handles as that
//! binary's `main` does. Only processes started here are ever signalled.

use std::path::Path;
use std::process::Stdio;

/// Which binary the child runs (`writer` or `agent`), or `egress-checks` (the
/// writer's checks of tenant-named hosts alone, `writer_egress_proxy`).
pub const CHILD: &str = "GITOPS_TEST_CHILD";
/// Its arguments, one per line.
pub const CHILD_ARGS: &str = "GITOPS_TEST_CHILD_ARGS";

/// Starts `which` with `args` and `env`; its stderr goes to `log` (appended), or to
/// a pipe when `log` is None.
pub fn spawn(which: &str, args: &[String], env: &[(&str, String)], log: Option<&Path>) -> tokio::process::Child {
    let exe = std::env::current_exe().expect("the test binary");
    let stderr = match log {
        Some(path) => {
            Stdio::from(std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open the child's log"))
        }
        None => Stdio::piped(),
    };
    tokio::process::Command::new(exe)
        .args(["--exact", "process_signals::child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, which)
        .env(CHILD_ARGS, args.join("\n"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(if log.is_some() { Stdio::null() } else { Stdio::piped() })
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .expect("start the child")
}

/// Sends `signal` (`-TERM`, `-KILL`) to `child`.
pub async fn signal(child: &tokio::process::Child, signal: &str) {
    let pid = child.id().expect("a running child").to_string();
    let sent = tokio::process::Command::new("kill").args([signal, &pid]).status().await.expect("kill");
    assert!(sent.success(), "{signal} sent to {pid}");
}
