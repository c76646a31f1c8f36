//! Watch: where a watch starts for a given resourceVersion, selectors (an object that
//! stops matching is reported DELETED), resuming after a disconnect from the last seen
//! resourceVersion without gaps or repeats, bookmarks only when asked for, and the
//! 410 Expired event for a resourceVersion that is too old. Informers and controllers
//! (kube::runtime::watcher) depend on each of these.

use futures_util::{StreamExt, TryStreamExt};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::core::WatchEvent;
use serde_json::json;

use kube::ResourceExt;

use super::{Env, GADGET, event_object, next_change, next_event, resource_version, summary};
use crate::support::DEADLINE;

fn gadget(name: &str, labels: serde_json::Value) -> DynamicObject {
    GADGET.object(name, json!({"metadata": {"labels": labels}, "spec": {"size": 1}}))
}

#[tokio::test]
async fn a_watch_from_a_list_version_sees_only_later_changes_in_order() {
    let env = Env::new("watch-from-list").await;
    let gadgets = env.api(GADGET);
    gadgets.create(&PostParams::default(), &gadget("before", json!({}))).await.unwrap();
    let list = gadgets.list(&ListParams::default()).await.unwrap();
    let version = list.metadata.resource_version.expect("a list resourceVersion");
    let mut events = gadgets.watch(&WatchParams::default(), &version).await.unwrap().boxed();

    let created = gadgets.create(&PostParams::default(), &gadget("a", json!({}))).await.unwrap();
    let patched =
        gadgets.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}}))).await.unwrap();
    gadgets.delete("a", &DeleteParams::default()).await.unwrap();
    gadgets.create(&PostParams::default(), &gadget("b", json!({}))).await.unwrap();

    let added = next_change(&mut events).await;
    assert_eq!(summary(&added), ("ADDED", "a".into()), "the object that existed before is not replayed");
    let added = event_object(added);
    assert_eq!(resource_version(&added), resource_version(&created));

    let modified = next_change(&mut events).await;
    assert_eq!(summary(&modified), ("MODIFIED", "a".into()));
    let modified = event_object(modified);
    assert_eq!(resource_version(&modified), resource_version(&patched));
    assert_eq!((modified.data["spec"]["size"].clone(), modified.metadata.generation), (json!(2), Some(2)));

    let deleted = next_change(&mut events).await;
    assert_eq!(summary(&deleted), ("DELETED", "a".into()));
    let deleted = event_object(deleted);
    assert_eq!(deleted.data["spec"]["size"], 2, "DELETED carries the last state");
    assert_ne!(resource_version(&deleted), resource_version(&patched), "a deletion has a version of its own");

    assert_eq!(summary(&next_change(&mut events).await), ("ADDED", "b".into()));
}

#[tokio::test]
async fn a_watch_from_version_zero_starts_with_the_current_objects() {
    let env = Env::new("watch-from-zero").await;
    let gadgets = env.api(GADGET);
    for name in ["a", "b"] {
        gadgets.create(&PostParams::default(), &gadget(name, json!({}))).await.unwrap();
    }
    let mut events = gadgets.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let mut initial = vec![summary(&next_change(&mut events).await), summary(&next_change(&mut events).await)];
    initial.sort();
    assert_eq!(initial, [("ADDED", "a".into()), ("ADDED", "b".into())]);
    gadgets.create(&PostParams::default(), &gadget("c", json!({}))).await.unwrap();
    assert_eq!(summary(&next_change(&mut events).await), ("ADDED", "c".into()));
}

#[tokio::test]
async fn a_watch_with_selectors_reports_objects_entering_and_leaving_them() {
    let env = Env::new("watch-selectors").await;
    let gadgets = env.api(GADGET);
    let version = gadgets.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut web = gadgets.watch(&WatchParams::default().labels("app=web"), &version).await.unwrap().boxed();
    let mut named = gadgets.watch(&WatchParams::default().fields("metadata.name=b"), &version).await.unwrap().boxed();

    gadgets.create(&PostParams::default(), &gadget("a", json!({"app": "web"}))).await.unwrap();
    gadgets.create(&PostParams::default(), &gadget("b", json!({"app": "db"}))).await.unwrap();
    let relabel = |app: &str| Patch::Merge(json!({"metadata": {"labels": {"app": app}}}));
    let moved_out = gadgets.patch("a", &PatchParams::default(), &relabel("db")).await.unwrap();
    gadgets.patch("a", &PatchParams::default(), &relabel("web")).await.unwrap();
    gadgets.patch("b", &PatchParams::default(), &relabel("web")).await.unwrap();
    gadgets.create(&PostParams::default(), &gadget("marker", json!({"app": "web"}))).await.unwrap();

    assert_eq!(summary(&next_change(&mut web).await), ("ADDED", "a".into()));
    let left = next_change(&mut web).await;
    assert_eq!(summary(&left), ("DELETED", "a".into()), "an object that stops matching is reported DELETED");
    let left = event_object(left);
    assert_eq!(left.labels()["app"], "web", "…with its previous content…");
    assert_eq!(resource_version(&left), resource_version(&moved_out), "…at the version of the change");
    assert_eq!(summary(&next_change(&mut web).await), ("ADDED", "a".into()), "and ADDED when it matches again");
    assert_eq!(summary(&next_change(&mut web).await), ("ADDED", "b".into()));
    assert_eq!(summary(&next_change(&mut web).await), ("ADDED", "marker".into()), "nothing else in between");

    assert_eq!(summary(&next_change(&mut named).await), ("ADDED", "b".into()));
    assert_eq!(summary(&next_change(&mut named).await), ("MODIFIED", "b".into()));
}

#[tokio::test]
async fn a_watch_resumes_after_a_disconnect_without_gaps_or_repeats() {
    let env = Env::new("watch-resume").await;
    let gadgets = env.api(GADGET);
    let version = gadgets.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();

    // The server ends this watch after its timeout: a disconnect the client did not choose.
    let params = WatchParams::default().timeout(2).disable_bookmarks();
    let mut first = gadgets.watch(&params, &version).await.unwrap().boxed();
    gadgets.create(&PostParams::default(), &gadget("a", json!({}))).await.unwrap();
    gadgets.create(&PostParams::default(), &gadget("b", json!({}))).await.unwrap();
    assert_eq!(summary(&next_event(&mut first).await), ("ADDED", "a".into()));
    let last = event_object(next_event(&mut first).await);
    assert_eq!(last.metadata.name.as_deref(), Some("b"));
    let rest: Vec<_> =
        tokio::time::timeout(DEADLINE, first.try_collect::<Vec<_>>()).await.expect("the watch ends").unwrap();
    assert!(rest.is_empty(), "no more events: {rest:?}");

    // Changes while no one watches.
    gadgets.patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}}))).await.unwrap();
    gadgets.delete("b", &DeleteParams::default()).await.unwrap();
    gadgets.create(&PostParams::default(), &gadget("c", json!({}))).await.unwrap();

    let mut resumed = gadgets.watch(&WatchParams::default(), &resource_version(&last)).await.unwrap().boxed();
    gadgets.create(&PostParams::default(), &gadget("marker", json!({}))).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(summary(&next_change(&mut resumed).await));
    }
    assert_eq!(
        seen,
        [("MODIFIED", "a".into()), ("DELETED", "b".into()), ("ADDED", "c".into()), ("ADDED", "marker".into())]
    );
}

#[tokio::test]
async fn bookmarks_come_only_when_asked_for_and_are_valid_resume_points() {
    let env = Env::new("watch-bookmarks").await;
    let gadgets = env.api(GADGET);
    let version = gadgets.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();

    // A real API server sends a bookmark shortly before a watch's timeout, once the
    // resource changed after the watch's starting version.
    let with = gadgets.watch(&WatchParams::default().timeout(4), &version).await.unwrap();
    let without = gadgets.watch(&WatchParams::default().timeout(4).disable_bookmarks(), &version).await.unwrap();
    let created = gadgets.create(&PostParams::default(), &gadget("a", json!({}))).await.unwrap();
    let (with, without) = tokio::time::timeout(DEADLINE, async {
        futures_util::join!(with.try_collect::<Vec<_>>(), without.try_collect::<Vec<_>>())
    })
    .await
    .expect("both watches end at their timeout");
    let (with, without) = (with.unwrap(), without.unwrap());

    assert_eq!(without.iter().map(summary).collect::<Vec<_>>(), [("ADDED", "a".into())], "no unasked-for bookmarks");
    assert_eq!(with.first().map(summary), Some(("ADDED", "a".into())));
    let bookmark = with
        .iter()
        .find_map(|e| match e {
            WatchEvent::Bookmark(b) => Some(b.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a bookmark before a 4s watch ends: {with:?}"));
    assert_eq!((bookmark.types.api_version.as_str(), bookmark.types.kind.as_str()), (super::API_VERSION, "Gadget"));
    assert!(!bookmark.metadata.resource_version.is_empty());
    assert_ne!(bookmark.metadata.resource_version, version, "the bookmark moved past the start");

    // A bookmark's version is past every event already delivered: resuming there
    // replays nothing.
    let mut resumed =
        gadgets.watch(&WatchParams::default(), &bookmark.metadata.resource_version).await.unwrap().boxed();
    gadgets.create(&PostParams::default(), &gadget("b", json!({}))).await.unwrap();
    let next = next_change(&mut resumed).await;
    assert_eq!(summary(&next), ("ADDED", "b".into()), "after the bookmark of {created:?}");
}

#[tokio::test]
async fn a_watch_from_a_version_that_is_too_old_gets_410_expired() {
    let env = Env::new("watch-gone").await;
    let gadgets = env.api(GADGET);
    gadgets.create(&PostParams::default(), &gadget("a", json!({}))).await.unwrap();
    // The server answers 200 and then one ERROR event carrying the Status.
    let mut events = gadgets.watch(&WatchParams::default(), "1").await.unwrap().boxed();
    match next_event(&mut events).await {
        WatchEvent::Error(status) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"), "{status:?}");
            assert!(status.message.starts_with("too old resource version: 1"), "{status:?}");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}
