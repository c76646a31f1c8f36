//! Which namespaces this writer serves, as the operator configured it
//! (`gitops_shared::tenancy`), with the engine instances' namespaces kept current
//! from the database: an instance registered while the writer runs reserves its
//! namespace within [`ServedNamespaces::refresh_every`]. The controllers ask
//! before they write anything for a namespace; the admission webhook asks before
//! it lets a resource in.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use gitops_shared::db::engine_instance::engine_instance_namespaces;
use gitops_shared::db::{DbError, DbPool, pooled};
use gitops_shared::tenancy::{LabelSelector, NamePattern, NamespacePolicy, NotServed, Reserved};
use tokio_util::sync::CancellationToken;

/// The operator's choice of tenant namespaces.
#[derive(Debug, Clone, Default)]
pub struct TenancySettings {
    /// Serve only namespaces whose labels match (None: any).
    pub selector: Option<LabelSelector>,
    /// Serve only namespaces whose names match one of these (empty: any).
    pub patterns: Vec<NamePattern>,
    /// The service's own namespaces (writer, agents, home identities): never tenants.
    pub service_namespaces: BTreeSet<String>,
    /// More namespaces that are never tenants.
    pub reserved: Vec<NamePattern>,
}

/// The live answer to "does the service serve this namespace?".
#[derive(Debug)]
pub struct ServedNamespaces {
    settings: TenancySettings,
    engines: RwLock<BTreeSet<String>>,
    /// Namespace labels as the controllers' namespace watcher last saw them (the
    /// admission webhook answers from here instead of reading each namespace).
    labels: Mutex<HashMap<String, BTreeMap<String, String>>>,
    pub refresh_every: Duration,
}

impl ServedNamespaces {
    pub fn new(settings: TenancySettings) -> Arc<ServedNamespaces> {
        Arc::new(ServedNamespaces {
            settings,
            engines: RwLock::new(BTreeSet::new()),
            labels: Mutex::new(HashMap::new()),
            refresh_every: Duration::from_secs(15),
        })
    }

    fn policy(&self) -> NamespacePolicy {
        let engines = self.engines.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        NamespacePolicy {
            selector: self.settings.selector.clone(),
            patterns: self.settings.patterns.clone(),
            reserved: Reserved {
                service: self.settings.service_namespaces.clone(),
                extra: self.settings.reserved.clone(),
                engines,
            },
        }
    }

    /// Whether `namespace`, labelled `labels`, is a tenant namespace.
    pub fn serves(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Result<(), NotServed> {
        self.policy().serves(namespace, labels)
    }

    /// Records the labels of `namespace`; returns those recorded before.
    pub fn remember(&self, namespace: &str, labels: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
        self.labels.lock().unwrap_or_else(PoisonError::into_inner).insert(namespace.to_owned(), labels)
    }

    /// Forgets a namespace that went.
    pub fn forget(&self, namespace: &str) {
        self.labels.lock().unwrap_or_else(PoisonError::into_inner).remove(namespace);
    }

    /// The labels of `namespace` as last seen; None when it was never seen.
    pub fn labels_of(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.labels.lock().unwrap_or_else(PoisonError::into_inner).get(namespace).cloned()
    }

    /// Reads the engine instances' namespaces.
    pub async fn refresh(&self, pool: &DbPool) -> Result<(), DbError> {
        let client = pooled(pool).await?;
        let engines = engine_instance_namespaces(&client).await?;
        *self.engines.write().unwrap_or_else(std::sync::PoisonError::into_inner) = engines;
        Ok(())
    }

    /// Refreshes every `refresh_every` until `cancel`.
    pub async fn refresh_loop(self: Arc<Self>, pool: DbPool, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(self.refresh_every) => {}
            }
            if let Err(error) = self.refresh(&pool).await {
                tracing::warn!(error = %gitops_shared::telemetry::error_chain(&error), "could not read the engine instances' namespaces; retrying");
            }
        }
    }
}
