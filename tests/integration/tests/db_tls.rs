//! TLS to the database: every `sslmode` against a throwaway server with `ssl = on`
//! and a certificate from a test CA (for `localhost` and `127.0.0.1`), the pool and
//! the LISTEN helper over TLS, and `prefer`/`require` against the plain test server.

use gitops_shared::db::{self, DbError};
use gitops_shared::listen::Listener;
use gitops_shared::signal::Signal;
use gitops_testkit::TEST_DATABASE_URL;
use gitops_testkit::{PgCluster, PgOptions, TestServer};
use tokio::sync::OnceCell;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::support::{DEADLINE, eventually};

/// In URLs to show that no error repeats it (the server trusts every local login).
const PASSWORD: &str = "hunter2-not-in-errors";

/// The TLS server of this run, started on first use; stopped when the process exits.
static TLS_SERVER: OnceCell<PgCluster> = OnceCell::const_new();

async fn tls_server() -> &'static PgCluster {
    TLS_SERVER
        .get_or_init(|| async {
            let options = PgOptions { max_connections: 50, ..PgOptions::default() };
            PgCluster::start_with_tls(options)
                .await
                .unwrap_or_else(|error| panic!("TLS PostgreSQL unavailable: {error}"))
        })
        .await
}

/// `postgres://postgres:…@{host}:{port}/postgres?{params}` on the TLS server.
async fn tls_url(host: &str, params: &str) -> String {
    let server = tls_server().await;
    let url = format!("postgres://postgres:{PASSWORD}@{host}:{}/postgres", server.port());
    if params.is_empty() { url } else { format!("{url}?{params}") }
}

async fn ca_path() -> String {
    let path = tls_server().await.ca_pem_path().expect("the TLS server has a CA");
    path.to_str().expect("utf-8 temp path").to_owned()
}

/// Whether this session's connection is encrypted, as the server sees it.
async fn uses_ssl(client: &Client) -> bool {
    client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .expect("read pg_stat_ssl")
        .get(0)
}

async fn connect(url: &str) -> Result<Client, DbError> {
    db::connect(url, "gitops-test-tls").await
}

/// The error and all its sources, as an operator reads them.
fn chain(error: &DbError) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[tokio::test]
async fn sslmode_disable_connects_in_plain_text() {
    let client = connect(&tls_url("127.0.0.1", "sslmode=disable").await).await.expect("connect");
    assert!(!uses_ssl(&client).await);
}

#[tokio::test]
async fn without_sslmode_tls_is_used_when_the_server_offers_it() {
    let client = connect(&tls_url("127.0.0.1", "").await).await.expect("connect");
    assert!(uses_ssl(&client).await);
}

#[tokio::test]
async fn sslmode_require_without_a_ca_encrypts_without_checking() {
    let client = connect(&tls_url("127.0.0.1", "sslmode=require").await).await.expect("connect");
    assert!(uses_ssl(&client).await);
}

#[tokio::test]
async fn sslmode_verify_full_accepts_the_servers_names() {
    let ca = ca_path().await;
    for host in ["localhost", "127.0.0.1"] {
        let url = tls_url(host, &format!("sslmode=verify-full&sslrootcert={ca}")).await;
        let client = connect(&url).await.unwrap_or_else(|e| panic!("verify-full to {host}: {}", chain(&e)));
        assert!(uses_ssl(&client).await, "{host}");
    }
}

#[tokio::test]
async fn sslmode_verify_full_with_another_ca_fails_clearly() {
    let dir = std::env::temp_dir().join(format!("gitops-tls-other-ca-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let other_ca = dir.join("ca.pem");
    std::fs::write(&other_ca, PgCluster::unrelated_ca_pem().expect("a CA")).expect("write the CA");
    let url = tls_url("localhost", &format!("sslmode=verify-full&sslrootcert={}", other_ca.display())).await;
    let outcome = connect(&url).await;
    std::fs::remove_dir_all(&dir).expect("clean up");
    let error = outcome.expect_err("a certificate from another CA is refused");
    let text = chain(&error);
    assert!(matches!(error, DbError::Connect { .. }), "{text}");
    assert!(text.contains("certificate could not be verified (sslmode=verify-full)"), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
    assert!(!text.contains(PASSWORD) && !text.contains("postgres://"), "{text}");
}

#[tokio::test]
async fn sslmode_verify_ca_checks_the_chain_but_not_the_name() {
    let server = tls_server().await;
    let ca = ca_path().await;
    // hostaddr reaches the server; host is the name the certificate is checked against.
    let kv = |mode: &str| {
        format!(
            "host=not-the-server.invalid hostaddr=127.0.0.1 port={} user=postgres password={PASSWORD} \
             dbname=postgres sslmode={mode} sslrootcert='{ca}'",
            server.port()
        )
    };
    let client = connect(&kv("verify-ca")).await.unwrap_or_else(|e| panic!("verify-ca: {}", chain(&e)));
    assert!(uses_ssl(&client).await);

    let error = connect(&kv("verify-full")).await.expect_err("verify-full checks the name");
    let text = chain(&error);
    assert!(text.contains("could not be verified") && text.contains("not valid for name"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");
}

#[tokio::test]
async fn the_pool_and_the_listener_work_over_tls() {
    let ca = ca_path().await;
    let url = tls_url("localhost", &format!("sslmode=verify-full&sslrootcert={ca}")).await;

    let pool = db::pool(&url, 2, "gitops-test-tls-pool").expect("build a pool");
    let pooled = db::pooled(&pool).await.unwrap_or_else(|e| panic!("pooled connection: {}", chain(&e)));
    assert!(uses_ssl(&pooled).await);

    let cancel = CancellationToken::new();
    let signal = Signal::status();
    let listener = Listener::start(&url, &[signal], cancel.clone()).expect("start the listener");
    let mut woken = listener.subscribe(&signal).expect("subscribed");
    assert!(listener.wait_connected(DEADLINE).await, "the LISTEN connection came up");
    // The listener wakes everyone once it is up; wait for that before counting.
    tokio::time::timeout(DEADLINE, woken.wait_for(|n| *n >= 1))
        .await
        .expect("woken on connect")
        .expect("listener alive");
    woken.borrow_and_update();

    let observer = &*pooled;
    let listener_ssl = eventually("the listener's session in pg_stat_ssl", || async move {
        observer
            .query_opt(
                "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = 'gitops-listener'",
                &[],
            )
            .await
            .expect("read pg_stat_ssl")
            .map(|row| row.get::<_, bool>(0))
    })
    .await;
    assert!(listener_ssl, "the LISTEN connection is encrypted");

    pooled.execute("SELECT pg_notify($1, '')", &[&signal.channel()]).await.expect("notify");
    tokio::time::timeout(DEADLINE, woken.changed())
        .await
        .expect("notification within the deadline")
        .expect("listener alive");
    cancel.cancel();
}

/// The plain server (the run's test server) unless the run points at a server of
/// its own, whose TLS set-up is unknown.
async fn plain_server_url() -> Option<String> {
    if std::env::var(TEST_DATABASE_URL).is_ok_and(|url| !url.is_empty()) {
        return None;
    }
    Some(TestServer::get().await.url("postgres"))
}

#[tokio::test]
async fn against_a_plain_server_prefer_connects_and_require_fails_clearly() {
    let Some(url) = plain_server_url().await else { return };
    let client = connect(&format!("{url}?sslmode=prefer")).await.expect("prefer falls back to plain text");
    assert!(!uses_ssl(&client).await);

    let error = connect(&format!("{url}?sslmode=require")).await.expect_err("require needs TLS");
    let text = chain(&error);
    assert!(matches!(error, DbError::Connect { .. }), "{text}");
    assert!(text.contains("server does not support TLS"), "{text}");
}
