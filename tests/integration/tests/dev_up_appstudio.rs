//! The README's AppStudio walk-through against `gitops-dev up`, with the real writer,
//! agent and gitops-appstudio: an Application, its Components, an Environment with
//! no target, a Snapshot and a SnapshotEnvironmentBinding; the test plays the
//! repository generator (it writes the binding's `status.components`), sees one
//! GitOpsDeployment per component and its Argo CD Application, the binding's
//! `AllComponentsDeployed`, then promotes a second Snapshot to another Environment
//! with a PromotionRun and waits for it to complete. Every step is the kubectl
//! command the README shows; like `dev_up`, it is skipped, saying so, without
//! kubectl (or with one too old for `patch --subresource`).

use std::collections::HashMap;
use std::path::Path;

use gitops_testkit::argocd::fake_revision;
use serde_json::Value;

use crate::dev_up::{assert_binaries_built, binary_dir, env_file, kubectl_ok, start_stack};

const NAMESPACE: &str = "team-b";

/// The README's first manifest: the application model and the development binding.
const MODEL: &str = "apiVersion: appstudio.redhat.com/v1alpha1
kind: Application
metadata: {name: shop, namespace: team-b}
spec: {displayName: Shop}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: Component
metadata: {name: web, namespace: team-b}
spec: {application: shop, componentName: web}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: Component
metadata: {name: api, namespace: team-b}
spec: {application: shop, componentName: api}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: Environment
metadata: {name: development, namespace: team-b}
spec: {displayName: Development, deploymentStrategy: Manual}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: Snapshot
metadata: {name: shop-1, namespace: team-b}
spec:
  application: shop
  components:
  - {name: web, containerImage: registry.example.invalid/team-b/web:1}
  - {name: api, containerImage: registry.example.invalid/team-b/api:1}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: SnapshotEnvironmentBinding
metadata: {name: shop-development, namespace: team-b}
spec:
  application: shop
  environment: development
  snapshot: shop-1
  components: [{name: web}, {name: api}]
";

/// The README's second manifest: another Environment, a second Snapshot, its promotion.
const PROMOTION: &str = "apiVersion: appstudio.redhat.com/v1alpha1
kind: Environment
metadata: {name: production, namespace: team-b}
spec: {displayName: Production, deploymentStrategy: Manual}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: Snapshot
metadata: {name: shop-2, namespace: team-b}
spec:
  application: shop
  components:
  - {name: web, containerImage: registry.example.invalid/team-b/web:2}
  - {name: api, containerImage: registry.example.invalid/team-b/api:2}
---
apiVersion: appstudio.redhat.com/v1alpha1
kind: PromotionRun
metadata: {name: shop-2-to-production, namespace: team-b}
spec:
  application: shop
  snapshot: shop-2
  manualPromotion: {targetEnvironment: production}
";

const REPOSITORY: &str = "https://git.example.invalid/team-b/shop-gitops.git";

/// What the repository generator writes into a binding of `environment` (the
/// README's `kubectl patch`): one overlay per component, as it would commit them.
fn generator_status(environment: &str) -> String {
    "
status:
  components:
  - name: web
    gitopsRepository: {url: https://git.example.invalid/team-b/shop-gitops.git, branch: main,
      path: components/web/overlays/ENV, generatedResources: [], commitID: \"\"}
  - name: api
    gitopsRepository: {url: https://git.example.invalid/team-b/shop-gitops.git, branch: main,
      path: components/api/overlays/ENV, generatedResources: [], commitID: \"\"}
"
    .replace("ENV", environment)
}

/// kubectl's client minor version, when it says.
fn kubectl_minor() -> Option<u32> {
    let output = std::process::Command::new("kubectl").args(["version", "--client", "-o", "json"]).output().ok()?;
    let version: Value = serde_json::from_slice(&output.stdout).ok()?;
    version["clientVersion"]["minor"].as_str()?.trim_end_matches('+').parse().ok()
}

async fn get_json(env: &HashMap<String, String>, cache: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = kubectl_ok(env, cache, &all, None).await;
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {all:?} printed no JSON ({e}): {out}"))
}

fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .map(|items| items.iter().filter_map(|i| i["metadata"]["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn dev_up_walks_an_environment_to_a_promoted_snapshot() {
    match kubectl_minor() {
        None => {
            eprintln!("kubectl is not installed: the AppStudio walk-through was skipped");
            return;
        }
        Some(minor) if minor < 24 => {
            eprintln!("kubectl 1.{minor} has no `patch --subresource`: the AppStudio walk-through was skipped");
            return;
        }
        Some(_) => {}
    }
    let bin = binary_dir();
    assert_binaries_built(&bin);
    let mut stack = start_stack(&bin, "appstudio").await;
    let env = env_file(&stack.dir.join("env"));
    let cache = stack.dir.join("kubectl-cache");

    kubectl_ok(&env, &cache, &["create", "namespace", NAMESPACE], None).await;
    let out = kubectl_ok(&env, &cache, &["apply", "-f", "-"], Some(MODEL)).await;
    assert!(out.contains("snapshotenvironmentbinding.appstudio.redhat.com/shop-development created"), "{out}");

    // No target: no ManagedEnvironment; the binding waits for the repository generator.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let binding =
            get_json(&env, &cache, &["get", "snapshotenvironmentbinding", "shop-development", "-n", NAMESPACE]).await;
        let reconciled = binding["status"]["bindingConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Reconciled")
            .cloned();
        if let Some(reconciled) = reconciled {
            assert_eq!(reconciled["reason"], "WaitingForComponentStatus", "{binding}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the binding never reported its wait in time: {binding}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let managed = get_json(&env, &cache, &["get", "gitopsdeploymentmanagedenvironments", "-n", NAMESPACE]).await;
    assert_eq!(names(&managed), Vec::<String>::new(), "{managed}");

    // Play the repository generator for the development binding.
    let status = generator_status("development");
    kubectl_ok(
        &env,
        &cache,
        &[
            "patch",
            "snapshotenvironmentbinding",
            "shop-development",
            "-n",
            NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ],
        None,
    )
    .await;
    kubectl_ok(
        &env,
        &cache,
        &[
            "wait",
            // A filter, not `[0]`: kubectl fails at once on an index into the empty list
            // the binding shows while its components are not reported yet.
            r#"--for=jsonpath={.status.componentDeploymentConditions[?(@.type=="AllComponentsDeployed")].status}=True"#,
            "snapshotenvironmentbinding/shop-development",
            "-n",
            NAMESPACE,
            "--timeout=180s",
        ],
        None,
    )
    .await;

    let development = ["shop-development-shop-development-api", "shop-development-shop-development-web"];
    let deployments = get_json(&env, &cache, &["get", "gitopsdeployments", "-n", NAMESPACE]).await;
    assert_eq!(names(&deployments), development, "{deployments}");
    for deployment in deployments["items"].as_array().into_iter().flatten() {
        assert_eq!(deployment["spec"]["source"]["repoURL"], REPOSITORY, "{deployment}");
        assert_eq!(deployment["metadata"]["labels"]["appstudio.openshift.io/environment"], "development");
        assert_eq!(deployment["metadata"]["ownerReferences"][0]["name"], "shop-development", "{deployment}");
        assert_eq!(deployment["spec"]["destination"], serde_json::json!({}), "no target: {deployment}");
    }
    let binding =
        get_json(&env, &cache, &["get", "snapshotenvironmentbinding", "shop-development", "-n", NAMESPACE]).await;
    let condition = &binding["status"]["componentDeploymentConditions"][0];
    assert_eq!(condition["type"], "AllComponentsDeployed", "{binding}");
    assert_eq!(condition["reason"], "CommitsSynced", "{binding}");
    assert_eq!(condition["message"], "2 of 2 components deployed", "{binding}");
    // The commit each deployment reports is the one the stand-in resolves `main` to.
    for entry in binding["status"]["gitopsDeployments"].as_array().into_iter().flatten() {
        let component = entry["componentName"].as_str().unwrap_or_default();
        let path = format!("components/{component}/overlays/development");
        assert_eq!(entry["commitID"], fake_revision(REPOSITORY, &path, "main").as_str(), "{binding}");
    }
    let table = kubectl_ok(&env, &cache, &["get", "snapshotenvironmentbindings", "-n", NAMESPACE], None).await;
    assert!(
        table.lines().any(|l| l.starts_with("shop-development ") && l.contains("2 of 2 components deployed")),
        "{table}"
    );

    // Each deployment has its Argo CD Application in the stand-in's namespace.
    wait_for_applications(&env, &cache, &development).await;

    // Promote the second Snapshot to production.
    let out = kubectl_ok(&env, &cache, &["apply", "-f", "-"], Some(PROMOTION)).await;
    assert!(out.contains("promotionrun.appstudio.redhat.com/shop-2-to-production created"), "{out}");
    kubectl_ok(
        &env,
        &cache,
        &[
            "wait",
            "--for=jsonpath={.status.activeBindings[0]}=shop-production-generated-binding",
            "promotionrun/shop-2-to-production",
            "-n",
            NAMESPACE,
            "--timeout=120s",
        ],
        None,
    )
    .await;
    let generated = get_json(
        &env,
        &cache,
        &["get", "snapshotenvironmentbinding", "shop-production-generated-binding", "-n", NAMESPACE],
    )
    .await;
    assert_eq!(generated["spec"]["snapshot"], "shop-2", "{generated}");
    assert_eq!(
        generated["metadata"]["labels"]["appstudio.redhat.com/generated-by-promotion-run"],
        "shop-2-to-production"
    );
    let run = get_json(&env, &cache, &["get", "promotionrun", "shop-2-to-production", "-n", NAMESPACE]).await;
    assert_eq!(
        run["status"]["environmentStatus"][0]["displayStatus"],
        "Waiting for the environment binding to create all of the expected GitOpsDeployments.",
        "no deployments before the repository generator reports: {run}"
    );
    assert_eq!(generated["spec"]["components"], serde_json::json!([{"name": "api"}, {"name": "web"}]), "{generated}");
    let status = generator_status("production");
    kubectl_ok(
        &env,
        &cache,
        &[
            "patch",
            "snapshotenvironmentbinding",
            "shop-production-generated-binding",
            "-n",
            NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ],
        None,
    )
    .await;
    kubectl_ok(
        &env,
        &cache,
        &[
            "wait",
            "--for=jsonpath={.status.state}=Complete",
            "promotionrun/shop-2-to-production",
            "-n",
            NAMESPACE,
            "--timeout=180s",
        ],
        None,
    )
    .await;
    let run = get_json(&env, &cache, &["get", "promotionrun", "shop-2-to-production", "-n", NAMESPACE]).await;
    assert_eq!(run["status"]["completionResult"], "Success", "{run}");
    assert_eq!(run["status"]["environmentStatus"][0]["environmentName"], "production", "{run}");
    assert_eq!(run["status"]["environmentStatus"][0]["status"], "Success", "{run}");

    let production = [
        "shop-production-generated-binding-shop-production-api",
        "shop-production-generated-binding-shop-production-web",
    ];
    let deployments = get_json(&env, &cache, &["get", "gitopsdeployments", "-n", NAMESPACE]).await;
    let mut expected: Vec<&str> = development.iter().chain(production.iter()).copied().collect();
    expected.sort_unstable();
    assert_eq!(names(&deployments), expected, "{deployments}");
    wait_for_applications(&env, &cache, &expected).await;

    // The layer's admission webhook is in the stack: a PromotionRun's spec is fixed.
    let (ok, _, stderr) = crate::dev_up::kubectl(
        &env,
        &cache,
        &[
            "patch",
            "promotionrun",
            "shop-2-to-production",
            "-n",
            NAMESPACE,
            "--type=merge",
            "-p",
            r#"{"spec":{"snapshot":"shop-1"}}"#,
        ],
        None,
    )
    .await;
    assert!(!ok, "a PromotionRun's spec was changed");
    assert!(stderr.contains("spec cannot be updated to {Snapshot:shop-1 Application:shop"), "{stderr}");

    let status = stack.stop().await;
    assert!(status.success(), "gitops-dev up exited with {status}");
    let _ = std::fs::remove_dir_all(&stack.dir);
}

/// Waits until each of `deployments` (in the tenant's namespace) has its Argo CD
/// Application, `gitops-<deployment UID>`, in the stand-in's namespace, with the
/// deployment's path and the tenant's namespace as destination.
async fn wait_for_applications(env: &HashMap<String, String>, cache: &Path, deployments: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let tenant = get_json(env, cache, &["get", "gitopsdeployments", "-n", NAMESPACE]).await;
        let argocd = get_json(env, cache, &["get", "applications.argoproj.io", "-n", "argocd"]).await;
        let missing: Vec<&str> = deployments
            .iter()
            .copied()
            .filter(|name| {
                let Some(deployment) =
                    tenant["items"].as_array().into_iter().flatten().find(|d| d["metadata"]["name"] == *name)
                else {
                    return true;
                };
                let application = format!("gitops-{}", deployment["metadata"]["uid"].as_str().unwrap_or_default());
                !argocd["items"].as_array().into_iter().flatten().any(|a| {
                    a["metadata"]["name"] == application.as_str()
                        && a["spec"]["source"]["path"] == deployment["spec"]["source"]["path"]
                        && a["spec"]["destination"]["namespace"] == NAMESPACE
                })
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "no Argo CD Application for {missing:?} in time: {argocd}");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
