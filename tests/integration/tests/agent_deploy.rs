//! The operator's manifests in `ops/deploy/` stay true to the agent: the Role grants
//! exactly what the agent tests run with (`support::agent_rbac_rules`), in the
//! namespace the agent works in; the binding, service account and Deployment refer
//! to one another; and every environment variable the Deployment sets is one
//! `gitops-agent run` reads. The manifests are JSON-compatible YAML, so they are
//! read with serde_json (the workspace has no YAML parser).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::agent_rbac_rules;

/// Every agent manifest in `ops/deploy/`, by kind (one object per kind); the
/// writer's (`writer-*.yaml`) are checked in `writer_e2e`.
fn manifests() -> BTreeMap<String, Value> {
    crate::support::deploy_manifests(false)
}

#[test]
fn agent_deploy_role_grants_exactly_the_tested_rules_in_one_namespace() {
    let m = manifests();
    let kinds: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(kinds, ["Deployment", "Role", "RoleBinding", "ServiceAccount"]);
    assert_eq!(m["Role"]["rules"], agent_rbac_rules());
    assert!(m.keys().all(|kind| !kind.starts_with("Cluster")), "no cluster-wide grant");

    let namespace = &m["Role"]["metadata"]["namespace"];
    for object in m.values() {
        assert_eq!(&object["metadata"]["namespace"], namespace, "{} in another namespace", object["kind"]);
    }
    let binding = &m["RoleBinding"];
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], m["Role"]["metadata"]["name"]);
    let subject = &binding["subjects"][0];
    assert_eq!(subject["kind"], "ServiceAccount");
    assert_eq!(subject["name"], m["ServiceAccount"]["metadata"]["name"]);
    assert_eq!(&subject["namespace"], namespace);
    assert_eq!(
        m["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"],
        m["ServiceAccount"]["metadata"]["name"]
    );
}

#[test]
fn agent_deploy_sets_only_variables_the_agent_reads() {
    let m = manifests();
    let pod = &m["Deployment"]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["command"], serde_json::json!(["gitops-agent", "run"]));

    let known = gitops_agent::run_env_vars();
    let env = container["env"].as_array().expect("env");
    let names: Vec<&str> = env.iter().map(|e| e["name"].as_str().expect("a name")).collect();
    for name in &names {
        assert!(known.iter().any(|k| k == name), "{name} is not read by gitops-agent run ({known:?})");
    }
    for required in ["DATABASE_URL", "GITOPS_ENCRYPTION_KEYS", "GITOPS_ENCRYPTION_ACTIVE_KEY", "GITOPS_ENGINE_INSTANCE"]
    {
        assert!(names.contains(&required), "{required} not set");
    }
    for secret in ["DATABASE_URL", "GITOPS_ENCRYPTION_KEYS", "GITOPS_ENCRYPTION_ACTIVE_KEY"] {
        let var = env.iter().find(|e| e["name"] == secret).expect("set");
        assert!(var.get("value").is_none(), "{secret} must come from a Secret");
        assert!(var["valueFrom"]["secretKeyRef"]["name"].is_string(), "{secret} must come from a Secret");
    }

    // The probes reach the metrics listener, which must listen beyond loopback.
    let value = |name: &str| env.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str());
    crate::support::assert_probes_reach_metrics(container, value("GITOPS_AGENT_METRICS_ADDRESS"));

    // Shutdown drains the batch in hand, which holds leases: the pod gets longer
    // than a lease before it is killed.
    let lease = value("GITOPS_AGENT_LEASE").expect("a lease");
    let lease_secs: u64 = lease.strip_suffix('s').and_then(|s| s.parse().ok()).expect("a lease in seconds");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().expect("a grace period");
    assert!(grace > lease_secs, "terminationGracePeriodSeconds {grace} must exceed the lease {lease}");
}
