//! Stored secrets: sealed in the database, never in clear, and moved to a new key
//! by `gitopsctl secrets reencrypt`.

use gitops_shared::crypto::{ReencryptError, Sealed, SecretBox, SecretContext, reencrypt_all};
use gitops_shared::model::TenantId;
use gitops_testkit::TestDb;

use crate::support::*;

async fn store_repository_secret(client: &tokio_postgres::Client, tenant: TenantId, sealed: &Sealed, n: usize) -> i64 {
    client
        .query_one(
            "INSERT INTO repository_credential (tenant_id, resource_uid, resource_name, generation, repo_url,
                                                secret_name, key_id, ciphertext)
             VALUES ($1, gen_random_uuid(), $2, 1, 'https://git.example.invalid/r.git', 'creds', $3, $4)
             RETURNING id",
            &[&tenant.0, &format!("cred-{n}"), &sealed.key_id, &sealed.ciphertext],
        )
        .await
        .expect("insert")
        .get(0)
}

#[tokio::test]
async fn reencrypt_moves_every_secret_to_the_active_key_and_names_rows_it_cannot_open() {
    let db = TestDb::migrated().await;
    let mut client = db.connect().await;
    let fx = fixture(&mut client).await;
    let k1 = SecretBox::generate_key("k1").expect("key");
    let k2 = SecretBox::generate_key("k2").expect("key");
    let old = SecretBox::from_config(Some(&k1), Some("k1")).expect("old keys");
    let context = SecretContext { table: "repository_credential", tenant: fx.tenant };
    for n in 0..1200 {
        let sealed = old.seal(context, format!("password-{n}").as_bytes()).expect("seal");
        store_repository_secret(&client, fx.tenant, &sealed, n).await;
    }
    let in_clear: i64 = client
        .query_one(
            "SELECT count(*) FROM repository_credential WHERE position('password-'::bytea IN ciphertext) > 0",
            &[],
        )
        .await
        .expect("scan")
        .get(0);
    assert_eq!(in_clear, 0, "nothing is stored in clear");

    let rotated = SecretBox::from_config(Some(&format!("{k1},{k2}")), Some("k2")).expect("both keys");
    assert_eq!(gitopsctl::secrets::reencrypt(&db.url(), &rotated).await.expect("reencrypt"), 1200);
    assert_eq!(reencrypt_all(&mut client, &rotated).await.expect("again"), 0, "a second run has nothing to do");

    let only_new = SecretBox::from_config(Some(&k2), Some("k2")).expect("new key only");
    let rows =
        client.query("SELECT key_id, ciphertext, resource_name FROM repository_credential", &[]).await.expect("rows");
    for row in &rows {
        let sealed = Sealed { key_id: row.get(0), ciphertext: row.get(1) };
        let name: String = row.get(2);
        let plain = only_new.open(context, &sealed).expect("opens with the new key alone");
        assert_eq!(plain, format!("password-{}", &name["cred-".len()..]).into_bytes());
    }

    // A row sealed with a key nobody configured stops the run and is named.
    let stranger = SecretBox::from_config(Some(&SecretBox::generate_key("k0").expect("key")), Some("k0")).expect("k0");
    let orphan = store_repository_secret(&client, fx.tenant, &stranger.seal(context, b"x").expect("seal"), 9999).await;
    match reencrypt_all(&mut client, &only_new).await {
        Err(ReencryptError::Row { table, id, .. }) => assert_eq!((table, id), ("repository_credential", orphan)),
        other => panic!("expected the orphan row to be named, got {other:?}"),
    }
}
