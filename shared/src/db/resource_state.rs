//! What the agent last made of a managed environment or a repository credential
//! (table `resource_state`): the generation it last applied as an Argo CD Secret,
//! or the tenant's message of its last failed reconcile. Read by the writers on
//! the status feed, beside `application_state`, so those kinds' failures reach
//! their tenant resources too.

use crate::db::application_state::AgentOutcome;
use crate::db::engine_instance::InstanceEpoch;
use crate::db::{DbError, Statements};
use crate::placed_at_epoch;

/// A kind of row whose outcome lives in `resource_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateOf {
    ManagedEnvironment,
    RepositoryCredential,
}

// Inserted only while the intent row exists and its tenant is placed on the writing
// instance at its current epoch; changed only when it differs (every change takes a
// place in the status feed). The stalled generation is the row's
// generation at the failure.
macro_rules! outcome_statement {
    ($column:literal, $table:literal) => {
        concat!(
            "INSERT INTO resource_state (",
            $column,
            ", tenant_id, applied_generation, agent_message, agent_stalled, stalled_generation)
SELECT r.id, r.tenant_id, $2, $3, $4, CASE WHEN $4 THEN r.generation END FROM ",
            $table,
            " r JOIN tenant t ON t.id = r.tenant_id WHERE r.id = $1 AND ",
            placed_at_epoch!("$5", "$6"),
            "
ON CONFLICT (",
            $column,
            ") DO UPDATE
   SET applied_generation = COALESCE(EXCLUDED.applied_generation, resource_state.applied_generation),
       agent_message = EXCLUDED.agent_message, agent_stalled = EXCLUDED.agent_stalled,
       stalled_generation = EXCLUDED.stalled_generation, updated_at = now()
 WHERE (COALESCE(EXCLUDED.applied_generation, resource_state.applied_generation),
        EXCLUDED.agent_message, EXCLUDED.agent_stalled, EXCLUDED.stalled_generation)
       IS DISTINCT FROM
       (resource_state.applied_generation, resource_state.agent_message, resource_state.agent_stalled,
        resource_state.stalled_generation)"
        )
    };
}

const ENVIRONMENT_OUTCOME: &str = outcome_statement!("managed_environment_id", "managed_environment");
const CREDENTIAL_OUTCOME: &str = outcome_statement!("repository_credential_id", "repository_credential");

/// Every statement of this module (a test prepares them against the schema).
pub const STATEMENTS: &[&str] = &[ENVIRONMENT_OUTCOME, CREDENTIAL_OUTCOME];

/// Records `outcome` for row `id` of `kind` (only when it changes what was recorded).
pub async fn resource_state_record_outcome(
    client: &impl Statements,
    epoch: &InstanceEpoch,
    kind: StateOf,
    id: i64,
    outcome: &AgentOutcome,
) -> Result<(), DbError> {
    let statement = match kind {
        StateOf::ManagedEnvironment => ENVIRONMENT_OUTCOME,
        StateOf::RepositoryCredential => CREDENTIAL_OUTCOME,
    };
    let (generation, message, stalled) = outcome.columns();
    client
        .run(statement, &[&id, &generation, &message, &stalled, &epoch.instance, &epoch.current()])
        .await
        .map_err(DbError::query("record the agent's outcome"))?;
    Ok(())
}
