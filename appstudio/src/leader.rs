//! Leader election on a `coordination.k8s.io/v1` Lease, so that replicas of the
//! layer run its controllers one at a time while every replica serves the webhook
//! and the probes.
//!
//! The rules are client-go's: the holder renews the Lease every `renew_every`; a
//! candidate takes it when it is free (no holder) or when its record has not
//! changed for `lease_duration` as the candidate's own clock measures it (so clocks
//! need not agree). Every write is a replace at the resourceVersion read, so of
//! candidates racing for one record exactly one wins. A leader that cannot renew
//! for `renew_deadline` (well under `lease_duration`, and each attempt's calls are
//! limited in time), or finds another holder, stops its controllers — aborting them
//! if they do not stop before a candidate could take over — and returns
//! [`LeaderError::Lost`] (the process exits and is restarted as a
//! candidate); on shutdown it stops them, then releases the Lease so a successor
//! need not wait.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

/// Where and as whom to stand for election.
#[derive(Debug, Clone)]
pub struct LeaderSettings {
    pub namespace: String,
    pub lease_name: String,
    /// This replica's name in the Lease (unique among candidates).
    pub identity: String,
    /// How long a record may stay unchanged before candidates take the Lease.
    pub lease_duration: Duration,
    /// How often the leader renews (well under `lease_duration`); also the limit
    /// of one attempt's API calls.
    pub renew_every: Duration,
    /// How long a leader keeps leading without a successful renewal. Well under
    /// `lease_duration`, so it has stopped its controllers before a candidate can
    /// take the Lease.
    pub renew_deadline: Duration,
}

impl LeaderSettings {
    /// The defaults client-go's controllers use: 15 s leases renewed every 2 s
    /// (its retry period), leadership given up after 10 s without a renewal.
    pub fn new(namespace: String, lease_name: String, identity: String) -> LeaderSettings {
        LeaderSettings {
            namespace,
            lease_name,
            identity,
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
            renew_deadline: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lost the leader lease {lease}: {why}")]
    Lost { lease: String, why: String },
}

/// The record a candidate last saw and when it saw it change.
#[derive(Debug, Default)]
struct Observed {
    record: Option<(Option<String>, Option<String>, Option<i32>)>,
    at: Option<Instant>,
}

impl Observed {
    /// Notes `spec` as seen now; returns whether it expired (unchanged for `duration`).
    fn expired(&mut self, spec: &LeaseSpec, duration: Duration, now: Instant) -> bool {
        let record =
            (spec.holder_identity.clone(), spec.renew_time.as_ref().map(|t| t.0.to_string()), spec.lease_transitions);
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.at = Some(now);
        }
        self.at.is_none_or(|at| now.saturating_duration_since(at) >= duration)
    }
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    settings: LeaderSettings,
    observed: Observed,
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

impl Elector {
    pub fn new(client: kube::Client, settings: LeaderSettings) -> Elector {
        Elector { api: Api::namespaced(client, &settings.namespace), settings, observed: Observed::default() }
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// [`Self::try_acquire_or_renew`] within `renew_every` (at least a second): a
    /// call that hangs counts as a failed attempt.
    async fn attempt(&mut self) -> Result<bool, String> {
        let limit = self.settings.renew_every.max(Duration::from_secs(1));
        match tokio::time::timeout(limit, self.try_acquire_or_renew()).await {
            Ok(result) => result.map_err(|error| error.to_string()),
            Err(_) => Err(format!("no answer within {limit:?}")),
        }
    }

    /// One attempt to take or renew the Lease: whether this candidate holds it now.
    /// A lost race (409) is not an error: someone else holds it.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let me = self.settings.identity.clone();
        let Some(mut lease) = self.api.get_opt(&self.settings.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.settings.lease_name.clone()), ..ObjectMeta::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await);
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let expired = self.observed.expired(&spec, self.settings.lease_duration, Instant::now());
        if holder.as_deref() != Some(me.as_str()) {
            if holder.is_some() && !expired {
                return Ok(false);
            }
            spec.holder_identity = Some(me);
            spec.acquire_time = Some(now());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(self.duration_seconds());
        lease.spec = Some(spec);
        let name = self.settings.lease_name.clone();
        conflict_is_false(self.api.replace(&name, &PostParams::default(), &lease).await)
    }

    /// Gives the Lease up if this candidate holds it (on shutdown).
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.settings.lease_name).await? else { return Ok(()) };
        let mut spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now());
        lease.spec = Some(spec);
        let name = self.settings.lease_name.clone();
        conflict_is_false(self.api.replace(&name, &PostParams::default(), &lease).await).map(drop)
    }

    /// Waits to become leader, then runs `work` (given a token cancelled when
    /// leadership ends) while renewing, until `cancel` (Ok, after releasing the
    /// Lease) or until leadership is lost (Err). `leading` follows the state.
    pub async fn lead<F, Fut>(
        mut self,
        cancel: CancellationToken,
        leading: Arc<std::sync::atomic::AtomicBool>,
        work: F,
    ) -> Result<(), LeaderError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let lease = format!("{}/{}", self.settings.namespace, self.settings.lease_name);
        loop {
            match self.attempt().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => tracing::warn!(%lease, %error, "could not read or write the leader lease"),
            }
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                () = tokio::time::sleep(self.settings.renew_every) => {}
            }
        }
        tracing::info!(%lease, identity = %self.settings.identity, "leading: the controllers start");
        leading.store(true, std::sync::atomic::Ordering::Relaxed);
        let stop = cancel.child_token();
        let mut running = tokio::spawn(work(stop.clone()));
        let mut finished = false;
        let mut renewed = Instant::now();
        let outcome = loop {
            tokio::select! {
                () = cancel.cancelled() => break Ok(()),
                _ = &mut running => {
                    finished = true;
                    break Ok(());
                }
                () = tokio::time::sleep(self.settings.renew_every) => {}
            }
            match self.attempt().await {
                Ok(true) => renewed = Instant::now(),
                Ok(false) => break Err("another replica holds it".to_owned()),
                Err(error) if renewed.elapsed() >= self.settings.renew_deadline => {
                    break Err(format!("not renewed for {:?}: {error}", self.settings.renew_deadline));
                }
                Err(error) => tracing::warn!(%lease, %error, "could not renew the leader lease; trying again"),
            }
        };
        stop.cancel();
        if !finished {
            if outcome.is_ok() {
                // Shutting down: nobody takes over before the release below.
                let _ = running.await;
            } else {
                // Lost: a candidate may take the Lease once the record has been still
                // for lease_duration; the controllers must be gone by then.
                let grace = self.settings.lease_duration.saturating_sub(self.settings.renew_deadline) / 2;
                if tokio::time::timeout(grace, &mut running).await.is_err() {
                    running.abort();
                    let _ = running.await;
                }
            }
        }
        leading.store(false, std::sync::atomic::Ordering::Relaxed);
        match outcome {
            Ok(()) => {
                if let Err(error) = self.release().await {
                    tracing::warn!(%lease, %error, "could not release the leader lease; it expires on its own");
                }
                tracing::info!(%lease, "the controllers stopped; the lease is released");
                Ok(())
            }
            Err(why) => Err(LeaderError::Lost { lease, why }),
        }
    }
}

fn conflict_is_false(result: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// This replica's identity: the pod's name (or the host's) and a per-process part,
/// so a restarted container is a new candidate.
pub fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_else(|| "gitops-appstudio".to_owned());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!("{host}_{:x}{nanos:08x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: &str, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(renewed.parse().expect("a time"))),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn a_record_expires_only_after_it_stopped_changing_for_the_duration() {
        let mut observed = Observed::default();
        let start = Instant::now();
        let duration = Duration::from_secs(15);
        let first = spec("a", "2026-01-01T00:00:00Z", 0);
        assert!(!observed.expired(&first, duration, start), "just seen");
        assert!(!observed.expired(&first, duration, start + Duration::from_secs(14)));
        // Renewed: the clock starts again, whatever the renew time says.
        let renewed = spec("a", "2020-01-01T00:00:00Z", 0);
        assert!(!observed.expired(&renewed, duration, start + Duration::from_secs(14)));
        assert!(!observed.expired(&renewed, duration, start + Duration::from_secs(28)));
        assert!(observed.expired(&renewed, duration, start + Duration::from_secs(29)));
        let taken = spec("b", "2020-01-01T00:00:00Z", 1);
        assert!(!observed.expired(&taken, duration, start + Duration::from_secs(30)));
    }

    #[test]
    fn identities_differ_per_process_start() {
        let id = identity();
        assert!(id.contains('_'), "{id}");
        assert!(!id.starts_with('_'), "{id}");
    }
}
