-- How many times a claim of this operation expired (its claimer crashed or stalled
-- holding it). Failures an agent reports are retried by their class (transient
-- ones for ever, with backoff); only operations whose leases keep expiring — a
-- change that crashes every agent that takes it — are dead-lettered by count.
-- Expand only: the default covers existing rows.
ALTER TABLE operation ADD COLUMN lease_expiries integer NOT NULL DEFAULT 0;
