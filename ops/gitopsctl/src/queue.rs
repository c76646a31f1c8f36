//! `gitopsctl queue`: what an operator on call needs from the operation queue —
//! how deep it is and how old its oldest work, which operations were
//! dead-lettered and why, and a way to put them back once the cause is fixed.

use gitops_shared::model::OperationId;
pub use gitops_shared::queue::FailedOperation;
use std::time::Duration;

use gitops_shared::queue::{self, HorizonHolder, QueueSummary, RetryOutcome, operation_list_failed};

use crate::{CtlError, table};

/// Queue depth, expired leases and recent completions, and who holds the
/// database's oldest snapshot.
pub async fn summary(database_url: &str) -> Result<(QueueSummary, Option<HorizonHolder>), CtlError> {
    let client = crate::connect(database_url).await?;
    let summary = queue::queue_summary(&client).await.map_err(CtlError::db("summarise the queue"))?;
    let holder = queue::xmin_horizon_holder(&client).await.map_err(CtlError::db("find the oldest snapshot"))?;
    Ok((summary, holder))
}

/// Whether `holder` is past `threshold`: by its transaction's age, or, when that
/// is hidden (no `pg_read_all_stats`) or it is a slot, by a million XIDs.
fn past_threshold(holder: &HorizonHolder, threshold: Duration) -> bool {
    match holder.age {
        Some(age) => age >= threshold,
        None => holder.age_xids >= XIDS_WITHOUT_AN_AGE,
    }
}

/// XIDs past which a holder whose age in seconds is unknown is named.
const XIDS_WITHOUT_AN_AGE: i64 = 1_000_000;

/// The line naming the holder of the oldest snapshot, past the threshold.
pub fn render_holder(holder: &HorizonHolder, threshold: Duration) -> Option<String> {
    if !past_threshold(holder, threshold) {
        return None;
    }
    let dash = || "-".to_owned();
    Some(format!(
        "oldest snapshot: {} pid {} ({}, client {}, role {}, {}) held {}, {} XIDs old: \
         nothing the queue left behind since can be cleaned up; end it (see the runbook)\n",
        holder.kind,
        holder.pid.map_or_else(dash, |pid| pid.to_string()),
        if holder.name.is_empty() { "-" } else { &holder.name },
        holder.client.clone().unwrap_or_else(dash),
        holder.role.clone().unwrap_or_else(dash),
        holder.state.clone().unwrap_or_else(dash),
        holder.age.map_or_else(|| "for an unknown time".to_owned(), |age| format!("for {}", table::age(age))),
        holder.age_xids,
    ))
}

/// The text `gitopsctl queue` prints.
pub fn render_summary(summary: &QueueSummary, holder: Option<&HorizonHolder>, threshold: Duration) -> String {
    let mut out = if summary.rows.is_empty() {
        "the queue is empty\n".to_owned()
    } else {
        let rows: Vec<Vec<String>> = summary
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.instance.clone(),
                    r.state.to_string(),
                    r.operations.to_string(),
                    r.oldest.map_or_else(|| "-".to_owned(), table::age),
                ]
            })
            .collect();
        table::render(&["INSTANCE", "STATE", "OPERATIONS", "OLDEST"], &rows)
    };
    out.push_str(&format!("expired leases: {}\n", summary.expired_leases));
    out.push_str(&format!("completed in the last hour: {}\n", summary.completed_last_hour));
    if let Some(line) = holder.and_then(|holder| render_holder(holder, threshold)) {
        out.push_str(&line);
    }
    out
}

/// Puts one failed operation back in the queue.
pub async fn retry(database_url: &str, id: i64) -> Result<RetryOutcome, CtlError> {
    let mut client = crate::connect(database_url).await?;
    queue::operation_retry(&mut client, OperationId(id)).await.map_err(CtlError::db("retry the operation"))
}

/// What `queue retry ID` prints; an operation that was not failed is an error.
pub fn render_retry(id: i64, outcome: RetryOutcome) -> Result<String, CtlError> {
    match outcome {
        RetryOutcome::Requeued => Ok(format!("operation {id} requeued\n")),
        RetryOutcome::Superseded => Ok(format!(
            "operation {id} superseded: its resource already has a waiting operation, which will do the work\n"
        )),
        RetryOutcome::NotFailed => Err(CtlError::NotFailed { id }),
    }
}

/// How many failed operations were requeued and how many superseded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAllReport {
    pub requeued: u64,
    pub superseded: u64,
}

/// Puts every failed operation back in the queue.
pub async fn retry_all_failed(database_url: &str) -> Result<RetryAllReport, CtlError> {
    let mut client = crate::connect(database_url).await?;
    let (requeued, superseded) =
        queue::operation_retry_all_failed(&mut client).await.map_err(CtlError::db("retry the failed operations"))?;
    Ok(RetryAllReport { requeued, superseded })
}

/// What `queue retry --all-failed` prints.
pub fn render_retry_all(report: RetryAllReport) -> String {
    if report.requeued == 0 && report.superseded == 0 {
        return "no failed operations\n".to_owned();
    }
    format!(
        "{} failed operations requeued, {} superseded by a waiting operation of their resource\n",
        report.requeued, report.superseded
    )
}

/// Removes failed operation `id`; what `queue discard ID` prints (an operation
/// that is not failed is an error).
pub async fn discard(database_url: &str, id: i64) -> Result<String, CtlError> {
    let client = crate::connect(database_url).await?;
    match queue::operation_discard(&client, OperationId(id)).await.map_err(CtlError::db("discard the operation"))? {
        true => Ok(format!("operation {id} discarded\n")),
        false => Err(CtlError::NotFailed { id }),
    }
}

/// Removes every failed operation; what `queue discard --all-failed` prints.
pub async fn discard_all_failed(database_url: &str) -> Result<String, CtlError> {
    let client = crate::connect(database_url).await?;
    let removed =
        queue::operation_discard_all_failed(&client).await.map_err(CtlError::db("discard the failed operations"))?;
    Ok(format!("{removed} failed operations discarded\n"))
}

/// Up to `limit` failed operations, oldest id first.
pub async fn failed(database_url: &str, limit: i64) -> Result<Vec<FailedOperation>, CtlError> {
    let client = crate::connect(database_url).await?;
    operation_list_failed(&client, limit).await.map_err(CtlError::db("list failed operations"))
}

/// What `queue failed` prints: one block per operation, since both messages can
/// be long.
pub fn render_failed(operations: &[FailedOperation]) -> String {
    if operations.is_empty() {
        return "no failed operations\n".to_owned();
    }
    let mut out = String::new();
    for op in operations {
        let failed = op.failed_at.map_or_else(|| "-".to_owned(), |at| format!("{} ago", table::age_since(at)));
        out.push_str(&format!(
            "operation {}  instance {}  {} {}  attempts {}  failed {}\n",
            op.id, op.instance, op.resource_type, op.resource_id, op.attempts, failed
        ));
        out.push_str(&format!("  operator error: {}\n", one_line(op.operator_error.as_deref())));
        out.push_str(&format!("  tenant message: {}\n", one_line(op.tenant_message.as_deref())));
    }
    out
}

fn one_line(text: Option<&str>) -> String {
    text.map_or_else(|| "-".to_owned(), |t| t.split_whitespace().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gitops_shared::model::OperationState;
    use gitops_shared::queue::QueueSummaryRow;

    use gitops_shared::model::ResourceType;

    use super::*;

    #[test]
    fn summary_lists_states_then_totals() {
        let summary = QueueSummary {
            rows: vec![QueueSummaryRow {
                instance: "prod-1".into(),
                state: OperationState::Waiting,
                operations: 12,
                oldest: Some(Duration::from_secs(5)),
            }],
            expired_leases: 1,
            completed_last_hour: 40,
        };
        assert_eq!(
            render_summary(&summary, None, Duration::ZERO),
            "INSTANCE  STATE    OPERATIONS  OLDEST\nprod-1    waiting  12          5s\n\
             expired leases: 1\ncompleted in the last hour: 40\n"
        );
    }

    #[test]
    fn retrying_an_operation_that_is_not_failed_is_an_error() {
        assert_eq!(render_retry(12, RetryOutcome::Requeued).expect("ok"), "operation 12 requeued\n");
        assert!(matches!(render_retry(12, RetryOutcome::NotFailed), Err(CtlError::NotFailed { id: 12 })));
    }

    #[test]
    fn failed_operations_show_both_messages_on_one_line_each() {
        let op = FailedOperation {
            id: OperationId(7),
            instance: "prod-1".into(),
            resource_type: ResourceType::Application,
            resource_id: 45,
            attempts: 8,
            operator_error: Some("apply failed:\n  forbidden".into()),
            tenant_message: None,
            failed_at: None,
        };
        assert_eq!(
            render_failed(&[op]),
            "operation 7  instance prod-1  application 45  attempts 8  failed -\n  \
             operator error: apply failed: forbidden\n  tenant message: -\n"
        );
    }

    fn holder(age: Option<Duration>, age_xids: i64) -> HorizonHolder {
        HorizonHolder {
            kind: "session".to_owned(),
            pid: Some(4242),
            name: "psql".to_owned(),
            client: Some("10.0.0.5".to_owned()),
            role: Some("inspector".to_owned()),
            state: Some("idle in transaction".to_owned()),
            age_xids,
            age,
        }
    }

    #[test]
    fn the_holder_is_named_past_the_threshold_by_age_or_without_one_by_xids() {
        let five_minutes = Duration::from_secs(300);
        assert_eq!(render_holder(&holder(Some(Duration::from_secs(299)), 9_000_000), five_minutes), None);
        let line = render_holder(&holder(Some(Duration::from_secs(600)), 12), five_minutes).expect("named");
        assert!(
            line.starts_with(
                "oldest snapshot: session pid 4242 (psql, client 10.0.0.5, role inspector, idle in transaction)"
            ),
            "{line}"
        );
        assert_eq!(render_holder(&holder(None, 999_999), five_minutes), None);
        assert!(render_holder(&holder(None, 1_000_000), five_minutes).is_some());
    }
}
