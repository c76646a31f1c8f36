//! The integration tests, built as one binary (one link step instead of many).
//! They run against a real PostgreSQL: a throwaway server started once per run,
//! or the server in GITOPS_TEST_DATABASE_URL; each test gets its own database.

mod support;

mod agent_cluster_resources;
mod agent_deploy;
mod agent_destinations;
mod agent_multi;
mod agent_reconcile;
mod agent_run;
mod appstudio_kube;
mod crypto_store;
mod db_tls;
mod dev_up;
mod dev_up_appstudio;
mod fleet_balance;
mod fleet_epoch;
mod fleet_placement;
mod fleet_rollout;
mod kube_conformance;
mod kube_smoke;
mod migrations;
mod ops_dashboard;
mod process_signals;
mod queue_admin;
mod queue_failures;
mod queue_floor;
mod queue_race;
mod shard_takeover;
mod signal_race;
mod statements;
mod status_feed;
mod writer_admission;
mod writer_agent_chaos;
mod writer_api;
mod writer_boundary;
mod writer_connection;
mod writer_credentials;
mod writer_e2e;
mod writer_egress_proxy;
mod writer_events;
mod writer_fleet_move;
mod writer_provision;
mod writer_purge;
mod writer_ready;
mod writer_repository_check;
mod writer_resync;
mod writer_rollout;
mod writer_scale_up;
mod writer_service_account;
mod writer_status;
mod writer_tenancy;
