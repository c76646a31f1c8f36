-- The queue tables churn: every operation leaves several dead row versions (enqueue,
-- claim, renewals, completion, pruning), and the signal row is rewritten at every
-- sleep and wake-up. Vacuum them after a small fraction of dead rows rather than the
-- default fifth of the table, so that once whoever held the xmin horizon lets go, the
-- next autovacuum round (naptime 1 min) cleans up what piled up meanwhile. Storage
-- parameters only: SHARE UPDATE EXCLUSIVE, nothing waits behind it.
ALTER TABLE operation SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.05
);
ALTER TABLE signal SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000
);
