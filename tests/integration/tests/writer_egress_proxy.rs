//! The writer contacts the hosts tenants name (an environment's `apiURL`, a
//! repository) directly, never through a proxy from its environment. Proxy
//! variables are per process, so the checks run in a child process of this test
//! binary with `HTTPS_PROXY`, `HTTP_PROXY` and `ALL_PROXY` (upper and lower case)
//! pointing at a recording listener on loopback: the connection check reaches the
//! test tier's API server and the repository check the loopback Git server, and the
//! listener sees no connection. A plain `git ls-remote` with the same variables goes
//! to the listener, so the listener would have seen a check that used them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use gitops_shared::db::credential::{ClusterCredentials, ManagedEnvironmentIntent, RepositoryCredentials};
use gitops_testkit::cluster::TestCluster;
use gitops_testkit::git_server::{GitHttpsServer, Scratch, bare_repository};
use gitops_writer::controller::connection::{ConnectionPolicy, Destination, REASON_SUCCEEDED, connection_check};
use gitops_writer::controller::repository_check::{
    REASON_CREDENTIALS_UP_TO_DATE, REASON_VALID_URL, RepositoryCheckSettings, validate,
};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::support::children::spawn;
use crate::support::{DEADLINE, eventually};

const USER: &str = "bot";
const PASSWORD: &str = "pr0xy-t3st-s3cret";
/// Marks the child's one line of results on its standard output.
const RESULT: &str = "EGRESS-CHECKS ";
/// Every spelling of the proxy variables that clients read.
const PROXY_VARIABLES: [&str; 6] = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"];

/// What the child found: (status, reason) of the connection check, and of the
/// repository check's URL and credential conditions.
type Found = [(String, String); 3];

/// A field of the child's request.
fn field<'a>(request: &'a Value, name: &str) -> &'a str {
    request[name].as_str().unwrap_or_else(|| panic!("the request has no {name}"))
}

/// The child's body: runs both checks as the writer does and prints what they found.
pub(crate) async fn child(args: &[String]) -> i32 {
    let request: Value = serde_json::from_str(args.first().map_or("", String::as_str)).expect("the request");
    let allow: Vec<Destination> = request["allow"]
        .as_array()
        .expect("allow entries")
        .iter()
        .map(|p| p.as_str().unwrap_or_default().parse().expect("an allow entry"))
        .collect();
    let policy = ConnectionPolicy::new(allow, vec![]);
    let intent = ManagedEnvironmentIntent {
        resource_uid: Uuid::new_v4(),
        resource_name: "target".into(),
        generation: 1,
        api_url: field(&request, "api_url").to_owned(),
        allow_insecure_skip_tls_verify: request["insecure"].as_bool().unwrap_or(false),
        namespaces: vec![field(&request, "namespace").to_owned()],
        cluster_resources: false,
        secret_name: "kubeconfig".into(),
        secret_resource_version: None,
        credentials: ClusterCredentials {
            bearer_token: Some(field(&request, "token").to_owned()),
            certificate_authority_data: request["ca_data"].as_str().map(str::to_owned),
            ..ClusterCredentials::default()
        },
    };
    let connection = connection_check(Some(&policy), &intent).await;
    let settings = RepositoryCheckSettings {
        ca_file: Some(field(&request, "repository_ca_file").into()),
        ..RepositoryCheckSettings::new(policy)
    };
    let credentials =
        RepositoryCredentials { username: Some(USER.into()), password: Some(PASSWORD.into()), ssh_private_key: None };
    let repository = validate(Some(&settings), field(&request, "repository"), &credentials).await;
    let found: Found = [
        (connection.status.to_owned(), connection.reason.to_owned()),
        (repository.url.0.to_owned(), repository.url.1.to_owned()),
        (repository.credential.0.to_owned(), repository.credential.1.to_owned()),
    ];
    println!("{RESULT}{}", serde_json::to_string(&found).expect("json"));
    0
}

/// A listener on loopback that counts the connections made to it and closes them.
struct RecordingProxy {
    port: u16,
    connections: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl RecordingProxy {
    async fn start() -> RecordingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("address").port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        RecordingProxy { port, connections, accept }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for RecordingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

#[tokio::test]
async fn writer_checks_contact_tenant_hosts_without_proxies_from_the_environment() {
    let cluster = TestCluster::get().await;
    let namespace = cluster.namespace("proxy-check").await;
    let crate::writer_connection::Server { url: api_url, ca_data, insecure, token, .. } =
        crate::writer_connection::server(namespace.name()).await;
    let api_authority = api_url.strip_prefix("https://").expect("an https server").split('/').next().unwrap_or("");
    assert!(
        api_authority.starts_with("127.0.0.1:") || api_authority.starts_with("[::1]:"),
        "the test tier's API server is on loopback: {api_url}"
    );

    let scratch = Scratch::new("git-proxy").expect("scratch directory");
    let root = scratch.path().join("repos");
    std::fs::create_dir_all(root.join("org")).expect("repos");
    bare_repository(&root, "org/repo.git").expect("a bare repository");
    let git = GitHttpsServer::start(&root, USER, PASSWORD).await.expect("the HTTPS Git server");
    let ca_file = scratch.path().join("ca.pem");
    std::fs::write(&ca_file, &git.ca_pem).expect("write the CA");
    let repository = git.url("org/repo.git");

    let proxy = RecordingProxy::start().await;
    let request = json!({
        "allow": [api_authority, format!("127.0.0.1:{}", git.port)],
        "api_url": api_url,
        "ca_data": ca_data,
        "insecure": insecure,
        "token": token,
        "namespace": namespace.name(),
        "repository": repository,
        "repository_ca_file": ca_file.display().to_string(),
    });
    let environment: Vec<(&str, String)> = PROXY_VARIABLES.iter().map(|name| (*name, proxy.url())).collect();
    let args = [serde_json::to_string(&request).expect("json")];
    let git_connections_before = git.connections();
    let child = spawn("egress-checks", &args, &environment, None);
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("the checks end within the deadline")
        .expect("the child's output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "the child failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let found: Found = stdout
        .lines()
        .find_map(|line| line.split_once(RESULT).map(|(_, found)| found))
        .map(|line| serde_json::from_str(line).expect("the child's results"))
        .unwrap_or_else(|| panic!("no results from the child: {stdout}"));

    let expected: Found = [
        ("True".into(), REASON_SUCCEEDED.into()),
        ("True".into(), REASON_VALID_URL.into()),
        ("True".into(), REASON_CREDENTIALS_UP_TO_DATE.into()),
    ];
    assert_eq!(found, expected, "both checks reached their loopback targets");
    assert!(git.connections() > git_connections_before, "the Git server was contacted directly");
    assert_eq!(proxy.connections(), 0, "the proxy from the environment saw nothing");

    // The listener does see a client that honours the variables: plain git, same environment.
    let control = tokio::process::Command::new("git")
        .args(["-c", &format!("http.sslCAInfo={}", ca_file.display()), "ls-remote", "--", &repository])
        .envs(environment.iter().map(|(k, v)| (*k, v.as_str())))
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run git");
    assert!(!control.status.success(), "git through a proxy that closes every connection fails");
    eventually("the proxy to record plain git's connection", || async { (proxy.connections() > 0).then_some(()) })
        .await;
}
