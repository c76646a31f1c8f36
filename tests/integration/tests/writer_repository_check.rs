//! Validating repository credentials against the repository, with real `git` against
//! Git servers on loopback (the testkit's smart HTTPS server with basic
//! authentication in front of `git http-backend`, and OpenSSH's sshd): the right
//! password or key is `RepositoryCredentialUpToDate`, a wrong one
//! `InvalidCredentials`, a missing repository `InvalidRepositoryUrl`; a redirect, an
//! unknown host key or a closed port is `ConnectionFailed`; a destination the egress
//! policy refuses (not listed, deny-listed, or a name that resolves to loopback
//! without an address entry) is `ValidationDenied` and the server sees no connection.
//! End to end through the writer: the conditions on the resource, validation again
//! without any change (periodic), a fixed Secret revalidated, and validation off by
//! default. No condition carries a secret.
//! Tests wait on conditions with deadlines, never on time.

use std::path::PathBuf;

use gitops_shared::db::credential::RepositoryCredentials;
use gitops_testkit::git_server::{GitHttpsServer, GitSshServer, Scratch, bare_repository};
use gitops_writer::api::{Condition, GitOpsDeploymentRepositoryCredential};
use gitops_writer::controller::connection::{ConnectionPolicy, Destination};
use gitops_writer::controller::repository_check::{
    CREDENTIAL_CONDITION, REASON_CONNECTION_FAILED, REASON_CREDENTIALS_UP_TO_DATE, REASON_INVALID_CREDENTIALS,
    REASON_INVALID_URL, REASON_VALID_URL, REASON_VALIDATION_DENIED, REASON_VALIDATION_DISABLED,
    RepositoryCheckSettings, URL_CONDITION, Validation, validate,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::eventually;

const USER: &str = "bot";
const PASSWORD: &str = "r1ght-s3cret-pass";
const WRONG: &str = "wr0ng-s3cret-pass";

fn destinations(patterns: &[&str]) -> Vec<Destination> {
    patterns.iter().map(|p| p.parse().unwrap_or_else(|e| panic!("{e}"))).collect()
}

fn basic(password: &str) -> RepositoryCredentials {
    RepositoryCredentials { username: Some(USER.into()), password: Some(password.into()), ssh_private_key: None }
}

fn key(key: &str) -> RepositoryCredentials {
    RepositoryCredentials { username: None, password: None, ssh_private_key: Some(key.into()) }
}

/// An HTTPS server with one repository, `org/repo.git`, and its CA as a file.
struct Https {
    _scratch: Scratch,
    server: GitHttpsServer,
    ca_file: PathBuf,
}

async fn https() -> Https {
    let scratch = Scratch::new("git-https").expect("scratch directory");
    let root = scratch.path().join("repos");
    std::fs::create_dir_all(root.join("org")).expect("repos");
    bare_repository(&root, "org/repo.git").expect("a bare repository");
    let server = GitHttpsServer::start(&root, USER, PASSWORD).await.expect("the HTTPS Git server");
    let ca_file = scratch.path().join("ca.pem");
    std::fs::write(&ca_file, &server.ca_pem).expect("write the CA");
    Https { _scratch: scratch, server, ca_file }
}

impl Https {
    fn settings(&self, allow: &[&str], deny: &[&str]) -> RepositoryCheckSettings {
        RepositoryCheckSettings {
            ca_file: Some(self.ca_file.clone()),
            ..RepositoryCheckSettings::new(ConnectionPolicy::new(destinations(allow), destinations(deny)))
        }
    }

    fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.server.port)
    }
}

/// Asserts both conditions' (status, reason) and that no secret is in the outcome.
fn expect(validation: &Validation, url: (&str, &str), credential: (&str, &str)) {
    assert_eq!((validation.url.0, validation.url.1), url, "{validation:?}");
    assert_eq!((validation.credential.0, validation.credential.1), credential, "{validation:?}");
    let text = format!("{:?} {:?}", validation.url, validation.credential);
    for secret in [PASSWORD, WRONG, "PRIVATE KEY"] {
        assert!(!text.contains(secret), "no secret in {text}");
    }
}

#[tokio::test]
async fn writer_repository_check_https_with_basic_auth() {
    let https = https().await;
    let settings = https.settings(&[&https.authority()], &[]);
    let repo = https.server.url("org/repo.git");
    let ok = validate(Some(&settings), &repo, &basic(PASSWORD)).await;
    expect(&ok, ("True", REASON_VALID_URL), ("True", REASON_CREDENTIALS_UP_TO_DATE));
    let wrong = validate(Some(&settings), &repo, &basic(WRONG)).await;
    expect(&wrong, ("Unknown", REASON_INVALID_CREDENTIALS), ("False", REASON_INVALID_CREDENTIALS));
    let missing = validate(Some(&settings), &https.server.url("org/nope.git"), &basic(PASSWORD)).await;
    expect(&missing, ("False", REASON_INVALID_URL), ("False", REASON_INVALID_URL));
    let redirected = validate(Some(&settings), &https.server.url("redirect/org/repo.git"), &basic(PASSWORD)).await;
    expect(&redirected, ("Unknown", REASON_CONNECTION_FAILED), ("Unknown", REASON_CONNECTION_FAILED));
    assert!(redirected.url.2.contains("redirect"), "{redirected:?}");
    // Without the CA, the server's certificate is not trusted.
    let untrusted = RepositoryCheckSettings { ca_file: None, ..settings.clone() };
    let tls = validate(Some(&untrusted), &repo, &basic(PASSWORD)).await;
    expect(&tls, ("Unknown", REASON_CONNECTION_FAILED), ("Unknown", REASON_CONNECTION_FAILED));
    // A closed port on an allowed address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let closed_port = closed.local_addr().expect("address").port();
    drop(closed);
    let settings_closed = https.settings(&[&format!("127.0.0.1:{closed_port}")], &[]);
    let refused =
        validate(Some(&settings_closed), &format!("https://127.0.0.1:{closed_port}/org/repo.git"), &basic(PASSWORD))
            .await;
    expect(&refused, ("Unknown", REASON_CONNECTION_FAILED), ("Unknown", REASON_CONNECTION_FAILED));
}

#[tokio::test]
async fn writer_repository_check_a_stalled_server_is_given_up_on() {
    // Accepts connections and never answers: the check must end by itself.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
        }
    });
    let settings = RepositoryCheckSettings {
        timeout: std::time::Duration::from_secs(1),
        ..RepositoryCheckSettings::new(ConnectionPolicy::new(destinations(&[&format!("127.0.0.1:{port}")]), vec![]))
    };
    let stalled = validate(Some(&settings), &format!("https://127.0.0.1:{port}/r.git"), &basic(PASSWORD)).await;
    expect(&stalled, ("Unknown", REASON_CONNECTION_FAILED), ("Unknown", REASON_CONNECTION_FAILED));
    assert!(stalled.url.2.contains("did not answer within 1 seconds"), "{stalled:?}");
    held.abort();
}

#[tokio::test]
async fn writer_repository_check_refused_destinations_are_not_contacted() {
    let https = https().await;
    let port = https.server.port;
    let by_name = format!("https://localhost:{port}/org/repo.git");
    let by_mapped = format!("https://[::ffff:127.0.0.1]:{port}/org/repo.git");
    let by_decimal = format!("https://2130706433:{port}/org/repo.git");
    let by_hex = format!("https://0x7f000001:{port}/org/repo.git");
    let before = https.server.connections();
    for (settings, url, why) in [
        (https.settings(&[], &[]), https.server.url("org/repo.git"), "allow list is empty"),
        (https.settings(&["git.example.invalid"], &[]), https.server.url("org/repo.git"), "not on the writer's"),
        (https.settings(&[&https.authority()], &[&https.authority()]), https.server.url("org/repo.git"), "deny list"),
        // `*` and a host name never open loopback: an address entry must name it.
        (https.settings(&["*"], &[]), https.server.url("org/repo.git"), "loopback"),
        (https.settings(&[&format!("localhost:{port}")], &[]), by_name.clone(), "loopback"),
        (https.settings(&["*"], &[]), by_mapped, "loopback"),
        (https.settings(&["*", "127.0.0.0/8"], &[]), by_decimal, "not a plain host name"),
        (https.settings(&["*", "127.0.0.0/8"], &[]), by_hex, "not a plain host name"),
        (
            https.settings(&[&format!("localhost:{port}"), "127.0.0.0/8", "[::1]"], &["127.0.0.1"]),
            by_name.clone(),
            "deny list",
        ),
    ] {
        let validation = validate(Some(&settings), &url, &basic(PASSWORD)).await;
        expect(&validation, ("Unknown", REASON_VALIDATION_DENIED), ("Unknown", REASON_VALIDATION_DENIED));
        assert!(validation.url.2.contains(why), "{url}: {validation:?}");
    }
    assert_eq!(https.server.connections(), before, "a refused destination was contacted");
    // The name is allowed once its addresses are: git connects to the checked address.
    let named = https.settings(&[&format!("localhost:{port}"), "127.0.0.0/8", "[::1]"], &[]);
    let ok = validate(Some(&named), &by_name, &basic(PASSWORD)).await;
    expect(&ok, ("True", REASON_VALID_URL), ("True", REASON_CREDENTIALS_UP_TO_DATE));
    assert!(https.server.connections() > before);
}

#[tokio::test]
async fn writer_repository_check_ssh_with_private_keys() {
    let scratch = Scratch::new("git-ssh").expect("scratch directory");
    let repo_path = bare_repository(scratch.path(), "repo.git").expect("a bare repository");
    let ssh = GitSshServer::start(scratch.path()).await.expect("sshd on loopback");
    let authority = format!("127.0.0.1:{}", ssh.port);
    let settings = RepositoryCheckSettings {
        known_hosts: Some(ssh.known_hosts.clone()),
        ..RepositoryCheckSettings::new(ConnectionPolicy::new(destinations(&[&authority]), vec![]))
    };
    let repo = ssh.url(&repo_path);
    let ok = validate(Some(&settings), &repo, &key(&ssh.client_key)).await;
    expect(&ok, ("True", REASON_VALID_URL), ("True", REASON_CREDENTIALS_UP_TO_DATE));
    let wrong = validate(Some(&settings), &repo, &key(&ssh.other_key)).await;
    expect(&wrong, ("Unknown", REASON_INVALID_CREDENTIALS), ("False", REASON_INVALID_CREDENTIALS));
    let missing = validate(Some(&settings), &ssh.url(&scratch.path().join("nope.git")), &key(&ssh.client_key)).await;
    expect(&missing, ("False", REASON_INVALID_URL), ("False", REASON_INVALID_URL));
    // Another host key for the server: refused before any credential is offered.
    let impostor = RepositoryCheckSettings { known_hosts: Some(ssh.wrong_known_hosts.clone()), ..settings.clone() };
    let host_key = validate(Some(&impostor), &repo, &key(&ssh.client_key)).await;
    expect(&host_key, ("Unknown", REASON_CONNECTION_FAILED), ("Unknown", REASON_CONNECTION_FAILED));
    assert!(host_key.url.2.contains("host key"), "{host_key:?}");
    // No known-hosts file: SSH repositories are not contacted at all.
    let blind = RepositoryCheckSettings { known_hosts: None, ..settings.clone() };
    let refused = validate(Some(&blind), &repo, &key(&ssh.client_key)).await;
    expect(&refused, ("Unknown", REASON_VALIDATION_DENIED), ("Unknown", REASON_VALIDATION_DENIED));
    // Not on the allow list.
    let unlisted = RepositoryCheckSettings::new(ConnectionPolicy::new(destinations(&["*"]), vec![]));
    let unlisted = RepositoryCheckSettings { known_hosts: Some(ssh.known_hosts.clone()), ..unlisted };
    let denied = validate(Some(&unlisted), &repo, &key(&ssh.client_key)).await;
    expect(&denied, ("Unknown", REASON_VALIDATION_DENIED), ("Unknown", REASON_VALIDATION_DENIED));
}

/// (status, reason) of both conditions once they speak of the object's generation.
async fn conditions_of(api: &Api<GitOpsDeploymentRepositoryCredential>, name: &str) -> [(String, String); 2] {
    eventually("the repository conditions", || async {
        let object = api.get_opt(name).await.ok()??;
        let conditions = object.status?.conditions;
        let of = |type_: &str| -> Option<(String, String)> {
            let c: &Condition = conditions.iter().find(|c| c.type_ == type_)?;
            let message = c.message.clone().unwrap_or_default();
            assert!(!message.contains(PASSWORD) && !message.contains(WRONG), "no secret in {message}");
            (c.observed_generation == object.metadata.generation)
                .then(|| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        };
        Some([of(URL_CONDITION)?, of(CREDENTIAL_CONDITION)?])
    })
    .await
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

#[tokio::test]
async fn writer_repository_check_conditions_follow_the_secret() {
    let https = https().await;
    let env = crate::support::writer::env("wrepo-check").await;
    // Validated again every 300 ms here (10 minutes by default).
    let settings = RepositoryCheckSettings {
        revalidate_every: std::time::Duration::from_millis(300),
        ..https.settings(&[&https.authority()], &[])
    };
    env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |config| {
        config.repository_check = Some(settings);
    });
    let secrets: Api<Secret> = Api::namespaced(env.kube.clone(), env.tenant.name());
    let put = |name: &'static str, password: &'static str| {
        let secrets = secrets.clone();
        async move {
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": name}, "stringData": {"username": USER, "password": password},
            }))
            .expect("Secret");
            let patch = PatchParams::apply("writer-repository-check-test").force();
            secrets.patch(name, &patch, &Patch::Apply(&secret)).await.expect("apply Secret");
        }
    };
    put("right", PASSWORD).await;
    put("wrong", WRONG).await;
    let api: Api<GitOpsDeploymentRepositoryCredential> = Api::namespaced(env.kube.clone(), env.tenant.name());
    for (name, path, secret) in
        [("good", "org/repo.git", "right"), ("bad-pass", "org/repo.git", "wrong"), ("gone", "org/nope.git", "right")]
    {
        let object: GitOpsDeploymentRepositoryCredential = serde_json::from_value(json!({
            "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentRepositoryCredential",
            "metadata": {"name": name}, "spec": {"repository": https.server.url(path), "secret": secret},
        }))
        .expect("repository credential");
        api.create(&PostParams::default(), &object).await.expect("create");
    }
    assert_eq!(
        conditions_of(&api, "good").await,
        [pair("True", REASON_VALID_URL), pair("True", REASON_CREDENTIALS_UP_TO_DATE)]
    );
    assert_eq!(conditions_of(&api, "bad-pass").await[1], pair("False", REASON_INVALID_CREDENTIALS));
    assert_eq!(conditions_of(&api, "gone").await[0], pair("False", REASON_INVALID_URL));
    // Nothing changes, yet the repository is contacted again (the periodic validation).
    let seen = https.server.connections();
    eventually("a periodic validation", || async { (https.server.connections() > seen + 3).then_some(()) }).await;
    // The tenant fixes the password: the change of the Secret validates again.
    put("wrong", PASSWORD).await;
    eventually("the fixed credentials validated", || async {
        let [_, credential] = conditions_of(&api, "bad-pass").await;
        (credential == pair("True", REASON_CREDENTIALS_UP_TO_DATE)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn writer_repository_check_is_off_by_default() {
    let https = https().await;
    let env = crate::support::writer::env("wrepo-off").await;
    env.writer_for("writer-a", vec![env.tenant.name().to_owned()], |_| {});
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "git"}, "stringData": {"username": USER, "password": PASSWORD},
    }))
    .expect("Secret");
    Api::<Secret>::namespaced(env.kube.clone(), env.tenant.name())
        .create(&PostParams::default(), &secret)
        .await
        .expect("create Secret");
    let api: Api<GitOpsDeploymentRepositoryCredential> = Api::namespaced(env.kube.clone(), env.tenant.name());
    let object: GitOpsDeploymentRepositoryCredential = serde_json::from_value(json!({
        "apiVersion": "managed-gitops.redhat.com/v1alpha1", "kind": "GitOpsDeploymentRepositoryCredential",
        "metadata": {"name": "git"}, "spec": {"repository": https.server.url("org/repo.git"), "secret": "git"},
    }))
    .expect("repository credential");
    api.create(&PostParams::default(), &object).await.expect("create");
    assert_eq!(
        conditions_of(&api, "git").await,
        [pair("Unknown", REASON_VALIDATION_DISABLED), pair("Unknown", REASON_VALIDATION_DISABLED)]
    );
    assert_eq!(https.server.connections(), 0, "validation off contacts no repository");
}
