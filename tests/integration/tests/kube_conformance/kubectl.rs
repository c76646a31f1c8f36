//! A `kubectl` session against the cluster, as a person debugging the service would
//! run it: create a CRD, apply an object, read it back as YAML, apply server-side,
//! patch its status subresource, and delete it past a finalizer. Skipped, saying so,
//! when no `kubectl` is installed.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

use super::{Env, GADGET, random_name};

/// Runs kubectl with the cluster's kubeconfig and a discovery cache of the test's own.
struct Kubectl {
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> Output {
        let mut command = tokio::process::Command::new("kubectl");
        command.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(self.dir.join("cache")).args(args);
        command.output().await.expect("run kubectl")
    }

    /// Runs kubectl and returns its stdout; panics with its stderr if it fails.
    async fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args).await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "kubectl {args:?} failed: {stderr}\n{stdout}");
        stdout
    }

    async fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&args).await).expect("kubectl -o json")
    }

    fn write(&self, name: &str, contents: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).expect("write a manifest");
        path.to_string_lossy().into_owned()
    }
}

/// Deletes the session's CRD and scratch directory even when the test fails.
struct Cleanup {
    kubeconfig: PathBuf,
    crd: String,
    dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["delete", "crd", &self.crd, "--ignore-not-found", "--wait=false"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn kubectl_installed() -> bool {
    std::process::Command::new("kubectl").args(["version", "--client"]).output().is_ok_and(|o| o.status.success())
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(random_name("gitops-kubectl"));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

#[tokio::test]
async fn a_kubectl_session_creates_applies_reads_patches_and_deletes() {
    if !kubectl_installed() {
        eprintln!("kubectl is not installed: the kubectl session test was skipped");
        return;
    }
    let env = Env::new("kubectl").await;
    let ns = env.ns();
    let group = format!("{}.kubectl.gitops.example.invalid", random_name("g"));
    let crd = GADGET.crd_in(&group);
    let crd_name = crd.metadata.name.clone().unwrap();
    let kubectl = Kubectl { kubeconfig: env.cluster.kubeconfig_path().to_owned(), dir: scratch_dir() };
    let _cleanup = Cleanup { kubeconfig: kubectl.kubeconfig.clone(), crd: crd_name.clone(), dir: kubectl.dir.clone() };

    // kubectl reads YAML or JSON; JSON is YAML.
    let crd_file = kubectl.write("crd.yaml", &serde_json::to_string_pretty(&crd).unwrap());
    let out = kubectl.ok(&["create", "-f", &crd_file]).await;
    assert!(out.contains(&format!("customresourcedefinition.apiextensions.k8s.io/{crd_name} created")), "{out}");
    kubectl.ok(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{crd_name}")]).await;

    let manifest = |spec: &str| {
        format!(
            "apiVersion: {group}/v1\nkind: Gadget\nmetadata:\n  name: k1\n  namespace: {ns}\n  labels:\n    app: demo\nspec:\n{spec}"
        )
    };
    let object = kubectl.write("object.yaml", &manifest("  size: 1\n"));
    let out = kubectl.ok(&["apply", "-f", &object]).await;
    assert!(out.contains(&format!("gadget.{group}/k1 created")), "{out}");

    let yaml = kubectl.ok(&["get", "-n", ns, &format!("gadgets.{group}"), "k1", "-o", "yaml"]).await;
    for line in ["kind: Gadget", "name: k1", &format!("namespace: {ns}"), "size: 1", "app: demo"] {
        assert!(yaml.contains(line), "`{line}` in\n{yaml}");
    }
    let table = kubectl.ok(&["get", "-n", ns, &format!("gadgets.{group}")]).await;
    assert!(table.lines().any(|l| l.starts_with("k1 ")), "{table}");

    let applied = kubectl.write("object-ssa.yaml", &manifest("  size: 2\n  color: red\n"));
    let out = kubectl.ok(&["apply", "--server-side", "-f", &applied]).await;
    assert!(out.contains(&format!("gadget.{group}/k1 serverside-applied")), "{out}");
    let object = kubectl.json(&["get", "-n", ns, &format!("gadgets.{group}"), "k1", "--show-managed-fields"]).await;
    assert_eq!(object["spec"], serde_json::json!({"size": 2, "color": "red"}));
    let managers: Vec<&str> =
        object["metadata"]["managedFields"].as_array().unwrap().iter().filter_map(|m| m["manager"].as_str()).collect();
    assert!(managers.contains(&"kubectl"), "{managers:?}");

    let resource = format!("gadgets.{group}");
    kubectl
        .ok(&[
            "patch",
            "-n",
            ns,
            &resource,
            "k1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"ready":true}}"#,
        ])
        .await;
    let object = kubectl.json(&["get", "-n", ns, &resource, "k1"]).await;
    assert_eq!(object["status"]["ready"], true);
    assert_eq!(object["metadata"]["generation"], 2, "only the server-side apply bumped the generation");

    let hold = r#"{"metadata":{"finalizers":["kubectl.gitops.example.invalid/hold"]}}"#;
    kubectl.ok(&["patch", "-n", ns, &resource, "k1", "--type=merge", "-p", hold]).await;
    let out = kubectl.ok(&["delete", "-n", ns, &resource, "k1", "--wait=false"]).await;
    assert!(out.contains(&format!("gadget.{group} \"k1\" deleted")), "{out}");
    let object = kubectl.json(&["get", "-n", ns, &resource, "k1"]).await;
    assert!(object["metadata"]["deletionTimestamp"].is_string(), "{object}");
    kubectl
        .ok(&[
            "patch",
            "-n",
            ns,
            &resource,
            "k1",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ])
        .await;

    let gone = kubectl.run(&["get", "-n", ns, &resource, "k1"]).await;
    assert!(!gone.status.success());
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(stderr.contains(&format!("Error from server (NotFound): gadgets.{group} \"k1\" not found")), "{stderr}");

    let out = kubectl.ok(&["delete", "crd", &crd_name]).await;
    assert!(out.contains("deleted"), "{out}");
}

/// kubectl's everyday habits: `kubectl create` of built-in kinds sends protobuf
/// bodies, `kubectl delete` a protobuf `DeleteOptions`, and `kubectl get` prints the
/// server's Table columns (a CRD's printer columns, the built-in kinds' own).
#[tokio::test]
async fn kubectl_creates_built_in_kinds_and_prints_server_side_tables() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
    use k8s_openapi::api::rbac::v1::RoleBinding;
    use kube::Api;

    if !kubectl_installed() {
        eprintln!("kubectl is not installed: the kubectl habits test was skipped");
        return;
    }
    let env = Env::new("kubectl-habits").await;
    let ns = env.ns();
    let group = format!("{}.kubectl.gitops.example.invalid", random_name("t"));
    let crd: Value = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object", "properties": {"conditions": {"type": "array", "items": {
                        "type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}}}}}}},
                "additionalPrinterColumns": [
                    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"},
                ]}],
        }
    });
    let kubectl = Kubectl { kubeconfig: env.cluster.kubeconfig_path().to_owned(), dir: scratch_dir() };
    let crd_name = format!("widgets.{group}");
    let _cleanup = Cleanup { kubeconfig: kubectl.kubeconfig.clone(), crd: crd_name.clone(), dir: kubectl.dir.clone() };

    // Built-in kinds, as kubectl sends them (protobuf).
    let out = kubectl.ok(&["create", "secret", "generic", "creds", "-n", ns, "--from-literal=password=pw"]).await;
    assert!(out.contains("secret/creds created"), "{out}");
    kubectl.ok(&["create", "configmap", "settings", "-n", ns, "--from-literal=mode=fast"]).await;
    kubectl.ok(&["create", "serviceaccount", "bot", "-n", ns]).await;
    let subject = format!("--serviceaccount={ns}:bot");
    kubectl.ok(&["create", "rolebinding", "bot-view", "-n", ns, "--clusterrole=view", &subject]).await;
    let extra = random_name("kubectl-ns");
    kubectl.ok(&["create", "namespace", &extra]).await;

    let secret = env.namespaced::<Secret>().get("creds").await.expect("the Secret kubectl created");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(secret.data.unwrap_or_default().get("password").map(|b| b.0.clone()), Some(b"pw".to_vec()));
    let config_map = env.namespaced::<ConfigMap>().get("settings").await.expect("the ConfigMap");
    assert_eq!(config_map.data.unwrap_or_default().get("mode").map(String::as_str), Some("fast"));
    let binding = env.namespaced::<RoleBinding>().get("bot-view").await.expect("the RoleBinding");
    assert_eq!(binding.role_ref.name, "view");
    assert_eq!(binding.subjects.unwrap_or_default()[0].name, "bot");
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    assert!(namespaces.get_opt(&extra).await.expect("get").is_some(), "kubectl create namespace");

    // Server-side tables of built-in kinds.
    let table = kubectl.ok(&["get", "secrets", "creds", "-n", ns]).await;
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "TYPE", "DATA", "AGE"], "{table}");
    assert!(table.lines().any(|l| l.split_whitespace().take(3).eq(["creds", "Opaque", "1"])), "{table}");
    let table = kubectl.ok(&["get", "configmap", "settings", "-n", ns]).await;
    assert!(table.lines().next().unwrap_or_default().split_whitespace().eq(["NAME", "DATA", "AGE"]), "{table}");
    let table = kubectl.ok(&["get", "namespace", &extra]).await;
    assert!(table.lines().any(|l| l.split_whitespace().take(2).eq([extra.as_str(), "Active"])), "{table}");

    // A CRD's printer columns.
    let crd_file = kubectl.write("widgets.yaml", &serde_json::to_string_pretty(&crd).unwrap());
    kubectl.ok(&["create", "-f", &crd_file]).await;
    kubectl.ok(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{crd_name}")]).await;
    let widget = format!(
        "apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\n  namespace: {ns}\nspec:\n  size: 3\nstatus:\n  conditions:\n  - type: Reconciling\n    status: \"False\"\n  - type: Ready\n    status: \"True\"\n"
    );
    let widget_file = kubectl.write("widget.yaml", &widget);
    kubectl.ok(&["create", "-f", &widget_file]).await;
    let table = kubectl.ok(&["get", &format!("widgets.{group}"), "-n", ns]).await;
    let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines.first().map(Vec::as_slice), Some(&["NAME", "SIZE", "READY"][..]), "{table}");
    assert_eq!(lines.get(1).map(Vec::as_slice), Some(&["w1", "3", "True"][..]), "{table}");
    let table = kubectl.ok(&["get", &format!("widgets.{group}"), "-A"]).await;
    assert!(table.lines().any(|l| l.split_whitespace().eq([ns, "w1", "3", "True"])), "{table}");

    // OpenAPI v2 with the CRD's schema: explain, and client-side validation of a typo.
    // kube-apiserver publishes a new CRD's schema a moment after it is established.
    let resource = format!("widgets.{group}.spec");
    let explained = crate::support::eventually("the CRD's schema in the OpenAPI document", || async {
        let output = kubectl.run(&["explain", &resource]).await;
        output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    })
    .await;
    assert!(explained.contains("KIND:") && explained.contains("Widget"), "{explained}");
    assert!(explained.lines().any(|l| l.trim_start().starts_with("size")), "{explained}");
    let typo = widget.replace("  size: 3", "  sise: 3").replace("name: w1", "name: w2");
    let typo_file = kubectl.write("typo.yaml", &typo);
    let refused = kubectl.run(&["create", "-f", &typo_file]).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("unknown field \"sise\""), "{stderr}");

    // kubectl delete sends its DeleteOptions as protobuf.
    let out = kubectl.ok(&["delete", "configmap", "settings", "-n", ns]).await;
    assert!(out.contains("configmap \"settings\" deleted"), "{out}");
    assert!(env.namespaced::<ConfigMap>().get_opt("settings").await.expect("get").is_none());
    kubectl.ok(&["delete", "namespace", &extra, "--wait=false"]).await;
}
