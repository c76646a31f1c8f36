//! `gitopsctl migrate`: applies the embedded migrations on a dedicated connection
//! (never a pooled one: refinery runs statements that must share a session) and
//! reports what it applied. `gitops-writer migrate` runs the same shared function.

use gitops_shared::db::{self, MigrationReport};

use crate::CtlError;

/// Applies every migration not yet applied to the database at `database_url`.
pub async fn migrate(database_url: &str) -> Result<MigrationReport, CtlError> {
    let mut client = crate::connect(database_url).await?;
    db::migrate(&mut client).await.map_err(CtlError::db("migrate the database"))
}

/// One line per applied migration, then the resulting version.
pub fn render(report: &MigrationReport) -> String {
    let mut out = String::new();
    if report.applied.is_empty() {
        out.push_str("no migrations to apply\n");
    }
    for name in &report.applied {
        out.push_str(&format!("applied {name}\n"));
    }
    out.push_str(&format!("schema version {}\n", report.version));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_applied_migrations_then_the_version() {
        let report = MigrationReport { applied: vec!["V1__initial_schema".into()], version: 1 };
        assert_eq!(render(&report), "applied V1__initial_schema\nschema version 1\n");
        let nothing = MigrationReport { applied: vec![], version: 1 };
        assert_eq!(render(&nothing), "no migrations to apply\nschema version 1\n");
    }
}
