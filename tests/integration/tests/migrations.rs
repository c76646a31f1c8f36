//! Migrations: numbering, the checked-in schema, the three ways to apply them, and
//! the start-up refusal of an older schema.

use std::path::{Path, PathBuf};
use std::process::Command;

use gitops_shared::db::{self, DbError};
use gitops_testkit::{TestDb, find_bin_dir};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn migration_numbers_are_unique_and_contiguous_from_one() {
    let mut versions: Vec<u32> = std::fs::read_dir(repo_root().join("migrations"))
        .expect("migrations/")
        .map(|entry| entry.expect("entry").file_name().into_string().expect("utf-8 name"))
        .map(|name| {
            let rest = name.strip_prefix('V').unwrap_or_else(|| panic!("{name}: must be V{{n}}__{{name}}.sql"));
            let (number, tail) = rest.split_once("__").unwrap_or_else(|| panic!("{name}: missing '__'"));
            assert!(tail.ends_with(".sql") && tail.len() > 4, "{name}: must end in a name and .sql");
            number.parse().unwrap_or_else(|_| panic!("{name}: version is not a number"))
        })
        .collect();
    versions.sort();
    let expected: Vec<u32> = (1..=versions.len() as u32).collect();
    assert_eq!(versions, expected, "versions must be 1, 2, 3, … without gaps or repeats");
    assert_eq!(i64::from(*versions.last().expect("one migration")), db::required_schema_version());
}

/// `pg_dump --schema-only`, without the lines that change from run to run.
fn dump_schema(url: &str) -> String {
    let pg_dump = find_bin_dir().map(|d| d.join("pg_dump")).filter(|p| p.is_file()).unwrap_or_else(|| "pg_dump".into());
    let out = Command::new(pg_dump)
        .args(["--schema-only", "--no-owner", "--no-privileges", "--no-comments", "-d", url])
        .output()
        .expect("run pg_dump");
    assert!(out.status.success(), "pg_dump: {}", String::from_utf8_lossy(&out.stderr));
    normalise_dump(&String::from_utf8(out.stdout).expect("utf-8 dump"))
}

/// Drops pg_dump's random `\restrict` lines (pg_dump ≥ 15.14), its version banner
/// and runs of blank lines.
fn normalise_dump(dump: &str) -> String {
    let mut out = String::new();
    let mut blank = false;
    for line in dump.lines() {
        if line.starts_with("\\restrict") || line.starts_with("\\unrestrict") || line.starts_with("-- Dumped ") {
            continue;
        }
        if line.trim().is_empty() {
            if blank {
                continue;
            }
            blank = true;
        } else {
            blank = false;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

async fn history(url: &str) -> Vec<(i32, String, String)> {
    let client = db::connect(url, "test").await.expect("connect");
    client
        .query("SELECT version, name, checksum FROM refinery_schema_history ORDER BY version", &[])
        .await
        .expect("history")
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

#[tokio::test]
async fn sql_schema_sql_is_what_the_migrations_produce() {
    let db = TestDb::migrated().await;
    let dumped = dump_schema(&db.url());
    let path = repo_root().join("sql/schema.sql");
    if std::env::var_os("GITOPS_UPDATE_SCHEMA").is_some() {
        std::fs::write(&path, &dumped).expect("write sql/schema.sql");
    }
    let checked_in = std::fs::read_to_string(&path).expect("sql/schema.sql");
    assert!(
        normalise_dump(&checked_in) == dumped,
        "sql/schema.sql differs from what the migrations produce; regenerate it with \
         GITOPS_UPDATE_SCHEMA=1 cargo test --test integration sql_schema_sql and review the diff"
    );
}

#[tokio::test]
async fn the_writer_gitopsctl_and_the_refinery_cli_migrate_to_the_same_schema() {
    let by_writer = TestDb::empty().await;
    let by_ctl = TestDb::empty().await;
    let report = gitops_writer::migrate(&by_writer.url()).await.expect("gitops-writer migrate");
    assert_eq!(report.version, db::required_schema_version());
    assert!(!report.applied.is_empty());
    gitopsctl::migrate::migrate(&by_ctl.url()).await.expect("gitopsctl migrate");
    let again = gitops_writer::migrate(&by_writer.url()).await.expect("second run");
    assert!(again.applied.is_empty(), "a second run applies nothing");

    let reference = dump_schema(&by_writer.url());
    assert_eq!(dump_schema(&by_ctl.url()), reference);
    assert_eq!(history(&by_ctl.url()).await, history(&by_writer.url()).await);

    let cli = which("refinery");
    match cli {
        Some(cli) => {
            let by_cli = TestDb::empty().await;
            let out = Command::new(cli)
                .args(["migrate", "-e", "DATABASE_URL", "-p"])
                .arg(repo_root().join("migrations"))
                .env("DATABASE_URL", by_cli.url())
                .output()
                .expect("run refinery");
            assert!(out.status.success(), "refinery migrate: {}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(dump_schema(&by_cli.url()), reference, "the refinery CLI produced another schema");
            assert_eq!(history(&by_cli.url()).await, history(&by_writer.url()).await);
            // And the embedded runner accepts what the CLI applied.
            let after_cli = gitops_writer::migrate(&by_cli.url()).await.expect("embedded after CLI");
            assert!(after_cli.applied.is_empty());
        }
        None if std::env::var_os("GITOPS_REQUIRE_REFINERY_CLI").is_some() => {
            panic!("the refinery CLI is required (GITOPS_REQUIRE_REFINERY_CLI) but not on PATH")
        }
        None => eprintln!(
            "refinery CLI not on PATH: its part of this test was skipped \
             (cargo install refinery_cli --locked --no-default-features --features postgresql)"
        ),
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(program)).find(|p| p.is_file())
}

#[tokio::test]
async fn binaries_refuse_to_start_against_an_older_schema_naming_the_versions() {
    let db = TestDb::empty().await;
    let client = db.connect().await;
    let error = db::check_schema(&client).await.expect_err("an empty database is too old");
    assert!(matches!(error, DbError::SchemaTooOld { found: 0, required } if required == db::required_schema_version()));
    let message = error.to_string();
    assert!(
        message.contains("version 0") && message.contains(&format!("at least {}", db::required_schema_version())),
        "{message}"
    );
    let migrated = TestDb::migrated().await;
    let ok = db::check_schema(&migrated.connect().await).await.expect("current schema");
    assert_eq!(ok.found, ok.required);
}
