//! `gitopsctl tenant`: what the service does for tenants, for an operator's review.
//! `home-deployments` lists every deployment into a tenant's own namespace — each
//! acts there with the home ClusterRole, on behalf of whoever can push to its
//! repository — so that those stored before requesters were checked at admission
//! can be looked at (and deleted by their owners when they should not be there).

use gitops_shared::db::application::{HomeDeploymentRow, application_list_home};

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
}
