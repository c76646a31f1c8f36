//! The writer's events on a tenant object, against the test tier's API server: a
//! transition repeated on the same object with the same note becomes a series on
//! its first event, a different note or transition is an event of its own, and a
//! series whose event was deleted starts again with a new one.

use gitops_writer::events::{TenantEvents, Transition};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

async fn events_about(events: &Api<Event>, name: &str) -> Vec<Event> {
    let list = events.list(&ListParams::default()).await.expect("list events");
    let mut about: Vec<Event> =
        list.items.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)).collect();
    about.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    about
}

fn stalled(note: &str) -> Transition {
    Transition { warning: true, reason: "Stalled".into(), action: "Apply", note: note.into() }
}

fn count_of(event: &Event) -> i32 {
    event.series.as_ref().map_or(1, |s| s.count)
}

#[tokio::test]
async fn writer_events_repeat_as_a_series_and_start_again_when_their_event_is_gone() {
    let cluster = gitops_testkit::cluster::TestCluster::get().await;
    let ns = cluster.namespace("wr-events").await;
    let kube = cluster.admin().await;
    let objects: Api<ConfigMap> = Api::namespaced(kube.clone(), ns.name());
    let mut object = ConfigMap::default();
    object.metadata.name = Some("subject".into());
    let object = objects.create(&PostParams::default(), &object).await.expect("create the subject");
    let events: Api<Event> = Api::namespaced(kube.clone(), ns.name());
    let publisher = TenantEvents::new(kube.clone(), "writer-under-test");

    publisher.publish(&object, stalled("stuck")).await;
    publisher.publish(&object, stalled("stuck")).await;
    publisher.publish(&object, stalled("stuck elsewhere")).await;
    publisher
        .publish(&object, Transition { warning: false, reason: "Accepted".into(), action: "Store", note: "ok".into() })
        .await;
    let about = events_about(&events, "subject").await;
    assert_eq!(about.len(), 3, "a series, another note and another reason: {about:?}");
    let note_of = |note: &str| about.iter().find(|e| e.note.as_deref() == Some(note)).cloned();
    let series = note_of("stuck").expect("the repeated event");
    assert_eq!(count_of(&series), 2, "{series:?}");
    assert_eq!(series.reason.as_deref(), Some("Stalled"));
    assert_eq!(series.type_.as_deref(), Some("Warning"));
    assert_eq!(series.reporting_controller.as_deref(), Some("gitops-service-writer"));
    assert_eq!(series.reporting_instance.as_deref(), Some("writer-under-test"));
    assert_eq!(
        series.regarding.as_ref().and_then(|r| r.uid.as_deref()),
        object.metadata.uid.as_deref(),
        "the event names the object by its UID"
    );
    assert_eq!(count_of(&note_of("stuck elsewhere").expect("the other note")), 1);
    let accepted = note_of("ok").expect("the Accepted event");
    assert_eq!((count_of(&accepted), accepted.type_.as_deref()), (1, Some("Normal")));

    // The series' event is deleted (expired, or by hand): the next repeat makes a new one.
    let series_name = series.metadata.name.clone().expect("a name");
    events.delete(&series_name, &DeleteParams::default()).await.expect("delete the series' event");
    publisher.publish(&object, stalled("stuck")).await;
    let about = events_about(&events, "subject").await;
    let again: Vec<&Event> = about.iter().filter(|e| e.note.as_deref() == Some("stuck")).collect();
    assert_eq!(again.len(), 1, "{about:?}");
    assert_ne!(again[0].metadata.name.as_ref(), Some(&series_name), "a new event");
    assert_eq!(count_of(again[0]), 1);
    publisher.publish(&object, stalled("stuck")).await;
    let about = events_about(&events, "subject").await;
    let again = about.iter().find(|e| e.note.as_deref() == Some("stuck")).expect("the new event");
    assert_eq!(count_of(again), 2, "the new event grows its own series");
}
