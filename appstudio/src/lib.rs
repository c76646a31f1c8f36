//! The AppStudio layer: Environments, Snapshots, bindings, promotions and deployment
//! targets (`appstudio.redhat.com/v1alpha1`) turned into the core resources
//! (GitOpsDeploymentManagedEnvironment, GitOpsDeployment) and Secrets. It talks only
//! to Kubernetes, never to the database: the writer takes it from there.

pub mod api;
