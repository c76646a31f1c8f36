//! What the server counted: commits of the benchmark's database, and dead row
//! versions of the queue's tables.

use std::time::{Duration, Instant};

use gitops_shared::db::DbError;
use serde::Serialize;
use tokio_postgres::Client;

use super::BenchError;
use super::producer::Producer;

pub const FLUSH: &str = "SELECT pg_stat_force_next_flush()";

const COMMITS: &str = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()";

const AGENT_BACKENDS: &str = "SELECT count(*) FROM pg_stat_activity
                               WHERE datname = current_database() AND application_name = 'gitops-bench-agent'";

// The tables every operation writes: the intent, its operation and its record once
// finished, the signal row.
const DEAD_TUPLES: &str = "
SELECT relname::text, n_live_tup, n_dead_tup FROM pg_stat_user_tables
 WHERE relname IN ('operation', 'operation_history', 'application', 'signal') ORDER BY relname";

/// How long the agents' connections may take to close after they stopped.
const AGENTS_GONE_WITHIN: Duration = Duration::from_secs(10);

fn failed(step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> BenchError {
    move |error| BenchError::db(step)(DbError::query(step)(error))
}

/// Commits of the database so far, with every producer's and this connection's
/// statistics sent (an agent's are sent when its connections close: stop the agents
/// and wait for `agents_gone` first).
pub async fn commits(admin: &Client, producers: &[Producer]) -> Result<i64, BenchError> {
    for producer in producers {
        producer.flush_stats().await?;
    }
    admin.execute(FLUSH, &[]).await.map_err(failed("flush statistics"))?;
    let row = admin.query_one(COMMITS, &[]).await.map_err(failed("read the commit count"))?;
    Ok(row.get(0))
}

/// Waits until the stopped agents' connections are closed, so that their statistics
/// are counted.
pub async fn agents_gone(admin: &Client) -> Result<(), BenchError> {
    let deadline = Instant::now() + AGENTS_GONE_WITHIN;
    loop {
        let open: i64 = admin.query_one(AGENT_BACKENDS, &[]).await.map_err(failed("count agent connections"))?.get(0);
        if open == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Invalid(format!(
                "{open} agent connections still open after {AGENTS_GONE_WITHIN:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Live and dead row versions of one table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableTuples {
    pub table: String,
    pub n_live_tup: i64,
    pub n_dead_tup: i64,
}

/// Live and dead row versions of the queue's tables.
pub async fn dead_tuples(admin: &Client) -> Result<Vec<TableTuples>, BenchError> {
    admin.execute(FLUSH, &[]).await.map_err(failed("flush statistics"))?;
    let rows = admin.query(DEAD_TUPLES, &[]).await.map_err(failed("read dead tuples"))?;
    Ok(rows
        .iter()
        .map(|row| TableTuples { table: row.get(0), n_live_tup: row.get(1), n_dead_tup: row.get(2) })
        .collect())
}
