//! Self-fencing: an agent that has not written a heartbeat for a while stops writing
//! to its engine. Its instance is judged lost after `gitops.instance_lost_after`
//! without a heartbeat and fenced a grace later, when its tenants move elsewhere; an
//! agent cut off from the database meanwhile cannot see that. So it stops on its own,
//! earlier than the fence: every write through [`SelfFencing`] is refused (as an
//! instance fault, retried, never dead-lettered) once the last heartbeat is older
//! than the limit, and allowed again with the next heartbeat. Reads pass through.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use super::{
    ApplicationSpec, ClusterSpec, Engine, EngineError, ObjectKind, OperationView, OwnedObject, OwnedPage,
    ProgressStamp, ProjectSpec, Removal, RepositorySpec, StatusEvent, SyncRequest,
};

/// When the agent last wrote a heartbeat.
#[derive(Debug, Clone)]
pub struct HeartbeatClock {
    started: Instant,
    /// Milliseconds from `started` to the last heartbeat.
    last_ms: Arc<AtomicU64>,
}

impl HeartbeatClock {
    /// A clock whose last heartbeat is now.
    pub fn new() -> Self {
        HeartbeatClock { started: Instant::now(), last_ms: Arc::new(AtomicU64::new(0)) }
    }

    /// A heartbeat was written now.
    pub fn beat(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(now, Ordering::SeqCst);
    }

    /// How long since the last heartbeat.
    pub fn since_last(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::SeqCst));
        self.started.elapsed().saturating_sub(last)
    }
}

impl Default for HeartbeatClock {
    fn default() -> Self {
        HeartbeatClock::new()
    }
}

/// An engine whose writes stop while the agent's heartbeat is older than `limit`.
#[derive(Debug)]
pub struct SelfFencing {
    inner: Arc<dyn Engine>,
    clock: HeartbeatClock,
    limit: Duration,
}

impl SelfFencing {
    pub fn new(inner: Arc<dyn Engine>, clock: HeartbeatClock, limit: Duration) -> Self {
        SelfFencing { inner, clock, limit }
    }

    /// Refuses `action` while the heartbeat is too old.
    fn check(&self, action: &str) -> Result<(), EngineError> {
        let since = self.clock.since_last();
        if since <= self.limit {
            return Ok(());
        }
        Err(EngineError::Instance {
            action: action.to_owned(),
            source: format!(
                "no heartbeat for {}s (limit {}s): this agent writes nothing to Argo CD until it can heartbeat \
                 again, as its instance may have been fenced meanwhile",
                since.as_secs(),
                self.limit.as_secs()
            )
            .into(),
        })
    }

    /// Runs `write` (made only once the check passed) unless the heartbeat is too old.
    fn guarded<'a, T: Send + 'a>(
        &'a self,
        action: String,
        write: impl FnOnce(&'a dyn Engine) -> BoxFuture<'a, Result<T, EngineError>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, EngineError>> {
        Box::pin(async move {
            self.check(&action)?;
            write(self.inner.as_ref()).await
        })
    }
}

impl Engine for SelfFencing {
    fn apply_project<'a>(&'a self, spec: &'a ProjectSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("apply project {}", spec.name), move |engine| engine.apply_project(spec))
    }

    fn delete_project<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        self.guarded(format!("delete project {name}"), move |engine| engine.delete_project(name))
    }

    fn apply_application<'a>(&'a self, spec: &'a ApplicationSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("apply application {}", spec.name), move |engine| engine.apply_application(spec))
    }

    fn delete_application<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        self.guarded(format!("delete application {name}"), move |engine| engine.delete_application(name))
    }

    fn release_application<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        self.guarded(format!("release application {name}"), move |engine| engine.release_application(name))
    }

    fn apply_cluster<'a>(&'a self, spec: &'a ClusterSpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("apply cluster secret {}", spec.name), move |engine| engine.apply_cluster(spec))
    }

    fn delete_cluster<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        self.guarded(format!("delete cluster secret {name}"), move |engine| engine.delete_cluster(name))
    }

    fn apply_repository<'a>(&'a self, spec: &'a RepositorySpec) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("apply repository secret {}", spec.name), move |engine| engine.apply_repository(spec))
    }

    fn delete_repository<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
        self.guarded(format!("delete repository secret {name}"), move |engine| engine.delete_repository(name))
    }

    fn operation<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<Option<OperationView>, EngineError>> {
        self.inner.operation(application)
    }

    fn request_sync<'a>(&'a self, request: &'a SyncRequest) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("request a sync of {}", request.application), move |engine| engine.request_sync(request))
    }

    fn withdraw_sync<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("withdraw the sync of {application}"), move |engine| engine.withdraw_sync(application))
    }

    fn terminate<'a>(&'a self, application: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
        self.guarded(format!("terminate the sync of {application}"), move |engine| engine.terminate(application))
    }

    fn list_owned(&self) -> BoxFuture<'_, Result<Vec<OwnedObject>, EngineError>> {
        self.inner.list_owned()
    }

    fn list_tenant<'a>(
        &'a self,
        kind: super::ObjectKind,
        tenant: gitops_shared::model::TenantId,
    ) -> BoxFuture<'a, Result<Vec<OwnedObject>, EngineError>> {
        self.inner.list_tenant(kind, tenant)
    }

    fn list_owned_labelled<'a>(
        &'a self,
        label: &'a str,
        value: &'a str,
    ) -> BoxFuture<'a, Result<Vec<OwnedObject>, EngineError>> {
        self.inner.list_owned_labelled(label, value)
    }

    fn list_owned_page<'a>(
        &'a self,
        kind: ObjectKind,
        from: Option<&'a str>,
        limit: u32,
    ) -> BoxFuture<'a, Result<OwnedPage, EngineError>> {
        self.inner.list_owned_page(kind, from, limit)
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        self.inner.probe()
    }

    fn probe_progress(&self) -> BoxFuture<'_, Result<ProgressStamp, EngineError>> {
        self.inner.probe_progress()
    }

    fn adoption_settings(&self) -> BoxFuture<'_, Result<Option<super::AdoptionSettings>, EngineError>> {
        self.inner.adoption_settings()
    }

    fn version(&self) -> BoxFuture<'_, Result<Option<String>, EngineError>> {
        self.inner.version()
    }

    fn status_events(&self) -> BoxStream<'_, Result<StatusEvent, EngineError>> {
        self.inner.status_events()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts the writes that reach it.
    #[derive(Debug, Default)]
    struct Counting {
        writes: AtomicUsize,
    }

    impl Counting {
        fn wrote<T: Send + 'static>(&self, value: T) -> BoxFuture<'_, Result<T, EngineError>> {
            self.writes.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move { Ok(value) })
        }
    }

    impl Engine for Counting {
        fn apply_project<'a>(&'a self, _: &'a ProjectSpec) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn delete_project<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
            self.wrote(Removal::Gone)
        }
        fn apply_application<'a>(&'a self, _: &'a ApplicationSpec) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn delete_application<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
            self.wrote(Removal::Gone)
        }
        fn apply_cluster<'a>(&'a self, _: &'a ClusterSpec) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn delete_cluster<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
            self.wrote(Removal::Gone)
        }
        fn apply_repository<'a>(&'a self, _: &'a RepositorySpec) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn delete_repository<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Removal, EngineError>> {
            self.wrote(Removal::Gone)
        }
        fn operation<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<Option<OperationView>, EngineError>> {
            Box::pin(async { Ok(None) })
        }
        fn request_sync<'a>(&'a self, _: &'a SyncRequest) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn withdraw_sync<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn terminate<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), EngineError>> {
            self.wrote(())
        }
        fn list_owned(&self) -> BoxFuture<'_, Result<Vec<OwnedObject>, EngineError>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn status_events(&self) -> BoxStream<'_, Result<StatusEvent, EngineError>> {
            Box::pin(futures_util::stream::empty())
        }
    }

    /// A clock whose last heartbeat was `ago`.
    fn beaten(ago: Duration) -> HeartbeatClock {
        let started = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        HeartbeatClock { started, last_ms: Arc::new(AtomicU64::new(0)) }
    }

    #[tokio::test]
    async fn writes_stop_while_the_heartbeat_is_too_old_and_resume_with_the_next() {
        let inner = Arc::new(Counting::default());
        let clock = beaten(Duration::from_secs(120));
        let engine = SelfFencing::new(inner.clone(), clock.clone(), Duration::from_secs(90));
        let sync = SyncRequest { application: "app".into(), revision: "main".into(), correlation_id: "c".into() };

        let refused = engine.request_sync(&sync).await.expect_err("no heartbeat for 120 s");
        assert!(matches!(refused, EngineError::Instance { .. }), "{refused:?}");
        assert!(engine.delete_application("app").await.is_err());
        assert!(engine.terminate("app").await.is_err());
        assert_eq!(inner.writes.load(Ordering::SeqCst), 0, "nothing reached the engine");
        // Reads go on: the clean-up on return needs them.
        assert!(engine.list_owned().await.is_ok());

        clock.beat();
        engine.request_sync(&sync).await.expect("a fresh heartbeat allows writes");
        engine.delete_application("app").await.expect("delete");
        assert_eq!(inner.writes.load(Ordering::SeqCst), 2);
    }
}
