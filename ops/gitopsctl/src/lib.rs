//! `gitopsctl`, the operators' command line, as a library. Every command is a
//! public function that returns what it did, and a `render_*` function turns that
//! into text, so integration tests run exactly the code the binary runs. `run`
//! dispatches a parsed command line and returns the text for stdout.

pub mod cli;
pub mod crds;
pub mod error;
pub mod instance;
pub mod migrate;
pub mod provision;
pub mod queue;
pub mod rollout;
pub mod secrets;
mod table;
pub mod tenant;

use gitops_shared::config::redact_database_url;
use gitops_shared::db;
use tokio_postgres::Client;

pub use error::CtlError;

use cli::{Command, CrdsCommand, DbArgs, InstanceCommand, QueueCommand, RolloutCommand, SecretsCommand, TenantCommand};

/// The `application_name` gitopsctl's connections carry.
const APPLICATION_NAME: &str = "gitopsctl";

/// Runs one command; returns what to print on stdout.
pub async fn run(command: Command) -> Result<String, CtlError> {
    match command {
        Command::Migrate(db) => Ok(migrate::render(&migrate::migrate(database_url(&db)?).await?)),
        Command::Instance(args) => {
            let url = database_url(&args.db)?;
            match args.command {
                InstanceCommand::Add { name, argocd_namespace, capacity, host_cluster } => {
                    let id = instance::add(url, &name, &argocd_namespace, capacity, host_cluster.as_deref()).await?;
                    Ok(format!("engine instance {name:?} registered (id {id})\n"))
                }
                InstanceCommand::List => {
                    let mut text = instance::render_list(&instance::list(url).await?);
                    text.push_str(&instance::render_scale_ups(&instance::scale_ups(url).await?));
                    Ok(text)
                }
                InstanceCommand::Cordon { name } => {
                    instance::cordon(url, &name, true).await?;
                    Ok(format!("engine instance {name:?} cordoned: it takes no new tenants\n"))
                }
                InstanceCommand::Uncordon { name } => {
                    instance::cordon(url, &name, false).await?;
                    Ok(format!("engine instance {name:?} uncordoned: it takes new tenants again\n"))
                }
                InstanceCommand::Drain { name } => {
                    let moved = instance::drain(url, &name).await?;
                    Ok(format!("engine instance {name:?} cordoned; {moved} tenants moving off it\n"))
                }
                InstanceCommand::Rebalance { threshold, max_moves } => {
                    let moved = instance::rebalance(url, threshold, max_moves).await?;
                    Ok(if moved.is_empty() {
                        "the instances' loads are within the threshold (or moves are running): nothing moved\n"
                            .to_owned()
                    } else {
                        moved.iter().map(|(ns, from, to)| format!("moving {ns:?} from {from:?} to {to:?}\n")).collect()
                    })
                }
                InstanceCommand::Provision {
                    name,
                    namespace,
                    version,
                    capacity,
                    agent_service_account,
                    wait,
                    host_cluster,
                } => {
                    let request = provision::ProvisionRequest {
                        name: name.clone(),
                        namespace,
                        version,
                        capacity,
                        agents: agent_service_account,
                        wait,
                        host_cluster: host_cluster.clone(),
                        provisioned_by: gitops_shared::db::engine_instance::ProvisionedBy::Gitopsctl,
                    };
                    let id = provision::provision(url, provision::host_cluster().await?, &request).await?;
                    Ok(match host_cluster {
                        Some(host) => format!(
                            "engine instance {name:?} provisioned and registered (id {id}) on host cluster {host:?}: \
                             agents started with --host-cluster {host} serve it\n"
                        ),
                        None => format!(
                            "engine instance {name:?} provisioned and registered (id {id}); run its agents with \
                             --instance {name}\n"
                        ),
                    })
                }
                InstanceCommand::Decommission { name, wait } => {
                    let purged = provision::decommission(url, provision::host_cluster().await?, &name, wait).await?;
                    Ok(format!(
                        "engine instance {name:?} decommissioned: its tenants moved, its registration and {purged} \
                         operations of its history removed, its ArgoCD and namespace deleted\n"
                    ))
                }
                InstanceCommand::Remove { name } => {
                    instance::remove(url, &name).await?;
                    Ok(format!("engine instance {name:?} removed\n"))
                }
            }
        }
        Command::Queue(args) => {
            let url = database_url(&args.db)?;
            match args.command {
                None => {
                    let (summary, holder) = queue::summary(url).await?;
                    Ok(queue::render_summary(&summary, holder.as_ref(), args.snapshot_threshold))
                }
                Some(QueueCommand::Retry { id: Some(id), .. }) => {
                    Ok(queue::render_retry(id, queue::retry(url, id).await?)?)
                }
                Some(QueueCommand::Retry { id: None, .. }) => {
                    Ok(queue::render_retry_all(queue::retry_all_failed(url).await?))
                }
                Some(QueueCommand::Discard { id: Some(id), .. }) => queue::discard(url, id).await,
                Some(QueueCommand::Discard { id: None, .. }) => queue::discard_all_failed(url).await,
                Some(QueueCommand::Failed { limit }) => Ok(queue::render_failed(&queue::failed(url, limit).await?)),
            }
        }
        Command::Tenant(args) => {
            let url = database_url(&args.db)?;
            match args.command {
                TenantCommand::HomeDeployments => {
                    Ok(tenant::render_home_deployments(&tenant::home_deployments(url).await?))
                }
                TenantCommand::List { instance } => {
                    Ok(tenant::render_list(&tenant::list(url, None, instance.as_deref()).await?))
                }
                TenantCommand::Show { namespace } => tenant::show(url, &namespace).await,
                TenantCommand::Move { namespace, to } => {
                    tenant::move_to(url, &namespace, &to, "operator").await?;
                    Ok(format!(
                        "tenant {namespace:?} is moving to {to:?}: its current instance releases it, then {to:?} \
                         adopts it (gitopsctl tenant show {namespace})\n"
                    ))
                }
            }
        }
        Command::Rollout(args) => {
            let url = database_url(&args.db)?;
            match args.command {
                RolloutCommand::Start { to, cohort, from, bake, max_regressions, wave_size } => {
                    let cohort = rollout::cohort(cohort)?;
                    let request = gitops_shared::db::rollout::RolloutRequest {
                        target: to,
                        cohort,
                        from,
                        bake,
                        max_regressions,
                        wave_size,
                    };
                    let started = rollout::start(url, request.clone()).await?;
                    Ok(rollout::render_started(&request, &started))
                }
                RolloutCommand::Promote { id, wave_size } => {
                    rollout::promote(url, id, wave_size).await?;
                    Ok(format!(
                        "rollout {id} promotes: once its canary passed, the source instances' other tenants move in \
                         waves (gitopsctl rollout status {id})\n"
                    ))
                }
                RolloutCommand::Abort { id, reason } => {
                    rollout::abort(url, id, &reason).await?;
                    Ok(format!("rollout {id} aborted: its tenants move back (gitopsctl rollout status {id})\n"))
                }
                RolloutCommand::Status { id } => rollout::status(url, id).await,
            }
        }
        Command::Secrets(args) => match args.command {
            SecretsCommand::Reencrypt => {
                let url = database_url(&args.db)?;
                let keys = secrets::keys_from_env()?;
                Ok(secrets::render_reencrypt(secrets::reencrypt(url, &keys).await?, &keys))
            }
            SecretsCommand::GenerateKey { id } => Ok(format!("{}\n", secrets::generate_key(&id)?)),
        },
        Command::Crds(args) => match args.command {
            None => {
                let mut written =
                    gitops_writer::api::write_crd_files(&args.out).map_err(|source| CtlError::Crds { source })?;
                written.extend(
                    gitops_appstudio::api::write_crd_files(&args.out)
                        .map_err(|source| CtlError::AppStudioCrds { source })?,
                );
                Ok(written.iter().map(|path| format!("wrote {}\n", path.display())).collect())
            }
            Some(CrdsCommand::Check { kubeconfig, api_url_allow_private }) => {
                let kube = kube_client(kubeconfig.as_deref()).await?;
                let refused = crds::check(kube, api_url_allow_private).await?;
                let text = crds::render_refused(&refused);
                if refused.is_empty() { Ok(text) } else { Err(CtlError::Refused(text.trim_end().to_owned())) }
            }
        },
    }
}

/// A client for `path`, or as kube infers it (KUBECONFIG, in-cluster).
async fn kube_client(path: Option<&std::path::Path>) -> Result<kube::Client, CtlError> {
    let mut config = match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|source| CtlError::KubeConfig { source: Box::new(source) })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| CtlError::KubeConfig { source: Box::new(source) })?
        }
        None => kube::Config::infer().await.map_err(|source| CtlError::KubeConfig { source: Box::new(source) })?,
    };
    // The cluster's API is reached directly. kube takes proxy variables from the
    // environment (often set on hosts for other traffic) into the config, and this
    // build speaks no proxy protocol: every request would fail.
    config.proxy_url = None;
    kube::Client::try_from(config).map_err(|source| CtlError::KubeConfig { source: Box::new(source) })
}

fn database_url(args: &DbArgs) -> Result<&str, CtlError> {
    args.database_url.as_ref().map(|url| url.expose()).filter(|url| !url.is_empty()).ok_or(CtlError::NoDatabaseUrl)
}

/// A dedicated connection for one command.
async fn connect(url: &str) -> Result<Client, CtlError> {
    tracing::debug!(database = %redact_database_url(url), "connecting");
    db::connect(url, APPLICATION_NAME)
        .await
        .map_err(|source| CtlError::Connect { database: redact_database_url(url), source })
}
