//! A throwaway PostgreSQL server: `initdb` into a temporary directory and start
//! `postgres` on a free loopback port, as the `postgres` user when running as root
//! (initdb refuses root). A watchdog shell stops the server and removes its
//! directory when the process that started it exits, however it exits.
//!
//! `start_with_tls` turns on `ssl` with a server certificate for `localhost` and
//! `127.0.0.1`, signed by a CA made for this server alone, for the TLS tests.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::{OpenOptionsExt, chown};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gitops_shared::db;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// Why the server could not be started. Each names what is missing and how to get it.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found on PATH, in PG_BIN or under \
         /usr/lib/postgresql/*/bin; install them with `apt-get install -y postgresql` \
         or set GITOPS_TEST_DATABASE_URL to a server tests may create databases on"
    )]
    BinariesMissing,
    #[error("running as root, but there is no `postgres` user to run the server as (initdb refuses root)")]
    NoPostgresUser,
    #[error("{what} failed: {detail}")]
    Command { what: &'static str, detail: String },
    #[error("the server did not accept connections within {0:?}; its log: {1}")]
    NotReady(Duration, String),
    #[error(transparent)]
    Db(#[from] db::DbError),
}

/// How the server is tuned.
#[derive(Debug, Clone, Copy)]
pub struct PgOptions {
    /// fsync and synchronous_commit on, as in production (benchmarks). Off for tests.
    pub durable: bool,
    pub max_connections: u32,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions { durable: false, max_connections: 400 }
    }
}

/// A running throwaway server; stopped when this process exits, or on drop.
#[derive(Debug)]
pub struct PgCluster {
    port: u16,
    dir: PathBuf,
    /// The CA that signed the server certificate, when TLS is on.
    ca_pem: Option<PathBuf>,
    watchdog: std::process::Child,
}

impl PgCluster {
    /// initdb + start; returns once the server accepts connections.
    pub async fn start(options: PgOptions) -> Result<Self, PgError> {
        Self::launch(options, false).await
    }

    /// As `start`, with `ssl = on` and a server certificate for `localhost` and
    /// `127.0.0.1` (see `ca_pem_path`). Plain connections are still accepted.
    pub async fn start_with_tls(options: PgOptions) -> Result<Self, PgError> {
        Self::launch(options, true).await
    }

    /// The PEM file of the CA that signed the server's certificate (TLS servers only).
    pub fn ca_pem_path(&self) -> Option<&Path> {
        self.ca_pem.as_deref()
    }

    /// The PEM certificate of a fresh CA that signed nothing, for tests that
    /// expect a server's certificate to be refused.
    pub fn unrelated_ca_pem() -> Result<String, PgError> {
        let (params, key) = ca("gitops-test-unrelated-ca").map_err(failed("generate a CA"))?;
        params.self_signed(&key).map(|cert| cert.pem()).map_err(failed("generate a CA"))
    }

    async fn launch(options: PgOptions, tls: bool) -> Result<Self, PgError> {
        let bin = find_bin_dir().ok_or(PgError::BinariesMissing)?;
        let run_as = if is_root() { Some(postgres_user()?) } else { None };
        let dir =
            std::env::temp_dir().join(format!("gitops-pg-{}-{}", std::process::id(), uuid::Uuid::new_v4().simple()));
        let data = dir.join("data");
        std::fs::create_dir_all(&dir)
            .map_err(|e| PgError::Command { what: "create the data directory", detail: e.to_string() })?;
        if let Some((uid, gid)) = run_as {
            chown(&dir, Some(uid), Some(gid))
                .map_err(|e| PgError::Command { what: "chown the data directory", detail: e.to_string() })?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = run_as {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb.output().map_err(|e| PgError::Command { what: "initdb", detail: e.to_string() })?;
        if !out.status.success() {
            return Err(PgError::Command { what: "initdb", detail: String::from_utf8_lossy(&out.stderr).into_owned() });
        }
        let ca_pem = if tls { Some(write_tls_files(&dir, &data, run_as)?) } else { None };
        let ssl = if tls { "-c ssl=on" } else { "" };
        let port = free_port()?;
        let durability = if options.durable {
            "-c fsync=on -c synchronous_commit=on -c full_page_writes=on"
        } else {
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        };
        let log = dir.join("postgres.log");
        // The watchdog: run postgres in the background, poll for our process, and on
        // its exit stop the server (fast shutdown) and remove the directory.
        // The server runs while this process does; when it stops and a `restart`
        // file is there (see `restart`), it is started again on the same data, once
        // no `hold` file is (see `pause`).
        let script = format!(
            "bin=$1 data=$2 dir=$3 log=$4; \
             start() {{ \"$bin\" -D \"$data\" -p {port} -k \"$dir\" -c listen_addresses=127.0.0.1 \
             -c max_connections={max} -c shared_buffers=256MB {durability} \
             -c max_wal_size=2GB -c log_min_messages=warning {ssl} >>\"$log\" 2>&1 & pg=$!; }}; \
             alive() {{ s=$(cut -d' ' -f3 /proc/$pg/stat 2>/dev/null); [ -n \"$s\" ] && [ \"$s\" != Z ]; }}; \
             start; \
             while [ -d /proc/{parent} ]; do \
               if alive; then sleep 0.5; \
               elif [ -e \"$dir/hold\" ]; then sleep 0.1; \
               elif [ -e \"$dir/restart\" ]; then rm -f \"$dir/restart\"; start; \
               else break; fi; \
             done; \
             kill -INT $pg 2>/dev/null; wait $pg; rm -rf \"$dir\"",
            max = options.max_connections,
            parent = std::process::id(),
        );
        let mut watchdog = Command::new("sh");
        watchdog
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(bin.join("postgres"))
            .arg(&data)
            .arg(&dir)
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        if let Some((uid, gid)) = run_as {
            watchdog.uid(uid).gid(gid);
        }
        let watchdog =
            watchdog.spawn().map_err(|e| PgError::Command { what: "start postgres", detail: e.to_string() })?;
        let cluster = PgCluster { port, dir, ca_pem, watchdog };
        cluster.wait_ready(Duration::from_secs(60)).await?;
        Ok(cluster)
    }

    /// The URL of database `db` as the superuser.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Restarts the server on the same data and port (a fast shutdown: every client
    /// connection is cut) and waits until it accepts connections again.
    pub async fn restart(&self) -> Result<(), PgError> {
        self.pause().await?;
        self.resume().await
    }

    /// Stops the server (a fast shutdown) and keeps it stopped until [`resume`](Self::resume).
    pub async fn pause(&self) -> Result<(), PgError> {
        std::fs::write(self.dir.join("hold"), b"").map_err(failed("ask for a pause"))?;
        self.stop_for_restart().await
    }

    /// Starts a paused server again and waits until it accepts connections.
    pub async fn resume(&self) -> Result<(), PgError> {
        std::fs::remove_file(self.dir.join("hold")).map_err(failed("end a pause"))?;
        self.wait_ready(Duration::from_secs(60)).await
    }

    /// The postmaster's process id while the server runs (from `postmaster.pid`).
    pub fn postmaster_pid(&self) -> Option<u32> {
        let pid_file = std::fs::read_to_string(self.dir.join("data").join("postmaster.pid")).ok()?;
        pid_file.lines().next()?.trim().parse().ok()
    }

    async fn stop_for_restart(&self) -> Result<(), PgError> {
        let pid_file = std::fs::read_to_string(self.dir.join("data").join("postmaster.pid"))
            .map_err(failed("read the postmaster's pid"))?;
        let pid = pid_file.lines().next().unwrap_or_default().trim().to_owned();
        std::fs::write(self.dir.join("restart"), b"").map_err(failed("ask for a restart"))?;
        let status = Command::new("kill").args(["-INT", &pid]).status().map_err(failed("stop the server"))?;
        if !status.success() {
            return Err(PgError::Command { what: "stop the server", detail: format!("kill -INT {pid}: {status}") });
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        // Gone, or a zombie its watchdog has not reaped yet.
        let running = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.split(' ').nth(2).is_some_and(|state| state != "Z"))
        };
        while running() {
            if Instant::now() > deadline {
                return Err(PgError::Command { what: "stop the server", detail: format!("{pid} still runs") });
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        Ok(())
    }

    async fn wait_ready(&self, within: Duration) -> Result<(), PgError> {
        let deadline = Instant::now() + within;
        loop {
            match db::connect(&self.url("postgres"), "gitops-testkit").await {
                Ok(_) => return Ok(()),
                Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => {
                    let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
                    return Err(PgError::NotReady(within, log));
                }
            }
        }
    }
}

/// Writes `server.crt` and `server.key` (0600, owned by the server's user, as
/// PostgreSQL demands) into the data directory, where `ssl = on` looks for them,
/// and the CA certificate next to it; returns the CA's path.
fn write_tls_files(dir: &Path, data: &Path, run_as: Option<(u32, u32)>) -> Result<PathBuf, PgError> {
    let (ca_params, ca_key) = ca("gitops-test-postgres-ca").map_err(failed("generate the test CA"))?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(failed("generate the test CA"))?;
    let server_key = KeyPair::generate().map_err(failed("generate the server key"))?;
    let mut server_params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .map_err(failed("generate the server certificate"))?;
    server_params.distinguished_name.push(DnType::CommonName, "localhost");
    let server_cert = server_params
        .signed_by(&server_key, &Issuer::from_params(&ca_params, &ca_key))
        .map_err(failed("generate the server certificate"))?;

    let write = |path: &Path, contents: &str, mode: u32| -> Result<(), PgError> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(failed("write the TLS files"))?;
        file.write_all(contents.as_bytes()).map_err(failed("write the TLS files"))?;
        if let Some((uid, gid)) = run_as {
            chown(path, Some(uid), Some(gid)).map_err(failed("chown the TLS files"))?;
        }
        Ok(())
    };
    write(&data.join("server.crt"), &server_cert.pem(), 0o644)?;
    write(&data.join("server.key"), &server_key.serialize_pem(), 0o600)?;
    let ca_path = dir.join("ca.crt");
    write(&ca_path, &ca_cert.pem(), 0o644)?;
    Ok(ca_path)
}

/// The parameters and key of a fresh CA.
fn ca(name: &str) -> Result<(CertificateParams, KeyPair), rcgen::Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok((params, key))
}

/// Adapter for `map_err`: a failed step, with the error's message as detail.
fn failed<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> PgError {
    move |error| PgError::Command { what, detail: error.to_string() }
}

/// How often teardown checks whether the server has exited (within its deadline).
const EXIT_POLL: Duration = Duration::from_millis(20);

impl Drop for PgCluster {
    fn drop(&mut self) {
        // SIGINT to the watchdog's process group reaches the postmaster too: a fast
        // shutdown, which does not wait for clients to disconnect.
        let _ = Command::new("kill").args(["-INT", "--"]).arg(format!("-{}", self.watchdog.id())).status();
        // Bounded: the server normally stops in well under a second.
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if matches!(self.watchdog.try_wait(), Ok(Some(_)) | Err(_)) {
                break;
            }
            std::thread::sleep(EXIT_POLL);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false)
}

/// uid and gid of the `postgres` user, from /etc/passwd.
fn postgres_user() -> Result<(u32, u32), PgError> {
    let passwd = std::fs::read_to_string("/etc/passwd").map_err(|_| PgError::NoPostgresUser)?;
    passwd
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() > 3 && fields[0] == "postgres").then(|| (fields[2].parse().ok(), fields[3].parse().ok()))
        })
        .find_map(|ids| match ids {
            (Some(uid), Some(gid)) => Some((uid, gid)),
            _ => None,
        })
        .ok_or(PgError::NoPostgresUser)
}

/// PATH, then `PG_BIN`, then the newest `/usr/lib/postgresql/*/bin`.
pub fn find_bin_dir() -> Option<PathBuf> {
    let has = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has(&dir) {
                return Some(dir);
            }
        }
    }
    if let Some(dir) = std::env::var_os("PG_BIN").map(PathBuf::from)
        && has(&dir)
    {
        return Some(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.path().join("bin"))))
        .filter(|(_, dir)| has(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

fn free_port() -> Result<u16, PgError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| PgError::Command { what: "find a free port", detail: e.to_string() })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| PgError::Command { what: "find a free port", detail: e.to_string() })
}
