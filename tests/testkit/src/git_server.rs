//! Git servers on loopback for the repository credential validation tests, both
//! serving bare repositories from one throwaway directory:
//!
//! - [`GitHttpsServer`]: smart HTTP over TLS (a throwaway CA, a certificate for
//!   127.0.0.1, ::1 and localhost) with basic authentication in front of the real
//!   `git http-backend` (run as CGI per request); `/redirect/…` answers with a
//!   redirect to the same path without the prefix, and every accepted connection is
//!   counted, so a test can show that a refused destination was never contacted;
//! - [`GitSshServer`]: OpenSSH's `sshd` on a free port of 127.0.0.1 with a throwaway
//!   host key, accepting one client key for the user the tests run as; the client
//!   runs `git-upload-pack` there as it would on any Git host.
//!
//! Both need `git`; the SSH server needs `sshd` (openssh-server) and `ssh-keygen`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt as _;
use tokio::task::JoinHandle;

/// Why a Git server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum GitServerError {
    #[error("{action}")]
    Io { action: String, source: std::io::Error },
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("generate TLS material: {0}")]
    Tls(String),
    #[error("sshd did not accept connections on port {0} within 10 seconds")]
    NotListening(u16),
}

fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> GitServerError {
    let action = action.into();
    move |source| GitServerError::Io { action, source }
}

/// A throwaway directory, removed on drop.
#[derive(Debug)]
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(purpose: &str) -> Result<Scratch, GitServerError> {
        let path = std::env::temp_dir().join(format!("gitops-{purpose}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path).map_err(io(format!("create {}", path.display())))?;
        Ok(Scratch(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a command to its end; its error output on failure.
fn run(program: &str, args: &[&str]) -> Result<(), GitServerError> {
    let output = std::process::Command::new(program)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("run {program}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(GitServerError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Makes an empty bare repository `root/name`.
pub fn bare_repository(root: &Path, name: &str) -> Result<PathBuf, GitServerError> {
    let path = root.join(name);
    run("git", &["init", "--bare", "--quiet", &path.to_string_lossy()])?;
    Ok(path)
}

/// Smart HTTP over TLS with basic authentication, in front of `git http-backend`.
pub struct GitHttpsServer {
    pub port: u16,
    /// PEM of the CA that signed the server's certificate.
    pub ca_pem: String,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for GitHttpsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitHttpsServer").field("port", &self.port).finish_non_exhaustive()
    }
}

impl Drop for GitHttpsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Backend {
    root: PathBuf,
    authorization: String,
}

impl GitHttpsServer {
    /// Serves the repositories under `root` to `username` with `password`.
    pub async fn start(root: &Path, username: &str, password: &str) -> Result<Self, GitServerError> {
        let material = crate::kube_emulator::tls::generate().map_err(|e| GitServerError::Tls(e.to_string()))?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.map_err(io("bind 127.0.0.1:0"))?;
        let port = listener.local_addr().map_err(io("read the bound address"))?.port();
        let acceptor = tokio_rustls::TlsAcceptor::from(material.server_config.clone());
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        let backend = Arc::new(Backend { root: root.to_owned(), authorization: format!("Basic {token}") });
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let task = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        counted.fetch_add(1, Ordering::SeqCst);
                        let (acceptor, backend) = (acceptor.clone(), backend.clone());
                        tasks.spawn(async move {
                            let Ok(stream) = acceptor.accept(stream).await else { return };
                            let service = service_fn(move |request| answer(request, backend.clone()));
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                }
            }
        });
        Ok(GitHttpsServer { port, ca_pem: material.ca_pem, connections, task })
    }

    /// `https://127.0.0.1:PORT/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}/{}", self.port, path.trim_start_matches('/'))
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
}

async fn answer(request: Request<Incoming>, backend: Arc<Backend>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/redirect") {
        let mut response = plain(StatusCode::FOUND, "moved");
        let location = format!("{rest}?{}", request.uri().query().unwrap_or_default());
        if let Ok(value) = location.parse() {
            response.headers_mut().insert(header::LOCATION, value);
        }
        return Ok(response);
    }
    let authorized = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == backend.authorization);
    if !authorized {
        let mut response = plain(StatusCode::UNAUTHORIZED, "authentication required");
        response.headers_mut().insert(header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Basic realm=\"git\""));
        return Ok(response);
    }
    Ok(cgi(request, &backend).await.unwrap_or_else(|error| plain(StatusCode::INTERNAL_SERVER_ERROR, &error)))
}

/// One request through `git http-backend`.
async fn cgi(request: Request<Incoming>, backend: &Backend) -> Result<Response<Full<Bytes>>, String> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let header_text =
        |name: header::HeaderName| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let mut command = tokio::process::Command::new("git");
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &backend.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or_default())
        .env("CONTENT_TYPE", header_text(header::CONTENT_TYPE))
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", "git")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(protocol) = parts.headers.get("git-protocol").and_then(|v| v.to_str().ok()) {
        command.env("HTTP_GIT_PROTOCOL", protocol);
    }
    if let Some(encoding) = parts.headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        command.env("HTTP_CONTENT_ENCODING", encoding);
    }
    let mut child = command.spawn().map_err(|e| e.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(&body).await.map_err(|e| e.to_string())?;
    }
    let output = child.wait_with_output().await.map_err(|e| e.to_string())?;
    let out = output.stdout;
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| out.windows(2).position(|w| w == b"\n\n").map(|i| (i, i + 2)))
        .ok_or("no CGI header")?;
    let head = String::from_utf8_lossy(&out[..split.0]).into_owned();
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(&out[split.1..])));
    for line in head.lines() {
        let Some((name, value)) = line.split_once(':') else { continue };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().and_then(|c| c.parse::<u16>().ok()).unwrap_or(500);
            *response.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        } else if let (Ok(name), Ok(value)) =
            (http::HeaderName::from_bytes(name.trim().as_bytes()), http::HeaderValue::from_str(value))
        {
            response.headers_mut().append(name, value);
        }
    }
    Ok(response)
}

/// OpenSSH's sshd on 127.0.0.1, for the user the tests run as.
#[derive(Debug)]
pub struct GitSshServer {
    pub port: u16,
    /// The user name for URLs (`ssh://USER@127.0.0.1:PORT/…`).
    pub user: String,
    /// A known-hosts file with the server's host key under `[127.0.0.1]:PORT`.
    pub known_hosts: PathBuf,
    /// A known-hosts file naming another key for the same host.
    pub wrong_known_hosts: PathBuf,
    /// The OpenSSH private key the server accepts.
    pub client_key: String,
    /// A private key the server does not accept.
    pub other_key: String,
    child: tokio::process::Child,
}

impl GitSshServer {
    /// Starts sshd with its files in `dir` (keys, configuration, known hosts).
    pub async fn start(dir: &Path) -> Result<Self, GitServerError> {
        let sshd = ["/usr/sbin/sshd", "/usr/local/sbin/sshd"].into_iter().find(|p| Path::new(p).exists()).ok_or_else(
            || GitServerError::Command {
                command: "sshd".into(),
                stderr: "sshd is not installed (openssh-server)".into(),
            },
        )?;
        let key = |name: &str| -> Result<(String, String), GitServerError> {
            let path = dir.join(name);
            run("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-C", name, "-f", &path.to_string_lossy()])?;
            let private = std::fs::read_to_string(&path).map_err(io(format!("read {name}")))?;
            let public = std::fs::read_to_string(path.with_extension("pub")).map_err(io(format!("read {name}.pub")))?;
            Ok((private, public.trim().to_owned()))
        };
        let (_, host_public) = key("host_key")?;
        let (_, other_host_public) = key("other_host_key")?;
        let (client_key, client_public) = key("client_key")?;
        let (other_key, _) = key("other_key")?;
        let user = current_user()?;
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("bind a probe port"))?;
            probe.local_addr().map_err(io("read the probe port"))?.port()
        };
        let write = |name: &str, text: String| -> Result<PathBuf, GitServerError> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(io(format!("write {name}")))?;
            Ok(path)
        };
        write("authorized_keys", format!("restrict {client_public}\n"))?;
        let known_hosts = write("known_hosts", format!("[127.0.0.1]:{port} {host_public}\n"))?;
        let wrong_known_hosts = write("wrong_known_hosts", format!("[127.0.0.1]:{port} {other_host_public}\n"))?;
        let d = dir.display();
        let config = write(
            "sshd_config",
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
                 PermitRootLogin prohibit-password\nAllowUsers {user}\nAcceptEnv GIT_PROTOCOL\n\
                 PrintMotd no\nLogLevel ERROR\n"
            ),
        )?;
        if is_root() {
            // The privilege separation directory a packaged sshd expects.
            let _ = std::fs::create_dir_all("/run/sshd");
        }
        let child = tokio::process::Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("start {sshd}")))?;
        let server = GitSshServer { port, user, known_hosts, wrong_known_hosts, client_key, other_key, child };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(address).await.is_err() {
            if tokio::time::Instant::now() > deadline {
                return Err(GitServerError::NotListening(port));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(server)
    }

    /// `ssh://USER@127.0.0.1:PORT<path>`.
    pub fn url(&self, path: &Path) -> String {
        format!("ssh://{}@127.0.0.1:{}{}", self.user, self.port, path.display())
    }
}

impl Drop for GitSshServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn is_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

fn current_user() -> Result<String, GitServerError> {
    let output = std::process::Command::new("id").arg("-un").output().map_err(io("run id -un"))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
