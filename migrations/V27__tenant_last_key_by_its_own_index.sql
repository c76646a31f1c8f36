-- A tenant's next queue key reads the top of that tenant's own keys, whatever the
-- statistics say.
--
-- `operation_assign_queue_key` gives a waiting operation max(front, the tenant's last
-- key + 1). Two partial indexes could find that last key: operation_tenant_key_idx
-- (the tenant's own keys: the top entry is the answer) and operation_claim_idx (every
-- tenant's keys, the tenant filtered from the rows: every key that other tenants hold
-- above this tenant's last is read, with its row). Their estimated costs are nearly
-- the same, and which one was cheaper turned on how many pages each index had: with
-- a held snapshot, the tenant index (entries added in the middle, half-full pages
-- when it splits) had half again as many pages as the claim index, and the key
-- trigger of `bench queue --hold-snapshot` read 70 buffers per enqueue instead of 3.
-- A quiet tenant writing behind a busy tenant's backlog of 5,000 would read all
-- 5,000 entries and rows.
--
-- The tenant's keys are now indexed negated, so its highest key comes first, and the
-- trigger asks for that order. No other index gives it; the claim index would need a
-- sort, which this function does not do (V26), so the walk of the tenant's own keys
-- is the only plan.
--
-- Expand-only: the trigger keeps its results, and the claim does not read the index
-- that is replaced.

CREATE INDEX operation_tenant_last_key_idx ON operation (engine_instance_id, tenant_id, (- queue_key))
    WHERE state = 'waiting' AND queue_key IS NOT NULL;

DROP INDEX operation_tenant_key_idx;

CREATE OR REPLACE FUNCTION operation_assign_queue_key() RETURNS trigger
    LANGUAGE plpgsql
    SET enable_sort = off
    AS $$
DECLARE
    v_front bigint;
    v_last  bigint;
BEGIN
    IF NEW.run_after > clock_timestamp() THEN
        NEW.queue_key := NULL;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'waiting' AND OLD.queue_key IS NOT NULL
       AND OLD.engine_instance_id = NEW.engine_instance_id THEN
        NEW.queue_key := OLD.queue_key;
        RETURN NEW;
    END IF;
    v_front := operation_front(NEW.engine_instance_id);
    -- The tenant's highest key: the first entry of its range of
    -- operation_tenant_last_key_idx (one entry, however long its backlog or anyone
    -- else's); only keys at or past the front, so that the walk never reaches
    -- claimed history.
    SELECT o.queue_key INTO v_last
      FROM operation o
     WHERE o.engine_instance_id = NEW.engine_instance_id
       AND o.tenant_id = NEW.tenant_id
       AND o.state = 'waiting' AND o.queue_key IS NOT NULL
       AND - o.queue_key <= - v_front
     ORDER BY - o.queue_key
     LIMIT 1;
    NEW.queue_key := GREATEST(v_front, v_last + 1);
    RETURN NEW;
END;
$$;
