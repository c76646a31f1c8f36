//! Leader election among the layer's replicas, on the tier's real Lease API:
//! candidates racing for one Lease never run their work at once; a leader that
//! shuts down hands over at once, one that dies (no release) after the lease
//! duration; a replica that finds the Lease taken from it stops its work.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use gitops_appstudio::leader::{Elector, LeaderError, LeaderSettings};
use gitops_testkit::cluster::TestCluster;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{eventually, short_id};

/// Work that counts how many candidates run it at once, and the most ever.
#[derive(Default)]
struct Work {
    running: AtomicUsize,
    most: AtomicUsize,
}

struct Candidate {
    identity: String,
    cancel: CancellationToken,
    /// Ends the candidate's work as a dying process's ends.
    killed: CancellationToken,
    leading: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<(), LeaderError>>,
}

fn candidate(client: &kube::Client, namespace: &str, lease: &str, identity: &str, work: &Arc<Work>) -> Candidate {
    let mut settings = LeaderSettings::new(namespace.to_owned(), lease.to_owned(), identity.to_owned());
    // Short, with client-go's proportions (a leader gives up renewing well before a
    // candidate may take over).
    settings.lease_duration = Duration::from_secs(6);
    settings.renew_deadline = Duration::from_secs(4);
    settings.renew_every = Duration::from_millis(400);
    let elector = Elector::new(client.clone(), settings);
    let cancel = CancellationToken::new();
    let leading = Arc::new(AtomicBool::new(false));
    let work = work.clone();
    let killed = CancellationToken::new();
    let dies = killed.clone();
    let task = tokio::spawn(elector.lead(cancel.clone(), leading.clone(), move |stop| async move {
        let now = work.running.fetch_add(1, Ordering::SeqCst) + 1;
        work.most.fetch_max(now, Ordering::SeqCst);
        tokio::select! {
            () = stop.cancelled() => {}
            () = dies.cancelled() => {}
        }
        work.running.fetch_sub(1, Ordering::SeqCst);
    }));
    Candidate { identity: identity.to_owned(), cancel, killed, leading, task }
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases.get_opt(name).await.ok().flatten()?.spec?.holder_identity.filter(|h| !h.is_empty())
}

#[tokio::test]
async fn leaders_take_turns_hand_over_and_step_down() {
    let cluster = TestCluster::get().await;
    let namespace = cluster.namespace("as-leader").await;
    let client = cluster.admin().await;
    let lease = format!("appstudio-{}", short_id());
    let leases: Api<Lease> = Api::namespaced(client.clone(), namespace.name());
    let work = Arc::new(Work::default());

    // Four candidates race for a Lease that does not exist yet: one wins.
    let mut candidates: Vec<Candidate> =
        (0..4).map(|i| candidate(&client, namespace.name(), &lease, &format!("replica-{i}"), &work)).collect();
    let first = eventually("a leader", || async {
        let leader = holder(&leases, &lease).await?;
        candidates.iter().position(|c| c.identity == leader && c.leading.load(Ordering::SeqCst))
    })
    .await;
    eventually("its work running", || async { (work.running.load(Ordering::SeqCst) == 1).then_some(()) }).await;
    assert_eq!(candidates.iter().filter(|c| c.leading.load(Ordering::SeqCst)).count(), 1, "one leader");

    // Shut down: it stops its work, releases the Lease, and another takes over
    // without waiting for the lease to run out.
    let leaving = candidates.remove(first);
    leaving.cancel.cancel();
    leaving.task.await.expect("joined").expect("a clean stop");
    assert!(!leaving.leading.load(Ordering::SeqCst));
    let second = eventually("a successor", || async {
        let leader = holder(&leases, &lease).await?;
        candidates.iter().position(|c| c.identity == leader && c.leading.load(Ordering::SeqCst))
    })
    .await;
    let transitions = leases.get(&lease).await.expect("the lease").spec.and_then(|s| s.lease_transitions);
    assert_eq!(transitions, Some(1), "one hand-over");

    // Dies without releasing: the others wait for the record to go stale, then one
    // takes it.
    let dead = candidates.remove(second);
    dead.task.abort();
    let _ = dead.task.await;
    dead.killed.cancel();
    let third = eventually("a successor to the dead leader", || async {
        let leader = holder(&leases, &lease).await?;
        (leader != dead.identity).then_some(())?;
        candidates.iter().position(|c| c.identity == leader && c.leading.load(Ordering::SeqCst))
    })
    .await;

    // The Lease taken from under it (an operator, a partition): it stops its work
    // and says it lost the Lease.
    let patch = json!({"spec": {"holderIdentity": "someone-else", "leaseTransitions": 99}});
    leases.patch(&lease, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("take the lease");
    let deposed = candidates.remove(third);
    let outcome = deposed.task.await.expect("joined");
    assert!(matches!(outcome, Err(LeaderError::Lost { .. })), "{outcome:?}");
    assert!(!deposed.leading.load(Ordering::SeqCst));
    for other in &candidates {
        other.cancel.cancel();
    }
    for other in candidates {
        other.task.await.expect("joined").expect("a clean stop");
    }
    assert_eq!(work.most.load(Ordering::SeqCst), 1, "never two leaders' work at once");
}
