//! `gitopsctl tenant`: what the service does for tenants, for an operator's review.
//! `home-deployments` lists every deployment into a tenant's own namespace — each
//! acts there with the home ClusterRole, on behalf of whoever can push to its
//! repository — so that those stored before requesters were checked at admission
//! can be looked at (and deleted by their owners when they should not be there).
//! `list`, `show` and `move` show where tenants live and move them between instances
//! (`gitops_shared::db::tenant_move` has the protocol).

use gitops_shared::db::application::{HomeDeploymentRow, application_list_home};
use gitops_shared::db::tenant_move::{TenantPlacement, tenant_move, tenant_placements};

use crate::{CtlError, table};

/// Every live home deployment.
pub async fn home_deployments(database_url: &str) -> Result<Vec<HomeDeploymentRow>, CtlError> {
    let client = crate::connect(database_url).await?;
    application_list_home(&client).await.map_err(CtlError::db("list home deployments"))
}

/// The table `tenant home-deployments` prints.
pub fn render_home_deployments(rows: &[HomeDeploymentRow]) -> String {
    if rows.is_empty() {
        return "no deployments into tenants' own namespaces\n".to_owned();
    }
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.namespace.clone(),
                r.name.clone(),
                r.repo_url.clone(),
                r.path.clone(),
                r.target_revision.clone(),
                table::age_since(r.created_at),
            ]
        })
        .collect();
    table::render(&["NAMESPACE", "NAME", "REPOSITORY", "PATH", "REVISION", "AGE"], &rows)
}

/// Live tenants, optionally one namespace or those of one instance.
pub async fn list(
    database_url: &str,
    namespace: Option<&str>,
    instance: Option<&str>,
) -> Result<Vec<TenantPlacement>, CtlError> {
    let client = crate::connect(database_url).await?;
    tenant_placements(&client, namespace, instance).await.map_err(CtlError::db("list tenants"))
}

/// Starts moving the tenant of `namespace` to instance `to`.
pub async fn move_to(database_url: &str, namespace: &str, to: &str, reason: &str) -> Result<(), CtlError> {
    let mut client = crate::connect(database_url).await?;
    tenant_move(&mut client, namespace, to, reason).await.map_err(CtlError::db("move the tenant"))
}

/// One tenant's placement, as `tenant show` prints it.
pub async fn show(database_url: &str, namespace: &str) -> Result<String, CtlError> {
    let tenants = list(database_url, Some(namespace), None).await?;
    let Some(tenant) = tenants.first() else {
        return Err(CtlError::Refused(format!("no tenant in namespace {namespace:?}")));
    };
    let mut out = format!(
        "namespace:   {}\ninstance:    {}\ndeployments: {}\n",
        tenant.namespace,
        tenant.instance.as_deref().unwrap_or("(not placed)"),
        tenant.deployments
    );
    if let Some(state) = &tenant.move_state {
        out.push_str(&format!(
            "move:        {state} from {} ({}, started {} ago)\n",
            tenant.moving_from.as_deref().unwrap_or("?"),
            tenant.move_reason.as_deref().unwrap_or("no reason recorded"),
            tenant.move_started_at.map_or_else(|| "?".to_owned(), table::age_since),
        ));
    }
    Ok(out)
}

/// The table `tenant list` prints.
pub fn render_list(tenants: &[TenantPlacement]) -> String {
    if tenants.is_empty() {
        return "no tenants\n".to_owned();
    }
    let rows: Vec<Vec<String>> = tenants
        .iter()
        .map(|t| {
            let moving = match (&t.move_state, &t.moving_from) {
                (Some(state), Some(from)) => format!("{state} from {from}"),
                _ => "-".to_owned(),
            };
            vec![
                t.namespace.clone(),
                t.instance.clone().unwrap_or_else(|| "(not placed)".to_owned()),
                moving,
                t.deployments.to_string(),
            ]
        })
        .collect();
    table::render(&["NAMESPACE", "INSTANCE", "MOVE", "DEPLOYMENTS"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_home_deployments_with_their_source() {
        let row = HomeDeploymentRow {
            namespace: "team-a".into(),
            name: "web".into(),
            repo_url: "https://git.example.invalid/a.git".into(),
            path: "apps/web".into(),
            target_revision: "HEAD".into(),
            created_at: std::time::SystemTime::now(),
        };
        let text = render_home_deployments(&[row]);
        assert!(text.starts_with("NAMESPACE  NAME  REPOSITORY"), "{text}");
        assert!(text.contains("team-a     web   https://git.example.invalid/a.git  apps/web  HEAD"), "{text}");
        assert_eq!(render_home_deployments(&[]), "no deployments into tenants' own namespaces\n");
    }

    #[test]
    fn lists_tenants_with_their_move() {
        let tenant = TenantPlacement {
            id: gitops_shared::model::TenantId(1),
            namespace: "team-a".into(),
            instance: Some("argocd-2".into()),
            instance_id: None,
            moving_from: Some("argocd-1".into()),
            moving_from_id: None,
            move_state: Some("releasing".into()),
            move_reason: Some("operator".into()),
            move_started_at: None,
            deployments: 4,
        };
        let text = render_list(std::slice::from_ref(&tenant));
        assert!(text.contains("team-a     argocd-2  releasing from argocd-1  4"), "{text}");
        let settled = TenantPlacement { move_state: None, moving_from: None, ..tenant };
        assert!(render_list(&[settled]).contains("argocd-2  -"));
        assert_eq!(render_list(&[]), "no tenants\n");
    }
}
