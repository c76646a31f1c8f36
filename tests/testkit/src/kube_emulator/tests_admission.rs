//! In-process tests of the emulator's access reviews, RBAC escalation prevention and
//! validating webhooks, end to end through kube's client (the cross-tier versions are
//! in the integration tests' conformance suite).

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::webhook_server::{Verdict, WebhookServer};
use super::{EmulatorOptions, KubeEmulator};

async fn emulator() -> KubeEmulator {
    KubeEmulator::start(EmulatorOptions::default()).await.expect("start the emulator")
}

fn status<T: std::fmt::Debug>(result: kube::Result<T>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn object<K: serde::de::DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("a valid object")
}

fn hook(server: &WebhookServer, failure_policy: &str) -> ValidatingWebhookConfiguration {
    object(json!({
        "metadata": {"name": format!("hooks-{failure_policy}").to_lowercase()},
        "webhooks": [{
            "name": "configmaps.hooks.example.com",
            "clientConfig": {"url": server.url("/validate"), "caBundle": server.ca_bundle()},
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"hooked": "yes"}},
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }]
    }))
}

#[tokio::test]
async fn webhooks_see_writes_deny_them_and_fail_closed_or_open() {
    let emulator = emulator().await;
    let client = emulator.client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "hooked", "labels": {"hooked": "yes"}}})))
        .await
        .expect("namespace");
    let mut server = WebhookServer::start(|request: &Value| {
        match request.pointer("/object/metadata/name").and_then(Value::as_str) {
            Some(name) if name.starts_with("bad") => Verdict::Deny { code: 403, message: format!("{name} is bad") },
            _ => Verdict::Allow,
        }
    })
    .await
    .expect("webhook");
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let stored = hooks.create(&PostParams::default(), &hook(&server, "Fail")).await.expect("configuration");
    let webhook = &stored.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(webhook.timeout_seconds, Some(5));
    assert_eq!(webhook.match_policy.as_deref(), Some("Equivalent"));

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), "hooked");
    let (code, message) =
        status(maps.create(&PostParams::default(), &object(json!({"metadata": {"name": "bad-one"}}))).await);
    assert_eq!(
        (code, message.as_str()),
        (403, "admission webhook \"configmaps.hooks.example.com\" denied the request: bad-one is bad")
    );
    let review = server.next_review(Duration::from_secs(5)).await.expect("a review");
    let request = &review["request"];
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!((request["operation"].as_str(), request["namespace"].as_str()), (Some("CREATE"), Some("hooked")));
    assert_eq!(request["userInfo"]["username"], "admin");
    assert!(request["object"]["metadata"]["uid"].is_string(), "the object is fully formed: {request}");
    assert!(maps.get_opt("bad-one").await.expect("get").is_none());

    // Allowed: stored. An update through a patch is sent as UPDATE with the old object.
    maps.create(&PostParams::default(), &object(json!({"metadata": {"name": "good"}}))).await.expect("create");
    assert_eq!(server.next_review(Duration::from_secs(5)).await.expect("a review")["request"]["operation"], "CREATE");
    let patch = Patch::Merge(json!({"data": {"k": "v"}}));
    maps.patch("good", &PatchParams::default(), &patch).await.expect("patch");
    let review = server.next_review(Duration::from_secs(5)).await.expect("a review");
    assert_eq!(review["request"]["operation"], "UPDATE");
    assert_eq!(review["request"]["oldObject"]["metadata"]["name"], "good");
    assert_eq!(review["request"]["object"]["data"]["k"], "v");
    // Other namespaces are not sent.
    let default: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    default
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "bad-elsewhere"}})))
        .await
        .expect("create");

    // The webhook gone: Fail refuses with a 500, Ignore lets the write through.
    drop(server);
    let (code, message) =
        status(maps.create(&PostParams::default(), &object(json!({"metadata": {"name": "later"}}))).await);
    assert_eq!(code, 500);
    assert!(
        message.starts_with("Internal error occurred: failed calling webhook \"configmaps.hooks.example.com\": Post \"https://127.0.0.1:"),
        "{message}"
    );
    let mut ignore = hook(&WebhookServer::start(|_: &Value| Verdict::Allow).await.expect("webhook"), "Ignore");
    ignore.metadata.name = Some("hooks-fail".into());
    let current = hooks.get("hooks-fail").await.expect("configuration");
    ignore.metadata.resource_version = current.metadata.resource_version;
    hooks.replace("hooks-fail", &PostParams::default(), &ignore).await.expect("replace");
    maps.create(&PostParams::default(), &object(json!({"metadata": {"name": "later"}}))).await.expect("fails open");
    hooks.delete("hooks-fail", &DeleteParams::default()).await.expect("delete");
}

#[tokio::test]
async fn reviews_and_escalation_checks_answer_over_http() {
    let token_file = std::env::temp_dir().join(format!("tokens-{}", uuid::Uuid::new_v4()));
    std::fs::write(&token_file, "maker-token,maker,maker-uid\n").expect("token file");
    let options = EmulatorOptions { tokens: Some(token_file.clone()), ..EmulatorOptions::default() };
    let emulator = KubeEmulator::start(options).await.expect("emulator");
    let _ = std::fs::remove_file(&token_file);
    let client = emulator.client().await;

    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let review: SubjectAccessReview = object(json!({"spec": {"user": "nobody",
        "resourceAttributes": {"namespace": "default", "verb": "get", "resource": "secrets"}}}));
    let answer = reviews.create(&PostParams::default(), &review).await.expect("review");
    assert!(!answer.status.expect("status").allowed);
    let (code, _) = status(
        reviews.create(&PostParams::default(), &object(json!({"spec": {"resourceAttributes": {"verb": "get"}}}))).await,
    );
    assert_eq!(code, 422);

    // A user who may only write roles cannot grant more than it holds.
    let rules =
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create", "patch"]}]);
    let roles: Api<Role> = Api::namespaced(client.clone(), "default");
    roles
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "role-maker"}, "rules": rules})))
        .await
        .expect("role");
    let binding = json!({"metadata": {"name": "role-maker"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "role-maker"},
        "subjects": [{"kind": "User", "name": "maker"}]});
    Api::<RoleBinding>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &object(binding))
        .await
        .expect("binding");
    let maker: Api<Role> = Api::namespaced(emulator.client_with_token("maker-token").await, "default");
    let within: Role = object(json!({"metadata": {"name": "within"}, "rules": rules}));
    maker.create(&PostParams::default(), &within).await.expect("a role within what the maker holds");
    let wider: Role = object(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "wider"}, "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]}));
    let (code, message) = status(maker.patch("wider", &PatchParams::apply("test"), &Patch::Apply(&wider)).await);
    assert_eq!(code, 403);
    assert_eq!(
        message,
        "roles.rbac.authorization.k8s.io \"wider\" is forbidden: user \"maker\" (groups=[\"system:authenticated\"]) is \
         attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\"]}"
    );
}
