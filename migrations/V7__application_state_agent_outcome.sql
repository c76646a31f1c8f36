-- What the agent last made of an application, beside what Argo CD reports: the
-- generation of the row it last applied, and the tenant-readable message of the
-- last reconcile that failed (cleared by the next success), and whether that
-- failure is permanent. Changes go through the status feed like the rest, so the
-- tenant's resource says whether its current generation is in Argo CD, and why not.
-- A permanent failure records the generation it failed at: the agent's sweep does
-- not try that generation again (a new one is tried as usual).
-- Expand only: nulls and false are what an old agent leaves.
ALTER TABLE application_state
    ADD COLUMN applied_generation bigint,
    ADD COLUMN agent_message      text,
    ADD COLUMN agent_stalled      boolean NOT NULL DEFAULT false,
    ADD COLUMN stalled_generation bigint;
