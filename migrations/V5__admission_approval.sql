-- What the writer's admission webhook let in after checking who asked: a
-- GitOpsDeployment into its own namespace (which then acts with the home ClusterRole)
-- or a SyncRun (whose revision then runs with it), at the generation it reviewed.
-- The writer stores such intent only when its webhook approved exactly that object
-- and generation, so a request the webhook never saw (not registered yet, failing
-- open, or judged on another object) is never taken on trust.
-- Rows are small and short-lived: the purge loop removes them after a day.

CREATE TABLE admission_approval (
    resource_uid uuid NOT NULL,
    generation bigint NOT NULL,
    kind text NOT NULL CHECK (kind IN ('GitOpsDeployment', 'GitOpsDeploymentSyncRun')),
    requester text NOT NULL,
    approved_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_uid, generation)
);

CREATE INDEX admission_approval_age_idx ON admission_approval (approved_at);
