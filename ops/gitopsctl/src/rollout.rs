//! `gitopsctl rollout`: operators start a canary rollout of a new Argo CD version
//! onto an instance, promote it to the rest of the source instances' tenants in
//! waves, abort it, and read its progress. The writers' fleet watch does the work
//! (`gitops_shared::db::rollout`); these commands only change its rows.

use gitops_shared::db::rollout::{self, Cohort, Rollout, RolloutMember, RolloutRequest, RolloutStarted, WaveResult};

use crate::cli::CohortArgs;
use crate::{CtlError, table};

/// The cohort the flags name.
pub fn cohort(args: CohortArgs) -> Result<Cohort, CtlError> {
    match (args.tenants, args.percent, args.namespaces) {
        (Some(n), None, None) => Ok(Cohort::Tenants(n)),
        (None, Some(p), None) => Ok(Cohort::Percent(p)),
        (None, None, Some(namespaces)) => {
            let namespaces: Vec<String> =
                namespaces.into_iter().map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect();
            if namespaces.is_empty() {
                return Err(CtlError::Refused("--namespaces names no namespace".into()));
            }
            Ok(Cohort::Namespaces(namespaces))
        }
        _ => Err(CtlError::Refused("give exactly one of --tenants, --percent and --namespaces".into())),
    }
}

fn refused_or(action: &'static str) -> impl FnOnce(gitops_shared::db::DbError) -> CtlError {
    move |error| match error {
        gitops_shared::db::DbError::InvalidMove { message } => CtlError::Refused(message),
        gitops_shared::db::DbError::NotFound { what } => CtlError::Refused(format!("{what} not found")),
        source => CtlError::Db { action, source },
    }
}

/// Starts a rollout.
pub async fn start(database_url: &str, request: RolloutRequest) -> Result<RolloutStarted, CtlError> {
    let mut client = crate::connect(database_url).await?;
    rollout::rollout_start(&mut client, request).await.map_err(refused_or("start the rollout"))
}

/// Promotes rollout `id`.
pub async fn promote(database_url: &str, id: i64, wave_size: Option<u32>) -> Result<(), CtlError> {
    let client = crate::connect(database_url).await?;
    rollout::rollout_promote(&client, id, wave_size).await.map_err(refused_or("promote the rollout"))
}

/// Aborts rollout `id`.
pub async fn abort(database_url: &str, id: i64, reason: &str) -> Result<(), CtlError> {
    let client = crate::connect(database_url).await?;
    rollout::rollout_abort(&client, id, reason).await.map_err(refused_or("abort the rollout"))
}

/// What `rollout start` prints.
pub fn render_started(request: &RolloutRequest, started: &RolloutStarted) -> String {
    format!(
        "rollout {} started: {} tenants moving to {:?} ({}); each wave bakes {:?} (gitopsctl rollout status {})\n",
        started.id,
        started.cohort.len(),
        request.target,
        started.cohort.join(", "),
        request.bake,
        started.id
    )
}

/// Every rollout, or one in detail.
pub async fn status(database_url: &str, id: Option<i64>) -> Result<String, CtlError> {
    let client = crate::connect(database_url).await?;
    let rollouts = rollout::rollout_list(&client, id).await.map_err(CtlError::db("list rollouts"))?;
    let Some(id) = id else { return Ok(render_list(&rollouts)) };
    let Some(one) = rollouts.first() else { return Err(CtlError::Refused(format!("rollout {id} not found"))) };
    let waves = rollout::rollout_waves(&client, id).await.map_err(CtlError::db("read the rollout's waves"))?;
    let members = rollout::rollout_members(&client, id).await.map_err(CtlError::db("read the rollout's tenants"))?;
    Ok(render_one(one, &waves, &members))
}

/// The table `rollout status` prints without an id.
pub fn render_list(rollouts: &[Rollout]) -> String {
    if rollouts.is_empty() {
        return "no rollouts\n".to_owned();
    }
    let rows: Vec<Vec<String>> = rollouts
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.target.clone(),
                r.target_version.clone().unwrap_or_else(|| "unknown".to_owned()),
                r.state.clone(),
                r.wave.to_string(),
                table::age_since(r.created_at),
                r.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table::render(&["ID", "TARGET", "VERSION", "STATE", "WAVE", "AGE", "REASON"], &rows)
}

/// One rollout with its waves and tenants.
pub fn render_one(rollout: &Rollout, waves: &[WaveResult], members: &[RolloutMember]) -> String {
    let mut out = format!(
        "rollout {} to {} (version {}): {}{}\nbake {:?} per wave, {} tenants per promotion wave, regressions tolerated: {}\n",
        rollout.id,
        rollout.target,
        rollout.target_version.as_deref().unwrap_or("unknown"),
        rollout.state,
        if rollout.promoting && !matches!(rollout.state.as_str(), "completed" | "rolled_back" | "aborted") {
            " (promoting)"
        } else {
            ""
        },
        rollout.bake,
        rollout.wave_size,
        rollout.max_regressions.map_or_else(|| "10% of a wave, at least 1".to_owned(), |n| n.to_string()),
    );
    if let Some(reason) = &rollout.reason {
        out.push_str(&format!("reason: {reason}\n"));
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = waves
        .iter()
        .map(|w| {
            vec![
                if w.wave == 0 { "canary".to_owned() } else { w.wave.to_string() },
                w.tenants.to_string(),
                w.deployments.to_string(),
                w.ok.to_string(),
                w.regressed.to_string(),
                w.excluded.to_string(),
            ]
        })
        .collect();
    out.push_str(&table::render(&["WAVE", "TENANTS", "DEPLOYMENTS", "OK", "REGRESSED", "EXCLUDED"], &rows));
    out.push('\n');
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| vec![m.namespace.clone(), m.wave.to_string(), m.source.clone(), m.state.clone()])
        .collect();
    out.push_str(&table::render(&["NAMESPACE", "WAVE", "FROM", "STATE"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cohort_is_exactly_one_of_the_three() {
        let args = |tenants, percent, namespaces| CohortArgs { tenants, percent, namespaces };
        assert_eq!(cohort(args(Some(2), None, None)).ok(), Some(Cohort::Tenants(2)));
        assert_eq!(cohort(args(None, Some(10), None)).ok(), Some(Cohort::Percent(10)));
        assert_eq!(
            cohort(args(None, None, Some(vec![" a".into(), "".into()]))).ok(),
            Some(Cohort::Namespaces(vec!["a".into()]))
        );
        assert!(cohort(args(None, None, Some(vec![" ".into()]))).is_err());
        assert!(cohort(args(Some(1), Some(1), None)).is_err());
    }
}
