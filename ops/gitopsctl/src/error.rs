//! `CtlError`: what a `gitopsctl` command could not do. Each variant names the
//! action; the source chain (printed by `main`) carries the detail. None of them
//! holds a connection string with its password.

use gitops_shared::crypto::{CryptoError, ReencryptError};
use gitops_shared::db::DbError;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("no database given: pass --database-url or set DATABASE_URL")]
    NoDatabaseUrl,
    #[error("could not connect to {database}")]
    Connect { database: String, source: DbError },
    #[error("could not {action}")]
    Db { action: &'static str, source: DbError },
    #[error("operation {id} is not failed (or does not exist); nothing was done")]
    NotFailed { id: i64 },
    #[error("could not load the encryption keys")]
    Keys { source: CryptoError },
    #[error("could not re-encrypt the stored secrets")]
    Reencrypt { source: ReencryptError },
    #[error("could not generate an encryption key")]
    GenerateKey { source: CryptoError },
    #[error("could not write the CustomResourceDefinitions")]
    Crds { source: gitops_writer::api::CrdRenderError },
    #[error("could not write the AppStudio CustomResourceDefinitions")]
    AppStudioCrds { source: gitops_appstudio::api::CrdRenderError },
    #[error("could not {action} the {kind} objects")]
    Kube { action: &'static str, kind: &'static str, source: kube::Error },
    #[error("could not configure the Kubernetes client")]
    KubeConfig { source: Box<dyn std::error::Error + Send + Sync> },
    /// What was asked cannot be done as things stand; the message says why.
    #[error("{0}")]
    Refused(String),
}

impl CtlError {
    /// The command line was incomplete: `main` exits with 2, as for clap's errors.
    pub fn is_usage(&self) -> bool {
        matches!(self, CtlError::NoDatabaseUrl)
    }

    /// Adapter for `map_err`: `engine_instance_list(..).await.map_err(CtlError::db("list instances"))`.
    pub fn db(action: &'static str) -> impl FnOnce(DbError) -> CtlError {
        move |source| CtlError::Db { action, source }
    }
}
