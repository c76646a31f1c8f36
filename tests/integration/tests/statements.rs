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

/// How many times this session keeps `sql` prepared.
async fn kept(client: &tokio_postgres::Client, sql: &str) -> i64 {
    let row = client
        .query_one("SELECT count(*) AS kept FROM pg_prepared_statements WHERE statement = $1", &[&sql])
        .await
        .expect("read pg_prepared_statements");
    row.get("kept")
}

#[tokio::test]
async fn a_pooled_connection_keeps_its_statements_and_prepares_again_after_a_failure() {
    use gitops_shared::db::{Statements, in_pooled_txn_retrying, pooled};

    let db = TestDb::migrated().await;
    let admin = db.connect().await;
    admin
        .batch_execute(
            "CREATE TABLE kept_probe (id bigint PRIMARY KEY, note text); INSERT INTO kept_probe VALUES (1, 'a')",
        )
        .await
        .expect("a table");
    let pool = db.pool(1);
    let mut client = pooled(&pool).await.expect("a pooled connection");
    const READ: &str = "SELECT * FROM kept_probe WHERE id = $1";
    for _ in 0..3 {
        let row = client.row(READ, &[&1_i64]).await.expect("read");
        assert_eq!(row.get::<_, String>("note"), "a");
    }
    assert_eq!(kept(&client, READ).await, 1, "prepared once, run three times");
    let in_txn = in_pooled_txn_retrying(&mut client, |txn| {
        Box::pin(async move { txn.row(READ, &[&1_i64]).await.map_err(gitops_shared::db::DbError::query("read")) })
    })
    .await
    .expect("the same statement inside a transaction");
    assert_eq!(in_txn.get::<_, String>("note"), "a");
    assert_eq!(kept(&client, READ).await, 1, "a transaction on the connection uses the kept statement");

    // A migration changes the columns the kept statement returns: it fails once,
    // and the next run prepares it again.
    admin.batch_execute("ALTER TABLE kept_probe ADD COLUMN extra int DEFAULT 7").await.expect("alter");
    let failed = client.row(READ, &[&1_i64]).await;
    assert!(failed.is_err(), "a kept statement whose result changed fails: {failed:?}");
    let row = client.row(READ, &[&1_i64]).await.expect("prepared again");
    assert_eq!(row.get::<_, i32>("extra"), 7);
    // A bare connection prepares afresh each time and keeps nothing.
    // (A row holds its statement: read it and let it go.)
    let extra: i32 = admin.row(READ, &[&1_i64]).await.expect("read on a bare connection").get("extra");
    assert_eq!(extra, 7);
    assert_eq!(kept(&admin, READ).await, 0);
}
