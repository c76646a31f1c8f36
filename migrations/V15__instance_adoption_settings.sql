-- What decides whether one engine instance can adopt what another deployed: Argo CD
-- adopts live resources under the same Application name only when both track them
-- the same way (argocd-cm `application.resourceTrackingMethod` and
-- `application.instanceLabelKey`) and share the `installationID` (with annotation
-- tracking, another installation's resources are refused). Each agent reports its
-- instance's values (Argo CD's defaults for keys not set); NULL: not reported (an
-- agent that may not read argocd-cm). A move between instances whose reported
-- values differ is refused with the reason.

ALTER TABLE engine_instance
    ADD COLUMN tracking_method    text,
    ADD COLUMN instance_label_key text,
    ADD COLUMN installation_id    text;
