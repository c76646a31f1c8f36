-- The queue's ordered scans walk their index in key order and stop at what they need.
--
-- `operation_safe_floor` looks for the lowest waiting key and `operation_assign_queue_key`
-- for a tenant's highest; both are `ORDER BY queue_key LIMIT 1` over a partial index
-- whose order is that key. When the table was analysed while the queue was nearly
-- empty, and a held snapshot then kept the index's dead entries from being cleaned up,
-- the planner took a bitmap scan of the whole waiting index and a sort for cheaper: the
-- floor read every entry of the index (tens of milliseconds while holding the instance's
-- signal lock, which every enqueue waits for) and every enqueue did the same in its
-- trigger, until the next ANALYZE. With sorting off inside these functions, the only
-- plan left that returns rows in key order is the index walk. The agents' claim
-- statement sets the same for its own transaction.
--
-- Expand-only: the functions keep their signatures and results, so agents of the
-- previous release run unchanged against this schema.
ALTER FUNCTION operation_safe_floor(bigint, bigint, bigint, integer) SET enable_sort = off;
ALTER FUNCTION operation_assign_queue_key() SET enable_sort = off;
