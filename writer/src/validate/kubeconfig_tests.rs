//! Unit tests of the kubeconfig rules: what is accepted, and each refusal reason.

use super::*;
use crate::validate::reason::*;

const API: &str = "https://cluster.example.invalid:6443";
const CA: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==";

fn config(cluster_extra: &str, user: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
current-context: ctx
clusters:
- name: c
  cluster:
    server: https://cluster.example.invalid:6443
    certificate-authority-data: {CA}
{cluster_extra}
contexts:
- name: ctx
  context:
    cluster: c
    user: u
users:
- name: u
  user:
{user}
"
    )
}

fn reason_of(cluster_extra: &str, user: &str) -> &'static str {
    kubeconfig(&config(cluster_extra, user), API).expect_err("refused").reason
}

#[test]
fn an_inline_token_is_accepted() {
    let valid =
        kubeconfig(&config("    tls-server-name: api.example.invalid", "    token: abc.def-ghi"), API).expect("valid");
    assert_eq!(valid.credentials.bearer_token.as_deref(), Some("abc.def-ghi"));
    assert_eq!(valid.credentials.certificate_authority_data.as_deref(), Some(CA));
    assert_eq!(valid.credentials.tls_server_name.as_deref(), Some("api.example.invalid"));
    assert!(!valid.insecure_skip_tls_verify);
}

#[test]
fn an_inline_client_certificate_is_accepted() {
    let user = format!("    client-certificate-data: {CA}\n    client-key-data: {CA}");
    let valid = kubeconfig(&config("    insecure-skip-tls-verify: true", &user), API).expect("valid");
    assert_eq!(valid.credentials.client_certificate_data.as_deref(), Some(CA));
    assert_eq!(valid.credentials.client_key_data.as_deref(), Some(CA));
    assert_eq!(valid.credentials.bearer_token, None);
    assert!(valid.insecure_skip_tls_verify);
}

#[test]
fn json_and_a_kubeconfig_without_contexts_are_accepted() {
    let json =
        r#"{"clusters":[{"name":"c","cluster":{"server":"https://h"}}],"users":[{"name":"u","user":{"token":"t"}}]}"#;
    assert_eq!(kubeconfig(json, "https://h").expect("valid").credentials.bearer_token.as_deref(), Some("t"));
    let user_only = r#"{"users":[{"name":"u","user":{"token":"t"}}]}"#;
    assert!(kubeconfig(user_only, API).is_ok(), "no cluster: nothing names another server");
}

#[test]
fn each_refused_feature_has_its_reason() {
    let exec = "    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n      args: [\"-c\", \"id\"]";
    assert_eq!(reason_of("", exec), KUBECONFIG_EXEC_PLUGIN_NOT_ALLOWED);
    assert_eq!(
        reason_of("", "    token: t\n    auth-provider:\n      name: gcp"),
        KUBECONFIG_AUTH_PROVIDER_NOT_ALLOWED
    );
    assert_eq!(reason_of("", "    tokenFile: /var/run/secrets/token"), KUBECONFIG_FILE_PATH_NOT_ALLOWED);
    assert_eq!(
        reason_of("", "    client-certificate: /etc/c.crt\n    client-key-data: Zm9v"),
        KUBECONFIG_FILE_PATH_NOT_ALLOWED
    );
    assert_eq!(reason_of("", "    client-key: /etc/c.key\n    token: t"), KUBECONFIG_FILE_PATH_NOT_ALLOWED);
    assert_eq!(reason_of("    certificate-authority: /etc/ca.crt", "    token: t"), KUBECONFIG_FILE_PATH_NOT_ALLOWED);
    assert_eq!(reason_of("", "    username: admin\n    password: hunter2"), KUBECONFIG_BASIC_AUTH_NOT_ALLOWED);
    assert_eq!(
        reason_of("    proxy-url: http://proxy.example.invalid:3128", "    token: t"),
        KUBECONFIG_PROXY_NOT_ALLOWED
    );
    assert_eq!(reason_of("", "    token: t\n    as: system:admin"), KUBECONFIG_IMPERSONATION_NOT_ALLOWED);
    assert_eq!(reason_of("", "    token: t\n    as-groups: [system:masters]"), KUBECONFIG_IMPERSONATION_NOT_ALLOWED);
}

#[test]
fn a_refused_feature_in_another_user_is_still_refused() {
    let doc = format!("{}- name: other\n  user:\n    exec:\n      command: x\n", config("", "    token: t"));
    assert_eq!(kubeconfig(&doc, API).expect_err("refused").reason, KUBECONFIG_EXEC_PLUGIN_NOT_ALLOWED);
}

#[test]
fn missing_credentials() {
    assert_eq!(reason_of("", "    {}"), KUBECONFIG_NO_CREDENTIALS);
    assert_eq!(reason_of("", "    token: \"  \""), KUBECONFIG_NO_CREDENTIALS);
    assert_eq!(reason_of("", &format!("    client-certificate-data: {CA}")), KUBECONFIG_NO_CREDENTIALS);
    assert_eq!(reason_of("", &format!("    client-key-data: {CA}")), KUBECONFIG_NO_CREDENTIALS);
    let no_user = config("", "    token: t").replace("user: u\n", "user: nobody\n");
    assert_eq!(kubeconfig(&no_user, API).expect_err("refused").reason, KUBECONFIG_NO_CREDENTIALS);
}

#[test]
fn malformed_documents() {
    for bad in [
        "",
        "just a string",
        "[1, 2, 3]",
        "clusters: {not: a list}",
        "users:\n- name: u\n  user:\n    token: [1, 2]",
        "{{{{",
        "users: &a [*a]",
    ] {
        let invalid = kubeconfig(bad, API).expect_err(bad);
        assert!(matches!(invalid.reason, KUBECONFIG_MALFORMED | KUBECONFIG_NO_CREDENTIALS), "{bad}: {invalid:?}");
    }
    assert_eq!(
        reason_of("", "    client-certificate-data: '!!notbase64'\n    client-key-data: Zm9v"),
        KUBECONFIG_MALFORMED
    );
    assert_eq!(reason_of("", "    token: \"a b\""), KUBECONFIG_MALFORMED);
}

#[test]
fn size_and_characters() {
    let big = format!("# {}\n{}", "x".repeat(limits::KUBECONFIG), config("", "    token: t"));
    assert_eq!(kubeconfig(&big, API).expect_err("refused").reason, FIELD_TOO_LONG);
    assert_eq!(kubeconfig("users: []\0", API).expect_err("refused").reason, INVALID_CHARACTERS);
    let long_token = format!("    token: {}", "a".repeat(limits::CREDENTIAL_DATA + 1));
    assert_eq!(reason_of("", &long_token), FIELD_TOO_LONG);
    assert_eq!(reason_of("", "    token: \"a\\u0007b\""), INVALID_CHARACTERS);
}

#[test]
fn messages_never_quote_secrets() {
    for user in [
        "    username: admin\n    password: hunter2-secret",
        "    token: \"hunter2-secret x\"",
        "    token: [hunter2-secret",
    ] {
        let invalid = kubeconfig(&config("", user), API).expect_err("refused");
        assert!(!invalid.message.contains("hunter2"), "{invalid:?}");
    }
}

#[test]
fn arbitrary_input_never_panics() {
    const KNOWN: &[&str] = &[
        KUBECONFIG_MALFORMED,
        KUBECONFIG_NO_CREDENTIALS,
        INVALID_CHARACTERS,
        FIELD_TOO_LONG,
        UNABLE_TO_LOCATE_CONTEXT,
    ];
    let base = config("    insecure-skip-tls-verify: true", "    token: t");
    let prefixes = (0..=base.len()).filter(|cut| base.is_char_boundary(*cut)).map(|cut| &base[..cut]);
    let junk = ["\u{feff}", "---\n---\n", "!!binary aGVsbG8=", "? [a]\n: b", "users: !!map {}", "\u{1F600}: x"];
    let mut accepted = 0;
    for input in prefixes.chain(junk) {
        match kubeconfig(input, API) {
            Ok(_) => accepted += 1,
            Err(invalid) => assert!(KNOWN.contains(&invalid.reason), "{input:?}: {invalid:?}"),
        }
    }
    assert!(accepted >= 1, "the whole document is valid");
}

/// Two clusters, one context each; `current` is the current context.
fn two_contexts(current: &str, second_server: &str) -> String {
    format!(
        "current-context: {current}
clusters:
- name: prod
  cluster: {{server: 'https://prod.example.invalid:6443'}}
- name: dev
  cluster: {{server: '{second_server}'}}
contexts:
- name: prod
  context: {{cluster: prod, user: prod-admin}}
- name: dev
  context: {{cluster: dev, user: dev-admin}}
users:
- name: prod-admin
  user: {{token: prod-token}}
- name: dev-admin
  user: {{token: dev-token}}
"
    )
}

#[test]
fn the_context_whose_server_is_the_api_url_is_used_not_the_current_one() {
    let doc = two_contexts("prod", "https://dev.example.invalid:6443");
    let token = |api: &str| kubeconfig(&doc, api).map(|v| v.credentials.bearer_token.unwrap_or_default());
    assert_eq!(token("https://dev.example.invalid:6443").as_deref(), Ok("dev-token"));
    assert_eq!(token("https://prod.example.invalid:6443").as_deref(), Ok("prod-token"));
    // Normalised: host case, a trailing slash.
    assert_eq!(token("https://DEV.example.invalid:6443/").as_deref(), Ok("dev-token"));
    let none = token("https://other.example.invalid").expect_err("refused");
    assert_eq!(none.reason, UNABLE_TO_LOCATE_CONTEXT);
    assert!(none.message.contains("spec.apiURL"), "{}", none.message);
    // Two contexts for the same server: which token is meant is not for us to guess.
    let twice = two_contexts("prod", "https://prod.example.invalid:6443/");
    let several = kubeconfig(&twice, "https://prod.example.invalid:6443").expect_err("refused");
    assert_eq!(several.reason, UNABLE_TO_LOCATE_CONTEXT);
    assert!(several.message.contains("several"), "{}", several.message);
    // Without contexts, the only cluster must be the apiURL's.
    let lone =
        "clusters: [{name: c, cluster: {server: 'https://a.example.invalid'}}]\nusers: [{name: u, user: {token: t}}]";
    assert!(kubeconfig(lone, "https://a.example.invalid:443").is_ok());
    assert_eq!(kubeconfig(lone, "https://b.example.invalid").expect_err("refused").reason, UNABLE_TO_LOCATE_CONTEXT);
}

#[test]
fn servers_are_compared_after_normalising() {
    let n = |url: &str| normalised_server(url);
    assert_eq!(n("https://API.Example.invalid"), n("https://api.example.invalid:443/"));
    assert_eq!(n("HTTPS://h:6443/prefix/"), n("https://h:6443/prefix"));
    assert_eq!(n("https://[2001:db8::1]"), n("https://[2001:DB8::1]:443"));
    assert_ne!(n("https://h:6443"), n("https://h"));
    assert_ne!(n("https://h/a"), n("https://h/b"));
    assert_eq!(n("ftp://h"), None);
    assert_eq!(n("https://"), None);
    assert_eq!(n("https://h:99999"), None);
}
