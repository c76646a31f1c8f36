-- Agents that serve several instances, and instances the service provisions itself.
--
-- host_cluster: the cluster an instance's Argo CD runs on (a DNS label the operator
-- chooses); `gitops-agent run --host-cluster NAME` serves every instance registered
-- with it, so an instance provisioned later needs no new Deployment. NULL: only
-- agents naming the instance (`--instance`) serve it.
-- provisioned_by: `gitopsctl` (`instance provision`) or `scale-up` (the writers'
-- automatic scale-up); NULL for instances registered with `instance add`.
--
-- engine_instance_duty: every agent process serving an instance claims its
-- operations, but the instance's singleton duties (the sweep, the health probe and
-- heartbeat, the fence clean-up) belong to one process at a time: the holder of
-- this lease. A holder renews it every heartbeat interval while its Argo CD answers;
-- another process takes it once it expired; a process that stops releases it.
--
-- instance_scale_up: the writers' automatic scale-up, one row per attempt. At most
-- one attempt is provisioning at any time (the partial unique index); an attempt
-- whose writer stopped renewing it (expires_at passed) may be ended by another.

ALTER TABLE engine_instance
    ADD COLUMN host_cluster   text CHECK (host_cluster ~ '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'),
    ADD COLUMN provisioned_by text CHECK (provisioned_by IN ('gitopsctl', 'scale-up'));

CREATE INDEX engine_instance_host_cluster ON engine_instance (host_cluster) WHERE host_cluster IS NOT NULL;

CREATE TABLE engine_instance_duty (
    engine_instance_id bigint      PRIMARY KEY REFERENCES engine_instance (id) ON DELETE CASCADE,
    -- The agent process holding the duties (its claimer name).
    holder             text        NOT NULL,
    expires_at         timestamptz NOT NULL,
    -- When the current holder took the lease (not changed by renewals).
    acquired_at        timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE instance_scale_up (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The instance being (or that was) provisioned.
    instance_name text        NOT NULL,
    state         text        NOT NULL DEFAULT 'provisioning'
                  CHECK (state IN ('provisioning', 'completed', 'failed')),
    -- The writer acting on it.
    holder        text        NOT NULL,
    -- The fleet's free capacity (tenants) when it started.
    free_capacity bigint      NOT NULL,
    error         text,
    started_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    finished_at   timestamptz
);

CREATE UNIQUE INDEX instance_scale_up_one_at_a_time ON instance_scale_up ((true)) WHERE state = 'provisioning';
