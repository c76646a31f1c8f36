-- Why a sync request failed when the service, not Argo CD, ended it. A tenant move
-- (drain, rebalance, failover) fails every sync of the tenant still pending or
-- running with reason 'InstanceMoved': its Application leaves the instance that ran
-- it, and the tenant syncs again with a new GitOpsDeploymentSyncRun. NULL for
-- syncs that ended in Argo CD (the SyncRun's reason follows their state).

ALTER TABLE sync_operation ADD COLUMN failure_reason text;
