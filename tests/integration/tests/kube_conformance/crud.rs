//! Create, get, update, list and delete: the fields the server fills in on create,
//! `generateName`, optimistic concurrency, the errors as `Status` objects, label and
//! field selectors, and paging with `limit`/`continue` over one consistent snapshot.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{BEACON, Env, GADGET, GROUP, generation, names, random_name, refused_with, resource_version};

#[tokio::test]
async fn create_fills_in_uid_timestamps_version_and_generation() {
    let env = Env::new("crud-create").await;
    let gadgets = env.api(GADGET);
    let created =
        gadgets.create(&PostParams::default(), &GADGET.object("g1", json!({"spec": {"size": 1}}))).await.unwrap();
    let meta = &created.metadata;
    assert!(!meta.uid.as_deref().unwrap_or_default().is_empty(), "uid: {meta:?}");
    assert!(meta.creation_timestamp.is_some(), "creationTimestamp: {meta:?}");
    assert!(!resource_version(&created).is_empty());
    assert_eq!(meta.generation, Some(1), "a new custom resource is generation 1");
    assert_eq!(meta.namespace.as_deref(), Some(env.ns()));
    assert!(meta.deletion_timestamp.is_none());

    let read = gadgets.get("g1").await.unwrap();
    assert_eq!(
        (read.metadata.uid.clone(), read.metadata.resource_version.clone()),
        (meta.uid.clone(), meta.resource_version.clone())
    );
    assert_eq!(read.data["spec"]["size"], 1);

    // Built-in kinds without a spec have no generation.
    let config_maps = env.namespaced::<ConfigMap>();
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some("cm".into()), ..Default::default() },
        ..Default::default()
    };
    let cm = config_maps.create(&PostParams::default(), &cm).await.unwrap();
    assert!(
        cm.metadata.uid.is_some() && cm.metadata.resource_version.is_some() && cm.metadata.creation_timestamp.is_some()
    );
    assert_eq!(cm.metadata.generation, None, "a ConfigMap has no generation");
}

#[tokio::test]
async fn generate_name_appends_five_random_characters() {
    let env = Env::new("crud-generate-name").await;
    let gadgets = env.api(GADGET);
    let mut template = GADGET.object("", json!({"spec": {"size": 1}}));
    template.metadata.name = None;
    template.metadata.generate_name = Some("gen-".into());
    let first = gadgets.create(&PostParams::default(), &template).await.unwrap();
    let second = gadgets.create(&PostParams::default(), &template).await.unwrap();
    for object in [&first, &second] {
        let name = object.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("gen-") && name.len() == "gen-".len() + 5, "generated name {name}");
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
        assert_eq!(object.metadata.generate_name.as_deref(), Some("gen-"));
    }
    assert_ne!(first.metadata.name, second.metadata.name);

    // Neither name nor generateName: 422 Invalid on metadata.name.
    template.metadata.generate_name = None;
    let status = refused_with(gadgets.create(&PostParams::default(), &template).await, 422, "Invalid");
    let causes = status.details.map(|d| d.causes).unwrap_or_default();
    assert!(causes.iter().any(|c| c.field == "metadata.name" && c.reason == "FieldValueRequired"), "{causes:?}");
}

#[tokio::test]
async fn missing_existing_and_misplaced_objects_are_refused_with_status_objects() {
    let env = Env::new("crud-errors").await;
    let gadgets = env.api(GADGET);

    let status = refused_with(gadgets.get("absent").await, 404, "NotFound");
    assert_eq!(status.message, format!("gadgets.{GROUP} \"absent\" not found"));
    let details = status.details.expect("details");
    assert_eq!((details.name.as_str(), details.group.as_str(), details.kind.as_str()), ("absent", GROUP, "gadgets"));

    let status = refused_with(env.namespaced::<ConfigMap>().get("absent").await, 404, "NotFound");
    assert_eq!(status.message, "configmaps \"absent\" not found");
    refused_with(gadgets.delete("absent", &DeleteParams::default()).await, 404, "NotFound");
    refused_with(
        gadgets.patch("absent", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 2}}))).await,
        404,
        "NotFound",
    );

    let object = GADGET.object("g1", json!({"spec": {"size": 1}}));
    gadgets.create(&PostParams::default(), &object).await.unwrap();
    let status = refused_with(gadgets.create(&PostParams::default(), &object).await, 409, "AlreadyExists");
    assert_eq!(status.message, format!("gadgets.{GROUP} \"g1\" already exists"));
    assert_eq!(status.details.expect("details").name, "g1");

    // An object whose namespace differs from the request's: 400 BadRequest.
    let mut elsewhere = GADGET.object("g2", json!({"spec": {"size": 1}}));
    elsewhere.metadata.namespace = Some("some-other-namespace".into());
    let status = refused_with(gadgets.create(&PostParams::default(), &elsewhere).await, 400, "BadRequest");
    assert_eq!(status.message, "the namespace of the provided object does not match the namespace sent on the request");
}

#[tokio::test]
async fn update_with_a_stale_resource_version_conflicts() {
    let env = Env::new("crud-conflict").await;
    let gadgets = env.api(GADGET);
    let created =
        gadgets.create(&PostParams::default(), &GADGET.object("g1", json!({"spec": {"size": 1}}))).await.unwrap();

    let mut first = created.clone();
    first.data["spec"]["size"] = json!(2);
    let updated = gadgets.replace("g1", &PostParams::default(), &first).await.unwrap();
    assert_ne!(resource_version(&updated), resource_version(&created));
    assert_eq!(generation(&updated), 2);

    let mut stale = created.clone();
    stale.data["spec"]["size"] = json!(3);
    let status = refused_with(gadgets.replace("g1", &PostParams::default(), &stale).await, 409, "Conflict");
    assert_eq!(
        status.message,
        format!(
            "Operation cannot be fulfilled on gadgets.{GROUP} \"g1\": the object has been modified; please apply your \
             changes to the latest version and try again"
        )
    );
    assert_eq!(gadgets.get("g1").await.unwrap().data["spec"]["size"], 2, "the stale write changed nothing");

    // A custom resource cannot be updated without a resourceVersion…
    let mut unversioned = updated.clone();
    unversioned.metadata.resource_version = None;
    let status = refused_with(gadgets.replace("g1", &PostParams::default(), &unversioned).await, 422, "Invalid");
    let causes = status.details.map(|d| d.causes).unwrap_or_default();
    assert!(causes.iter().any(|c| c.field == "metadata.resourceVersion"), "{causes:?}");

    // …while a ConfigMap may be (an unconditional update), but not created by an update.
    let config_maps = env.namespaced::<ConfigMap>();
    let mut cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"a": "1"}})).unwrap();
    config_maps.create(&PostParams::default(), &cm).await.unwrap();
    cm.data = Some([("a".to_owned(), "2".to_owned())].into());
    let replaced = config_maps.replace("cm", &PostParams::default(), &cm).await.unwrap();
    assert_eq!(replaced.data.unwrap()["a"], "2");
    cm.metadata.name = Some("absent".into());
    refused_with(config_maps.replace("absent", &PostParams::default(), &cm).await, 404, "NotFound");
}

#[tokio::test]
async fn list_filters_by_label_and_field_selectors() {
    let env = Env::new("crud-selectors").await;
    let gadgets = env.api(GADGET);
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "web", "tier": "back"})),
        ("c", json!({"app": "db"})),
        ("d", json!({})),
    ] {
        let object = GADGET.object(name, json!({"metadata": {"labels": labels}, "spec": {"size": 1}}));
        gadgets.create(&PostParams::default(), &object).await.unwrap();
    }
    let cases = [
        (ListParams::default(), vec!["a", "b", "c", "d"]),
        (ListParams::default().labels("app=web"), vec!["a", "b"]),
        (ListParams::default().labels("app==web"), vec!["a", "b"]),
        (ListParams::default().labels("app!=web"), vec!["c", "d"]),
        (ListParams::default().labels("app in (web,db)"), vec!["a", "b", "c"]),
        (ListParams::default().labels("app notin (web)"), vec!["c", "d"]),
        (ListParams::default().labels("tier"), vec!["a", "b"]),
        (ListParams::default().labels("!tier"), vec!["c", "d"]),
        (ListParams::default().labels("app=web,tier=back"), vec!["b"]),
        (ListParams::default().labels("app=nothing"), vec![]),
        (ListParams::default().fields("metadata.name=c"), vec!["c"]),
        (ListParams::default().fields("metadata.name!=c"), vec!["a", "b", "d"]),
        (ListParams::default().fields(&format!("metadata.namespace={}", env.ns())), vec!["a", "b", "c", "d"]),
        (ListParams::default().fields("metadata.name=a").labels("app=web"), vec!["a"]),
        (ListParams::default().fields("metadata.name=c").labels("app=web"), vec![]),
    ];
    for (params, expected) in cases {
        let listed = gadgets.list(&params).await.unwrap();
        assert_eq!(names(&listed.items), expected, "list with {params:?}");
    }

    // Across namespaces, the metadata.namespace field selector picks this test's objects.
    let all = kube::Api::<kube::api::DynamicObject>::all_with(env.client.clone(), &GADGET.resource());
    let mine = all.list(&ListParams::default().fields(&format!("metadata.namespace={}", env.ns()))).await.unwrap();
    assert_eq!(names(&mine.items), ["a", "b", "c", "d"]);
    assert!(mine.items.iter().all(|o| o.metadata.namespace.as_deref() == Some(env.ns())));

    // A field the kind does not index: 400 BadRequest.
    let status = refused_with(gadgets.list(&ListParams::default().fields("spec.size=1")).await, 400, "BadRequest");
    assert_eq!(status.message, "field label not supported: spec.size");
}

#[tokio::test]
async fn list_pages_with_limit_and_continue_over_one_snapshot() {
    let env = Env::new("crud-paging").await;
    let gadgets = env.api(GADGET);
    for i in 0..5 {
        gadgets
            .create(&PostParams::default(), &GADGET.object(&format!("p{i}"), json!({"spec": {"size": i}})))
            .await
            .unwrap();
    }
    let first = gadgets.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first.items), ["p0", "p1"], "a page holds the first objects by name");
    let token = first.metadata.continue_.clone().filter(|t| !t.is_empty()).expect("a continue token");
    assert_eq!(first.metadata.remaining_item_count, Some(3));

    // Changes after the first page do not show in the following pages.
    gadgets.create(&PostParams::default(), &GADGET.object("p5", json!({"spec": {"size": 5}}))).await.unwrap();
    gadgets.delete("p3", &DeleteParams::default()).await.unwrap();
    gadgets.patch("p4", &PatchParams::default(), &Patch::Merge(json!({"spec": {"size": 40}}))).await.unwrap();

    // What is left is counted in the snapshot too: p3 and p4, not p5.
    let next = gadgets.list(&ListParams::default().limit(1).continue_token(&token)).await.unwrap();
    assert_eq!(names(&next.items), ["p2"]);
    assert_eq!(next.metadata.remaining_item_count, Some(2), "counted at the snapshot's version");

    let rest = gadgets.list(&ListParams::default().limit(10).continue_token(&token)).await.unwrap();
    assert_eq!(names(&rest.items), ["p2", "p3", "p4"]);
    assert_eq!(rest.items[2].data["spec"]["size"], 4, "the page shows the snapshot's version");
    assert!(rest.metadata.continue_.as_deref().unwrap_or_default().is_empty(), "the last page has no continue token");
    assert_eq!(rest.metadata.resource_version, first.metadata.resource_version, "pages share the snapshot's version");

    let now = gadgets.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&now.items), ["p0", "p1", "p2", "p4", "p5"]);
    assert_eq!(now.items[3].data["spec"]["size"], 40);

    // Paging one object at a time visits each exactly once.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(1);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = gadgets.list(&params).await.unwrap();
        assert!(page.items.len() <= 1);
        seen.extend(names(&page.items));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
        assert_eq!(page.metadata.remaining_item_count, Some(5 - seen.len() as i64), "after {seen:?}");
    }
    assert_eq!(seen, ["p0", "p1", "p2", "p4", "p5"]);
}

#[tokio::test]
async fn cluster_scoped_objects_are_served_without_a_namespace() {
    let env = Env::new("crud-cluster-scoped").await;
    let beacons = env.api(BEACON);
    let name = random_name("beacon");
    let created =
        beacons.create(&PostParams::default(), &BEACON.object(&name, json!({"spec": {"size": 1}}))).await.unwrap();
    assert_eq!(created.metadata.namespace, None);
    assert_eq!(generation(&created), 1);
    let listed = beacons.list(&ListParams::default().fields(&format!("metadata.name={name}"))).await.unwrap();
    assert_eq!(names(&listed.items), [name.as_str()]);
    beacons.delete(&name, &DeleteParams::default()).await.unwrap();
    let status = refused_with(beacons.get(&name).await, 404, "NotFound");
    assert_eq!(status.message, format!("beacons.{GROUP} \"{name}\" not found"));
}
