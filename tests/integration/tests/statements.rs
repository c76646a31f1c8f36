//! Every statement of every table module (`gitops_shared::db::STATEMENTS`) prepares
//! against the migrated schema: a column renamed in a migration fails here.

use gitops_testkit::TestDb;

#[tokio::test]
async fn every_statement_of_every_table_module_prepares() {
    let db = TestDb::migrated().await;
    let client = db.connect().await;
    let mut prepared = 0;
    for (module, statements) in gitops_shared::db::STATEMENTS {
        assert!(!statements.is_empty(), "{module} lists no statement");
        for statement in *statements {
            client.prepare(statement).await.unwrap_or_else(|e| panic!("{module}: {e}\n{statement}"));
            prepared += 1;
        }
    }
    assert!(prepared >= 10, "only {prepared} statements were prepared");
}
