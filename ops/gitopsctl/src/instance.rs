//! `gitopsctl instance`: operators register the engine (Argo CD) instances that
//! agents serve and tenants are placed on, list them with their load, health and
//! the Argo CD version they run, their host cluster, who made them and the age of
//! their agents' last heartbeat (and the automatic scale-up in progress), cordon
//! and drain them, and remove empty ones.

use gitops_shared::db::engine_instance::{self, EngineInstance};
use gitops_shared::db::fleet_balance::{BalanceSettings, balance_step};
use gitops_shared::db::instance_scale_up::{ScaleUp, scale_up_recent};
use gitops_shared::model::EngineInstanceId;

use crate::{CtlError, table};

/// Registers an instance.
pub async fn add(
    database_url: &str,
    name: &str,
    argocd_namespace: &str,
    capacity: i32,
    host_cluster: Option<&str>,
) -> Result<EngineInstanceId, CtlError> {
    let client = crate::connect(database_url).await?;
    let registration = engine_instance::Registration { host_cluster, provisioned_by: None };
    engine_instance::engine_instance_register(&client, name, argocd_namespace, capacity, registration)
        .await
        .map_err(CtlError::db("register the engine instance"))
}

/// Every instance, by name.
pub async fn list(database_url: &str) -> Result<Vec<EngineInstance>, CtlError> {
    let client = crate::connect(database_url).await?;
    engine_instance::engine_instance_list(&client).await.map_err(CtlError::db("list engine instances"))
}

/// The latest automatic scale-ups, newest first.
pub async fn scale_ups(database_url: &str) -> Result<Vec<ScaleUp>, CtlError> {
    let client = crate::connect(database_url).await?;
    scale_up_recent(&client, 5).await.map_err(CtlError::db("list the automatic scale-ups"))
}

/// What `instance list` prints under the table: the automatic scale-up in
/// progress, and the last one that ended.
pub fn render_scale_ups(scale_ups: &[ScaleUp]) -> String {
    let mut out = String::new();
    if let Some(running) = scale_ups.iter().find(|s| s.state == "provisioning") {
        out.push_str(&format!(
            "scale-up: provisioning {:?} (free capacity was {}), started {} ago by {}\n",
            running.instance_name,
            running.free_capacity,
            table::age_since(running.started_at),
            running.holder
        ));
    }
    if let Some(last) = scale_ups.iter().find(|s| s.state != "provisioning") {
        let ended = last.finished_at.map_or_else(|| "?".to_owned(), table::age_since);
        match &last.error {
            Some(error) => {
                out.push_str(&format!("last scale-up: {:?} failed {ended} ago: {error}\n", last.instance_name))
            }
            None => out.push_str(&format!("last scale-up: {:?} provisioned {ended} ago\n", last.instance_name)),
        }
    }
    out
}

/// Closes (`cordoned`) or opens an instance to new tenants.
pub async fn cordon(database_url: &str, name: &str, cordoned: bool) -> Result<(), CtlError> {
    let client = crate::connect(database_url).await?;
    engine_instance::engine_instance_cordon(&client, name, cordoned).await.map_err(CtlError::db(if cordoned {
        "cordon the engine instance"
    } else {
        "uncordon the engine instance"
    }))
}

/// Cordons `name` and starts moving each of its tenants to the open, live
/// instance with the most room; returns how many moves started. Stops at the first
/// tenant that cannot move (the fleet is full, say), with the reason.
pub async fn drain(database_url: &str, name: &str) -> Result<usize, CtlError> {
    cordon(database_url, name, true).await?;
    let tenants = crate::tenant::list(database_url, None, Some(name)).await?;
    let mut moved = 0;
    for tenant in tenants.iter().filter(|t| t.instance.as_deref() == Some(name) && t.move_state.is_none()) {
        let instances = list(database_url).await?;
        let target = instances
            .iter()
            .filter(|i| i.name != name && !i.cordoned && has_room(i) && i.heartbeat_at.is_some())
            .min_by(|a, b| {
                let load = |i: &EngineInstance| (i.tenants + i.reserved) as f64 / f64::from(i.capacity);
                load(a).total_cmp(&load(b)).then(a.name.cmp(&b.name))
            });
        let Some(target) = target else {
            return Err(CtlError::Refused(format!(
                "{moved} tenants moving off {name:?}; no other open instance has room for {:?} and the rest",
                tenant.namespace
            )));
        };
        crate::tenant::move_to(database_url, &tenant.namespace, &target.name, "drain").await?;
        moved += 1;
    }
    Ok(moved)
}

/// Moves tenants from the fullest to the emptiest open, healthy instance while
/// their loads (tenants / capacity) differ by more than `threshold`, keeping at most
/// `max_moves` moves in progress: one balancing step, as the writers take them
/// (`gitops_shared::db::fleet_balance`). Returns the moves started: (namespace,
/// from, to).
pub async fn rebalance(
    database_url: &str,
    threshold: f64,
    max_moves: u32,
) -> Result<Vec<(String, String, String)>, CtlError> {
    let mut client = crate::connect(database_url).await?;
    let settings = BalanceSettings {
        degraded_grace: None,
        rebalance_threshold: Some(threshold),
        max_concurrent_moves: max_moves as usize,
    };
    let step = balance_step(&mut client, settings).await.map_err(CtlError::db("rebalance the fleet"))?;
    if step.skipped {
        return Err(CtlError::Refused("a writer is balancing the fleet right now; try again in a moment".into()));
    }
    Ok(step.moves.into_iter().map(|m| (m.namespace, m.from, m.to)).collect())
}

/// Removes an instance without tenants or operations.
pub async fn remove(database_url: &str, name: &str) -> Result<(), CtlError> {
    let client = crate::connect(database_url).await?;
    engine_instance::engine_instance_remove(&client, name).await.map_err(CtlError::db("remove the engine instance"))
}

/// The table `instance list` prints.
pub fn render_list(instances: &[EngineInstance]) -> String {
    if instances.is_empty() {
        return "no engine instances registered\n".to_owned();
    }
    let rows: Vec<Vec<String>> = instances
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                i.argocd_namespace.clone(),
                i.capacity.to_string(),
                if i.reserved > 0 { format!("{} (+{} held)", i.tenants, i.reserved) } else { i.tenants.to_string() },
                i.argocd_version.clone().unwrap_or_else(|| "unknown".to_owned()),
                i.host_cluster.clone().unwrap_or_else(|| "-".to_owned()),
                i.provisioned_by.clone().unwrap_or_else(|| "-".to_owned()),
                i.health.clone(),
                placement(i).to_owned(),
                i.heartbeat_at.map_or_else(|| "never".to_owned(), table::age_since),
            ]
        })
        .collect();
    table::render(
        &["NAME", "NAMESPACE", "CAPACITY", "TENANTS", "VERSION", "HOST", "MADE BY", "HEALTH", "PLACEMENT", "HEARTBEAT"],
        &rows,
    )
}

/// Whether new tenants may be placed on the instance.
fn placement(instance: &EngineInstance) -> &'static str {
    if instance.cordoned {
        "cordoned"
    } else if !has_room(instance) {
        "full"
    } else {
        "open"
    }
}

/// Free slots: neither taken nor held for tenants a rollout moved away.
fn has_room(instance: &EngineInstance) -> bool {
    instance.tenants + instance.reserved < i64::from(instance.capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_instances_with_heartbeat_age() {
        let instance = EngineInstance {
            id: EngineInstanceId(1),
            name: "prod-1".into(),
            argocd_namespace: "argocd".into(),
            capacity: 1000,
            heartbeat_at: None,
            tenants: 3,
            reserved: 0,
            cordoned: false,
            progress_at: None,
            epoch: 0,
            fenced: false,
            health: "lost".into(),
            argocd_version: None,
            host_cluster: None,
            provisioned_by: None,
        };
        assert_eq!(
            render_list(std::slice::from_ref(&instance)),
            "NAME    NAMESPACE  CAPACITY  TENANTS  VERSION  HOST  MADE BY  HEALTH  PLACEMENT  HEARTBEAT\n\
             prod-1  argocd     1000      3        unknown  -     -        lost    open       never\n"
        );
        let made = EngineInstance {
            host_cluster: Some("east".into()),
            provisioned_by: Some("scale-up".into()),
            ..instance.clone()
        };
        assert!(render_list(&[made]).contains("  east  scale-up  "));
        let versioned = EngineInstance { argocd_version: Some("v2.14.2".into()), ..instance.clone() };
        assert!(render_list(&[versioned]).contains("  v2.14.2  "));
        let full = EngineInstance { capacity: 3, ..instance.clone() };
        assert!(render_list(&[full]).contains("full"));
        let held = EngineInstance { capacity: 5, reserved: 2, ..instance.clone() };
        let text = render_list(&[held]);
        assert!(text.contains("  3 (+2 held)  ") && text.contains("full"), "{text}");
        let cordoned = EngineInstance { cordoned: true, ..instance };
        assert!(render_list(&[cordoned]).contains("cordoned"));
        assert_eq!(render_list(&[]), "no engine instances registered\n");
    }

    #[test]
    fn lists_the_scale_up_in_progress_and_the_last_one() {
        let now = std::time::SystemTime::now();
        let attempt = |id, state: &str, error: Option<&str>| ScaleUp {
            id,
            instance_name: format!("auto-{id}"),
            state: state.to_owned(),
            holder: "writer-a".into(),
            free_capacity: 3,
            error: error.map(str::to_owned),
            started_at: now,
            finished_at: (state != "provisioning").then_some(now),
        };
        let text = render_scale_ups(&[attempt(2, "provisioning", None), attempt(1, "failed", Some("no operator"))]);
        assert!(text.starts_with("scale-up: provisioning \"auto-2\" (free capacity was 3)"), "{text}");
        assert!(text.contains("last scale-up: \"auto-1\" failed") && text.contains("no operator"), "{text}");
        assert_eq!(render_scale_ups(&[]), "");
    }
}
