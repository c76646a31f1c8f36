//! The agent's install, as kustomize renders it from `ops/deploy/agent` (and the
//! overlays), stays true to the agent: the Role grants exactly what the agent tests
//! run with (`support::agent_rbac_rules`), in the namespace the agent works in; the
//! binding, service account, Deployment, metrics Service, disruption budget and
//! network policies refer to one another; and every environment variable the
//! Deployment sets is one `gitops-agent run` reads.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::support::{agent_rbac_rules, rendered_install};

/// The agent's base, by `Kind/name`.
fn manifests() -> BTreeMap<String, Value> {
    rendered_install("agent")
}

#[test]
fn agent_deploy_role_grants_exactly_the_tested_rules_in_one_namespace() {
    let m = manifests();
    let keys: Vec<&str> = m.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "Deployment/gitops-agent",
            "NetworkPolicy/argocd-egress",
            "NetworkPolicy/gitops-agent",
            "PodDisruptionBudget/gitops-agent",
            "Role/gitops-agent",
            "RoleBinding/gitops-agent",
            "Service/gitops-agent-metrics",
            "ServiceAccount/gitops-agent",
        ]
    );
    assert_eq!(m["Role/gitops-agent"]["rules"], agent_rbac_rules());

    let namespace = &m["Role/gitops-agent"]["metadata"]["namespace"];
    for object in m.values() {
        assert_eq!(&object["metadata"]["namespace"], namespace, "{} in another namespace", object["kind"]);
    }
    let binding = &m["RoleBinding/gitops-agent"];
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], "gitops-agent");
    let subject = &binding["subjects"][0];
    assert_eq!(subject["kind"], "ServiceAccount");
    assert_eq!(subject["name"], "gitops-agent");
    assert_eq!(&subject["namespace"], namespace);
    assert_eq!(m["Deployment/gitops-agent"]["spec"]["template"]["spec"]["serviceAccountName"], "gitops-agent");
}

#[test]
fn agent_deploy_sets_only_variables_the_agent_reads() {
    let m = manifests();
    let pod = &m["Deployment/gitops-agent"]["spec"]["template"]["spec"];
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

/// The metrics Service, the disruption budget and the agent's network policy all
/// select the Deployment's pods; the policy lets in only scraping, on the metrics
/// port, and lets out DNS, PostgreSQL and the API server, nothing else.
#[test]
fn agent_deploy_service_budget_and_policy_select_the_agent() {
    let m = manifests();
    let deployment = &m["Deployment/gitops-agent"];
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selects = |selector: &Value| {
        let wanted = selector.as_object().expect("matchLabels");
        assert!(!wanted.is_empty(), "an empty selector selects every pod");
        wanted.iter().all(|(k, v)| &pod_labels[k] == v)
    };
    assert!(selects(&m["Service/gitops-agent-metrics"]["spec"]["selector"]));
    assert_eq!(m["Service/gitops-agent-metrics"]["spec"]["ports"][0]["targetPort"], "metrics");
    let budget = &m["PodDisruptionBudget/gitops-agent"];
    assert_eq!(budget["apiVersion"], "policy/v1");
    assert!(selects(&budget["spec"]["selector"]["matchLabels"]));

    let policy = &m["NetworkPolicy/gitops-agent"]["spec"];
    assert!(selects(&policy["podSelector"]["matchLabels"]));
    assert_eq!(policy["policyTypes"], serde_json::json!(["Ingress", "Egress"]), "both directions closed by default");
    let ingress = policy["ingress"].as_array().expect("ingress rules");
    assert_eq!(ingress.len(), 1, "only scraping comes in");
    assert_eq!(ingress[0]["ports"], serde_json::json!([{"port": "metrics", "protocol": "TCP"}]));
    assert_eq!(crate::support::egress_ports(policy), ["TCP/443", "TCP/53", "TCP/5432", "TCP/6443", "UDP/53"]);

    // Argo CD's own egress: never the link-local range (cloud metadata), on any rule.
    let argocd = &m["NetworkPolicy/argocd-egress"]["spec"];
    assert_eq!(argocd["podSelector"]["matchLabels"]["app.kubernetes.io/part-of"], "argocd");
    for rule in argocd["egress"].as_array().expect("egress rules") {
        for peer in rule["to"].as_array().into_iter().flatten() {
            if let Some(cidr) = peer["ipBlock"]["cidr"].as_str() {
                let except: Vec<&str> =
                    peer["ipBlock"]["except"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let metadata = if cidr.contains(':') { "fe80::/10" } else { "169.254.0.0/16" };
                assert!(except.contains(&metadata), "{cidr} lets Argo CD reach {metadata}");
            }
        }
    }
}

/// The production overlay runs at least two agents with resource requests, from an
/// image in a registry; the development overlay renders the writer and the agent
/// together; both read the encryption keys from the same Secret as the writer.
#[test]
fn agent_deploy_overlays_render_replicas_requests_and_shared_keys() {
    let production = rendered_install("overlays/production/agent");
    let deployment = &production["Deployment/gitops-agent"];
    assert!(deployment["spec"]["replicas"].as_u64().expect("replicas") >= 2);
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert!(
        container["resources"]["requests"]["cpu"].is_string()
            && container["resources"]["requests"]["memory"].is_string()
    );
    let image = container["image"].as_str().expect("an image");
    assert!(image.contains('/') && image.ends_with("/gitops-agent:0.1.0"), "{image}");

    let development = rendered_install("overlays/development");
    let keys = |deployment: &Value| -> Vec<String> {
        let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env").clone();
        env.iter()
            .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("GITOPS_ENCRYPTION_")))
            .map(|e| e["valueFrom"]["secretKeyRef"]["name"].as_str().expect("from a Secret").to_owned())
            .collect()
    };
    let agent_keys = keys(&development["Deployment/gitops-agent"]);
    assert_eq!(agent_keys.len(), 2);
    assert_eq!(agent_keys, keys(&development["Deployment/gitops-writer"]), "writer and agent read the same key Secret");
    assert_ne!(
        agent_keys[0],
        development["Deployment/gitops-agent"]["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .expect("env")
            .iter()
            .find(|e| e["name"] == "DATABASE_URL")
            .and_then(|e| e["valueFrom"]["secretKeyRef"]["name"].as_str())
            .expect("DATABASE_URL from a Secret"),
        "the keys are not in the agent's own Secret, so no recipe makes agent-only keys"
    );
}
