-- Canary rollouts of a new Argo CD version, and the version each instance runs.
--
-- argocd_version: what an agent of the instance read from it (the image tag of its
-- application controller's StatefulSet); NULL until reported, or when it cannot be
-- read. version_reported_at: when it was last reported.
--
-- A rollout moves a cohort of tenants onto its target instance with the tenant move
-- protocol (tenant_move.rs), bakes, and compares each cohort deployment's health and
-- sync with what it was before the move (rollout_baseline); promotion moves the rest
-- of the source instances' tenants in waves with the same check; a regression past
-- max_regressions (or an operator's abort) moves every tenant it moved back.
-- state: moving (a wave's moves in progress), baking (until bake_until), waiting
-- (the canary passed; an operator promotes), rolling_back (moving tenants back to
-- their sources; outcome says how it ends), then completed, rolled_back or aborted.
-- A writer's fleet watch advances each active rollout, one step at a time under an
-- advisory lock; every step is a row change, so a rollout survives restarts.

ALTER TABLE engine_instance
    ADD COLUMN argocd_version      text,
    ADD COLUMN version_reported_at timestamptz;

CREATE TABLE rollout (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    target_instance_id bigint NOT NULL REFERENCES engine_instance (id) ON DELETE CASCADE,
    -- The target's reported version when the rollout started.
    target_version     text,
    state              text NOT NULL DEFAULT 'moving'
                       CHECK (state IN ('moving', 'baking', 'waiting', 'rolling_back',
                                        'completed', 'rolled_back', 'aborted')),
    -- 0: the canary; promotion's waves are 1, 2, ...
    wave               integer NOT NULL DEFAULT 0,
    -- Set by `rollout promote`: waves follow each other without a further command.
    promoting          boolean NOT NULL DEFAULT false,
    -- Tenants per promotion wave (bounded by the target's free capacity).
    wave_size          integer NOT NULL CHECK (wave_size > 0),
    bake_ms            bigint NOT NULL CHECK (bake_ms >= 0),
    -- Regressions tolerated in one wave; one more rolls the rollout back.
    max_regressions    integer CHECK (max_regressions >= 0),
    bake_until         timestamptz,
    -- rolled_back or aborted, once rolling back.
    outcome            text CHECK (outcome IN ('rolled_back', 'aborted')),
    reason             text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz,
    CONSTRAINT rollout_rolling_back_has_outcome CHECK ((state = 'rolling_back') <= (outcome IS NOT NULL))
);

-- One active rollout per target.
CREATE UNIQUE INDEX rollout_active_target ON rollout (target_instance_id)
    WHERE state IN ('moving', 'baking', 'waiting', 'rolling_back');

-- The tenants a rollout moved (or is moving), with where each came from.
-- state: moving (on its way to the target), moved, returning (moving back),
-- returned (back on its source, or placed elsewhere by a failover). active: the
-- rollout acts on the tenant; the unique index makes that one rollout at a time.
CREATE TABLE rollout_tenant (
    rollout_id         bigint NOT NULL REFERENCES rollout (id) ON DELETE CASCADE,
    tenant_id          bigint NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,
    wave               integer NOT NULL,
    source_instance_id bigint NOT NULL REFERENCES engine_instance (id) ON DELETE CASCADE,
    state              text NOT NULL DEFAULT 'moving'
                       CHECK (state IN ('moving', 'moved', 'returning', 'returned')),
    active             boolean NOT NULL DEFAULT true,
    PRIMARY KEY (rollout_id, tenant_id)
);

CREATE UNIQUE INDEX rollout_tenant_one_rollout ON rollout_tenant (tenant_id) WHERE active;

-- Each cohort deployment's state before its move, and the bake's verdict on it:
-- ok, regressed (detail says how) or excluded (its generation changed meanwhile).
CREATE TABLE rollout_baseline (
    rollout_id       bigint NOT NULL REFERENCES rollout (id) ON DELETE CASCADE,
    application_id   bigint NOT NULL REFERENCES application (id) ON DELETE CASCADE,
    tenant_id        bigint NOT NULL,
    wave             integer NOT NULL,
    generation       bigint NOT NULL,
    health_status    text,
    sync_status      text,
    comparison_error boolean NOT NULL,
    sync_failed      boolean NOT NULL,
    verdict          text CHECK (verdict IN ('ok', 'regressed', 'excluded')),
    detail           text,
    PRIMARY KEY (rollout_id, application_id)
);
