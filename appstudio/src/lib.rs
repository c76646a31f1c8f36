//! The AppStudio layer: Environments, Snapshots, bindings, promotions and deployment
//! targets (`appstudio.redhat.com/v1alpha1`) turned into the core resources
//! (GitOpsDeploymentManagedEnvironment, GitOpsDeployment) and Secrets. It talks only
//! to Kubernetes, never to the database: the writer takes it from there.

pub mod api;
pub mod binding;
pub mod claim;
pub mod cli;
pub mod condition;
pub mod context;
pub mod environment;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod promotion;
pub mod run;
pub mod target;
pub mod webhook;
