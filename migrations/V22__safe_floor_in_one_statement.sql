-- A consumer's safe claim floor (shared/src/queue/floor.rs) is found by one statement.
--
-- Finding it holds the instance's signal lock exclusively, and every transaction that
-- makes an operation waiting takes that lock shared (`signal_raise`): while it is held,
-- no enqueue can commit. Sent as a transaction of its own statements, the lock stayed
-- held for every round trip after it (the due retries' keys, the shared floor, the
-- scan, raising the shared floor, the commit), and with several agents, each finding
-- a floor at every wake, the writers' enqueues queued behind it. In one function call
-- the lock is held only while the server runs the steps.
--
-- A VOLATILE function takes a fresh snapshot for each statement it runs, so the scan
-- sees every operation committed before the lock was granted: the lock is what makes
-- the lowest waiting key the truth. `lock_timeout` is set for this transaction only,
-- and an enqueue that holds the lock longer makes the call fail with lock_not_available
-- (the caller tries again later).
CREATE FUNCTION operation_safe_floor(p_instance bigint, p_from bigint, p_slack bigint, p_wait_ms integer)
    RETURNS bigint
    LANGUAGE plpgsql AS $$
DECLARE
    v_from   bigint;
    v_lowest bigint;
    v_floor  bigint;
BEGIN
    PERFORM set_config('lock_timeout', GREATEST(p_wait_ms, 1) || 'ms', true);
    PERFORM pg_advisory_xact_lock(signal_lock_key('operations', p_instance));
    -- Backoffs that ended: the key trigger gives them their place in the queue.
    UPDATE operation SET run_after = run_after
     WHERE engine_instance_id = p_instance AND state = 'waiting' AND queue_key IS NULL AND run_after <= now();
    -- The shared floor is read before the scan: only what was true before the scan's
    -- snapshot bounds what it finds.
    v_from := GREATEST(p_from, operation_mark('floor', p_instance));
    -- The first live entry from v_from on, as an ordered scan that stops there.
    SELECT LEAST(operation_front(p_instance),
                 (SELECT o.queue_key FROM operation o
                   WHERE o.engine_instance_id = p_instance AND o.state = 'waiting'
                     AND o.queue_key IS NOT NULL AND o.queue_key >= v_from
                   ORDER BY o.queue_key LIMIT 1))
      INTO v_lowest;
    v_floor := GREATEST(v_lowest - p_slack, v_from);
    PERFORM operation_advance_mark('floor', p_instance, v_floor);
    RETURN v_floor;
END;
$$;
