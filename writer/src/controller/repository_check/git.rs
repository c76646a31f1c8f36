//! Running `git ls-remote` for a tenant's repository with nothing that could widen
//! what it does:
//!
//! - an empty environment but for what git needs: `PATH`, `LC_ALL=C` (so its messages
//!   can be read), `HOME` an empty private directory, no system or global config
//!   (`GIT_CONFIG_NOSYSTEM=1`, `GIT_CONFIG_GLOBAL=/dev/null`), `GIT_TERMINAL_PROMPT=0`,
//!   no askpass program, and therefore no proxy variables;
//! - only the `https` and `ssh` protocols, no redirects, no proxy, TLS verified
//!   (against `--repository-ca-file` when given), the host pinned to the checked
//!   address with `http.curloptResolve`; a low-speed limit besides the overall timeout;
//! - the working directory a fresh private directory (0700) that git may not search
//!   above (`GIT_CEILING_DIRECTORIES`), so no repository's config is read;
//! - the URL after `--`, and no argument that starts with `-` from the tenant;
//! - the password never in argv: it reaches git as an `Authorization` header through
//!   `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_0`/`GIT_CONFIG_VALUE_0` (the process's own
//!   environment, readable only by its user);
//! - SSH through an `ssh -F` config file of our own (no user or system ssh config):
//!   `HostName` the checked address with the URL's host as `HostKeyAlias`,
//!   `StrictHostKeyChecking yes` against `--repository-known-hosts` only,
//!   `ProxyCommand none`, `ProxyJump none`, no agent, no password or keyboard
//!   prompts, and the private key in a 0600 file in the private directory.
//!
//! The private directory is removed when the check ends (also on timeout: the child
//! is killed when its future is dropped).

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use base64::Engine as _;
use gitops_shared::db::credential::RepositoryCredentials;

use super::{RepositoryCheckSettings, RepositoryUrl};
use crate::controller::egress::Checked;

/// What git answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub success: bool,
    /// Its error output (bounded); for classification and the operator's log.
    pub stderr: String,
}

/// Why git could not be run.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("could not prepare the private directory {path}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error("the temporary directory {0} has characters a command line cannot carry unquoted")]
    TempPath(PathBuf),
    #[error("could not run {program}")]
    Spawn { program: PathBuf, source: std::io::Error },
}

const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const MAX_STDERR: usize = 8 * 1024;

/// A private directory, removed on drop.
struct Private(PathBuf);

impl Private {
    fn create() -> Result<Private, GitError> {
        let path = std::env::temp_dir().join(format!("gitops-repository-check-{}", uuid::Uuid::new_v4().simple()));
        if !path.to_string_lossy().bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'_' | b'-'))
        {
            return Err(GitError::TempPath(path));
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| GitError::Prepare { path: path.clone(), source })?;
        let private = Private(path);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(private.0.join("home"))
            .map_err(|source| GitError::Prepare { path: private.0.join("home"), source })?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(private.0.join("work"))
            .map_err(|source| GitError::Prepare { path: private.0.join("work"), source })?;
        Ok(private)
    }

    /// Writes `name` with mode 0600.
    fn write(&self, name: &str, content: &[u8]) -> Result<PathBuf, GitError> {
        let path = self.0.join(name);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| GitError::Prepare { path: path.clone(), source })?;
        file.write_all(content).map_err(|source| GitError::Prepare { path: path.clone(), source })?;
        Ok(path)
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `git ls-remote` against `url`, connecting to `checked` only.
pub async fn ls_remote(
    settings: &RepositoryCheckSettings,
    url: &RepositoryUrl,
    checked: &Checked,
    credentials: &RepositoryCredentials,
) -> Result<Answer, GitError> {
    let private = Private::create()?;
    let mut command = tokio::process::Command::new(&settings.git);
    command
        .env_clear()
        .env("PATH", PATH)
        .env("LC_ALL", "C")
        .env("HOME", private.0.join("home"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CEILING_DIRECTORIES", &private.0)
        .env("GIT_PROTOCOL_FROM_USER", "0")
        .current_dir(private.0.join("work"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for setting in [
        "protocol.allow=never",
        "protocol.https.allow=always",
        "protocol.ssh.allow=always",
        "http.followRedirects=false",
        "http.proxy=",
        "http.sslVerify=true",
        "http.lowSpeedLimit=1000",
        "http.lowSpeedTime=10",
        "http.emptyAuth=false",
        "credential.helper=",
        "core.askPass=",
    ] {
        command.arg("-c").arg(setting);
    }
    if let Some(ca) = &settings.ca_file {
        command.arg("-c").arg(format!("http.sslCAInfo={}", ca.display()));
    }
    if url.is_ssh() {
        let config = ssh_config(settings, url, checked, credentials, &private)?;
        command.env("GIT_SSH_COMMAND", format!("{} -F {}", settings.ssh.display(), config.display()));
        command.env("GIT_SSH_VARIANT", "ssh");
    } else {
        if checked.named {
            let address = match checked.address.ip() {
                std::net::IpAddr::V4(v4) => v4.to_string(),
                std::net::IpAddr::V6(v6) => format!("[{v6}]"),
            };
            command.arg("-c").arg(format!("http.curloptResolve={}:{}:{address}", checked.host, url.port()));
        }
        if let (Some(username), Some(password)) = (&credentials.username, &credentials.password) {
            let token = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
            command
                .env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "http.extraHeader")
                .env("GIT_CONFIG_VALUE_0", format!("Authorization: Basic {token}"));
        }
    }
    command.arg("ls-remote").arg("--heads").arg("--").arg(url.to_string());
    let child = command.spawn().map_err(|source| GitError::Spawn { program: settings.git.clone(), source })?;
    let output =
        child.wait_with_output().await.map_err(|source| GitError::Spawn { program: settings.git.clone(), source })?;
    let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if stderr.len() > MAX_STDERR {
        let mut end = MAX_STDERR;
        while !stderr.is_char_boundary(end) {
            end -= 1;
        }
        stderr.truncate(end);
    }
    drop(private);
    Ok(Answer { success: output.status.success(), stderr })
}

/// The ssh client's whole configuration, in the private directory.
fn ssh_config(
    settings: &RepositoryCheckSettings,
    url: &RepositoryUrl,
    checked: &Checked,
    credentials: &RepositoryCredentials,
    private: &Private,
) -> Result<PathBuf, GitError> {
    // `validate` runs no SSH check without a key; an empty one offers nothing.
    let mut key = credentials.ssh_private_key.clone().unwrap_or_default().replace("\r\n", "\n");
    if !key.ends_with('\n') {
        key.push('\n');
    }
    let identity = private.write("identity", key.as_bytes())?.display().to_string();
    let known_hosts = settings.known_hosts.as_deref().map_or_else(|| "/dev/null".to_owned(), path_text);
    // Known-hosts entries name a host on another port as `[host]:port`, as ssh-keyscan writes them.
    let alias = if url.port() == 22 { checked.host.clone() } else { format!("[{}]:{}", checked.host, url.port()) };
    let config = format!(
        "Host *\n\
         \x20 HostName {address}\n\
         \x20 Port {port}\n\
         \x20 HostKeyAlias {alias}\n\
         \x20 IdentityFile {identity}\n\
         \x20 IdentitiesOnly yes\n\
         \x20 IdentityAgent none\n\
         \x20 StrictHostKeyChecking yes\n\
         \x20 UserKnownHostsFile \"{known_hosts}\"\n\
         \x20 GlobalKnownHostsFile /dev/null\n\
         \x20 CheckHostIP no\n\
         \x20 UpdateHostKeys no\n\
         \x20 BatchMode yes\n\
         \x20 PasswordAuthentication no\n\
         \x20 KbdInteractiveAuthentication no\n\
         \x20 PubkeyAuthentication yes\n\
         \x20 ProxyCommand none\n\
         \x20 ProxyJump none\n\
         \x20 ControlMaster no\n\
         \x20 ControlPath none\n\
         \x20 ForwardAgent no\n\
         \x20 ForwardX11 no\n\
         \x20 ClearAllForwardings yes\n\
         \x20 PermitLocalCommand no\n\
         \x20 ConnectTimeout 10\n\
         \x20 ServerAliveInterval 5\n\
         \x20 ServerAliveCountMax 2\n\
         \x20 LogLevel ERROR\n",
        address = checked.address.ip(),
        port = url.port(),
    );
    private.write("ssh_config", config.as_bytes())
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}
