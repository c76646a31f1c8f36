//! Validating admission webhooks: a webhook this test serves on 127.0.0.1 (its own CA)
//! sees the ConfigMap writes of the test's namespace — and only those: its
//! configuration selects the namespace by a label only this test sets, because other
//! tests share the API server — as `admission.k8s.io/v1` AdmissionReviews with the
//! operation, the caller and the namespace; its denial reaches the client; with the
//! webhook gone `failurePolicy: Fail` refuses the write and `Ignore` lets it through.

use std::time::Duration;

use gitops_testkit::kube_emulator::webhook_server::{Verdict, WebhookServer};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{Env, random_name, refused, refused_with};
use crate::support::DEADLINE;

const WEBHOOK: &str = "configmaps.conformance.gitops.example.invalid";
const LABEL: &str = "conformance.gitops.example.invalid/webhook";

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).expect("a ConfigMap")
}

fn configuration(
    name: &str,
    server: &WebhookServer,
    selector: &str,
    failure_policy: &str,
) -> ValidatingWebhookConfiguration {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": {"url": server.url("/validate"), "caBundle": server.ca_bundle()},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["configmaps"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {LABEL: selector}},
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }]
    }))
    .expect("a ValidatingWebhookConfiguration")
}

/// Creates ConfigMaps named `<prefix>-<n>` until one is refused (a real API server
/// applies a new webhook configuration within moments); returns the refusal's name
/// and error.
async fn first_refused(config_maps: &Api<ConfigMap>, prefix: &str) -> (String, kube::Error) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    for attempt in 0.. {
        let name = format!("{prefix}-{attempt}");
        if let Err(error) = config_maps.create(&PostParams::default(), &config_map(&name)).await {
            return (name, error);
        }
        assert!(tokio::time::Instant::now() < deadline, "no write refused within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    unreachable!("the loop returns or panics")
}

/// The next review the webhook received for ConfigMap `name`.
async fn review_of(server: &mut WebhookServer, name: &str, operation: &str) -> Value {
    loop {
        let review =
            server.next_review(DEADLINE).await.unwrap_or_else(|| panic!("no review of {name} within {DEADLINE:?}"));
        let request = &review["request"];
        if request["name"] == name && request["operation"] == operation {
            return review;
        }
    }
}

#[tokio::test]
async fn a_validating_webhook_sees_writes_and_its_denial_reaches_the_client() {
    let env = Env::new("webhook").await;
    let ns = env.ns();
    let selector = random_name("hooked");
    let namespaces = Api::<Namespace>::all(env.client.clone());
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {LABEL: selector}}})))
        .await
        .expect("label the namespace");
    let rules = json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch", "get"]}]);
    let writer = env.cluster.namespace_identity(ns, "writer", rules).await;
    let writer_client = env.cluster.client_with_token(&writer.token).await;
    let config_maps = Api::<ConfigMap>::namespaced(writer_client, ns);
    // Let the writer's Role apply before the webhook is there.
    crate::support::eventually("the writer's Role to apply", || async {
        config_maps.create(&PostParams::default(), &config_map("before")).await.ok()
    })
    .await;

    let mut server = WebhookServer::start(|request: &Value| {
        match request.pointer("/object/metadata/name").and_then(Value::as_str) {
            Some(name) if name.starts_with("denied-") => {
                Verdict::Deny { code: 403, message: format!("{name} is not welcome here") }
            }
            _ => Verdict::Allow,
        }
    })
    .await
    .expect("start the webhook");
    let hooks = Api::<ValidatingWebhookConfiguration>::all(env.client.clone());
    let name = random_name("conformance-webhook");
    let stored = hooks
        .create(&PostParams::default(), &configuration(&name, &server, &selector, "Fail"))
        .await
        .expect("configure");
    let webhook = &stored.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!((webhook.match_policy.as_deref(), webhook.timeout_seconds), (Some("Equivalent"), Some(5)));

    let (denied, error) = first_refused(&config_maps, "denied").await;
    let status = refused_with(Err::<(), _>(error), 403, "");
    assert_eq!(
        status.message,
        format!("admission webhook \"{WEBHOOK}\" denied the request: {denied} is not welcome here")
    );
    assert!(config_maps.get_opt(&denied).await.expect("get").is_none(), "a denied object is not stored");
    let review = review_of(&mut server, &denied, "CREATE").await;
    assert_eq!(
        (review["apiVersion"].as_str(), review["kind"].as_str()),
        (Some("admission.k8s.io/v1"), Some("AdmissionReview"))
    );
    let request = &review["request"];
    assert_eq!(request["namespace"], ns);
    assert_eq!(request["userInfo"]["username"], format!("system:serviceaccount:{ns}:writer"));
    assert!(request["userInfo"]["groups"].as_array().expect("groups").contains(&json!("system:serviceaccounts")));
    assert_eq!(request["resource"], json!({"group": "", "version": "v1", "resource": "configmaps"}));
    assert_eq!(request["kind"], json!({"group": "", "version": "v1", "kind": "ConfigMap"}));
    assert_eq!((request["object"]["data"]["k"].as_str(), request["oldObject"].is_null()), (Some("v"), true));
    assert_eq!(request["dryRun"], false);

    // Allowed writes are stored; a patch is sent as an UPDATE with the old object.
    config_maps.create(&PostParams::default(), &config_map("welcome")).await.expect("allowed");
    config_maps
        .patch("welcome", &PatchParams::default(), &Patch::Merge(json!({"data": {"k": "w"}})))
        .await
        .expect("patch");
    let review = review_of(&mut server, "welcome", "UPDATE").await;
    assert_eq!(
        (review["request"]["oldObject"]["data"]["k"].as_str(), review["request"]["object"]["data"]["k"].as_str()),
        (Some("v"), Some("w"))
    );
    // Namespaces without the label are not sent to the webhook.
    let elsewhere = Api::<ConfigMap>::namespaced(env.client.clone(), "default");
    let unhooked = random_name("denied-elsewhere");
    elsewhere.create(&PostParams::default(), &config_map(&unhooked)).await.expect("not sent");
    elsewhere.delete(&unhooked, &DeleteParams::default()).await.expect("clean up");

    // The webhook down: Fail refuses with a 500 ...
    drop(server);
    let (_, error) = first_refused(&config_maps, "unanswered").await;
    let status = refused(Err::<(), _>(error));
    assert_eq!((status.code, status.reason.as_str()), (500, "InternalError"), "{status:?}");
    assert!(
        status.message.starts_with(&format!("Internal error occurred: failed calling webhook \"{WEBHOOK}\": ")),
        "{status:?}"
    );
    // ... and Ignore lets writes through (to a webhook that is down as well: the
    // server is dropped at once).
    let current = hooks.get(&name).await.expect("the configuration");
    let gone = WebhookServer::start(|_: &Value| Verdict::Allow).await.expect("a server");
    let mut ignore = configuration(&name, &gone, &selector, "Ignore");
    drop(gone);
    ignore.metadata.resource_version = current.metadata.resource_version;
    hooks.replace(&name, &PostParams::default(), &ignore).await.expect("fail open");
    crate::support::eventually("writes to go through", || async {
        config_maps.create(&PostParams::default(), &config_map(&random_name("ignored"))).await.ok()
    })
    .await;
    hooks.delete(&name, &DeleteParams::default()).await.expect("delete the configuration");
}
