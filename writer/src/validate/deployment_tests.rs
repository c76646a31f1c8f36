//! Unit tests of the GitOpsDeployment rules: every rule and refusal reason.

use super::*;
use crate::api::{DeploymentDestination, DeploymentSource, SyncPolicy};
use crate::validate::reason::*;

fn spec() -> GitOpsDeploymentSpec {
    GitOpsDeploymentSpec {
        source: DeploymentSource {
            repo_url: "https://git.example.invalid/team/repo.git".into(),
            path: "apps/web".into(),
            target_revision: None,
        },
        destination: DeploymentDestination::default(),
        type_: "automated".into(),
        sync_policy: None,
        project: None,
    }
}

fn refused(change: impl FnOnce(&mut GitOpsDeploymentSpec)) -> Invalid {
    let mut s = spec();
    change(&mut s);
    deployment(&s).expect_err("refused")
}

#[test]
fn a_minimal_deployment_gets_defaults() {
    let valid = deployment(&spec()).expect("valid");
    assert_eq!(valid.target_revision, "HEAD");
    assert_eq!(valid.environment, None);
    assert_eq!(valid.destination_namespace, None);
    assert_eq!(valid.sync_type, SyncType::Automated);
    assert!(!valid.create_namespace);
    let intent = valid.into_intent(Uuid::nil(), "web".into(), 3, None, "tenant-a", false);
    assert_eq!(intent.destination_namespace, "tenant-a");
    assert_eq!(intent.generation, 3);
}

#[test]
fn a_full_deployment_is_kept_as_given() {
    let mut s = spec();
    s.source.target_revision = Some("release-1.2".into());
    s.destination = DeploymentDestination {
        environment: Some("staging".into()),
        namespace: Some("web".into()),
        ..Default::default()
    };
    s.type_ = "manual".into();
    s.sync_policy = Some(SyncPolicy { sync_options: vec!["CreateNamespace=true".into()] });
    let valid = deployment(&s).expect("valid");
    assert_eq!(valid.environment.as_deref(), Some("staging"));
    assert_eq!(valid.destination_namespace.as_deref(), Some("web"));
    assert_eq!(valid.sync_type, SyncType::Manual);
    assert!(valid.create_namespace);
    assert_eq!(valid.target_revision, "release-1.2");
}

#[test]
fn sql_and_shell_metacharacters_are_plain_text() {
    let mut s = spec();
    s.source.path = "apps/it's; rm -rf $(x)".into();
    s.source.repo_url = "https://git.example.invalid/o'brien/repo';DROP/**/TABLE/**/application;--.git".into();
    s.source.target_revision = Some("feat/it's-$(whoami)`id`|&;".into());
    let valid = deployment(&s).expect("valid");
    assert_eq!(valid.path, "apps/it's; rm -rf $(x)");
    assert_eq!(valid.repo_url, s.source.repo_url);
    assert_eq!(valid.target_revision, "feat/it's-$(whoami)`id`|&;");
    assert!(path("p", "a/\"quoted\" dir/*?/%s/\\x").is_ok());
}

#[test]
fn paths() {
    for good in [".", "./apps", "apps/web/", "a..b/c", "apps/..hidden", "a/./b"] {
        assert_eq!(path("p", good), Ok(good.to_owned()), "{good}");
    }
    for bad in ["/", "//", "/etc", "\\etc", "..", "../x", "a/../../b", "a/..", "a\\..\\b"] {
        assert_eq!(path("p", bad).unwrap_err().reason, INVALID_PATH, "{bad}");
    }
    assert_eq!(refused(|s| s.source.path = String::new()).reason, FIELD_REQUIRED);
    assert_eq!(refused(|s| s.source.path = "/".into()).reason, INVALID_PATH);
    assert_eq!(refused(|s| s.source.path = "../other-tenant".into()).reason, INVALID_PATH);
    assert_eq!(refused(|s| s.source.path = "a".repeat(limits::PATH + 1)).reason, FIELD_TOO_LONG);
    assert_eq!(refused(|s| s.source.path = "apps\0web".into()).reason, INVALID_CHARACTERS);
    assert_eq!(refused(|s| s.source.path = "apps\nweb".into()).reason, INVALID_CHARACTERS);
}

#[test]
fn revisions() {
    assert_eq!(target_revision("r", None), Ok("HEAD".to_owned()));
    assert_eq!(target_revision("r", Some("")), Ok("HEAD".to_owned()));
    assert_eq!(target_revision("r", Some("0123abcd")), Ok("0123abcd".to_owned()));
    assert_eq!(target_revision("r", Some("--upload-pack=x")).unwrap_err().reason, INVALID_TARGET_REVISION);
    assert_eq!(target_revision("r", Some("a b")).unwrap_err().reason, INVALID_TARGET_REVISION);
    assert_eq!(target_revision("r", Some(&"a".repeat(256))).unwrap_err().reason, FIELD_TOO_LONG);
    assert_eq!(target_revision("r", Some("main\u{1}")).unwrap_err().reason, INVALID_CHARACTERS);
}

#[test]
fn bad_repository_urls_are_refused() {
    assert_eq!(refused(|s| s.source.repo_url = "http://git.example.invalid/x".into()).reason, INVALID_REPOSITORY_URL);
    assert_eq!(refused(|s| s.source.repo_url = String::new()).reason, FIELD_REQUIRED);
    assert_eq!(refused(|s| s.source.repo_url = "https://h/x\0".into()).reason, INVALID_CHARACTERS);
}

#[test]
fn destinations() {
    let env = |name: &str| refused(|s| s.destination.environment = Some(name.into())).reason;
    assert_eq!(env("Staging"), INVALID_ENVIRONMENT_NAME);
    assert_eq!(env("../x"), INVALID_ENVIRONMENT_NAME);
    assert_eq!(env(&"a".repeat(254)), FIELD_TOO_LONG);
    assert_eq!(env("a\u{7}"), INVALID_CHARACTERS);
    let ns = |name: &str| refused(|s| s.destination.namespace = Some(name.into())).reason;
    assert_eq!(ns("kube_system"), INVALID_DESTINATION_NAMESPACE);
    assert_eq!(ns("a.b"), INVALID_DESTINATION_NAMESPACE);
    assert_eq!(ns(&"a".repeat(64)), FIELD_TOO_LONG);
    assert_eq!(ns("x\0"), INVALID_CHARACTERS);
    // Empty strings mean "not set".
    let mut s = spec();
    s.destination = DeploymentDestination {
        environment: Some(String::new()),
        namespace: Some(String::new()),
        ..Default::default()
    };
    let valid = deployment(&s).expect("valid");
    assert_eq!((valid.environment, valid.destination_namespace), (None, None));
}

#[test]
fn types() {
    assert_eq!(refused(|s| s.type_ = "Automated".into()).reason, INVALID_DEPLOYMENT_TYPE);
    assert_eq!(refused(|s| s.type_ = "sometimes".into()).reason, INVALID_DEPLOYMENT_TYPE);
    assert_eq!(refused(|s| s.type_ = String::new()).reason, FIELD_REQUIRED);
    assert_eq!(refused(|s| s.type_ = "a".repeat(17)).reason, FIELD_TOO_LONG);
}

#[test]
fn sync_option_rules() {
    let opts = |list: &[&str]| sync_options("o", &list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    assert_eq!(opts(&[]), Ok(false));
    assert_eq!(opts(&["CreateNamespace=true"]), Ok(true));
    assert_eq!(opts(&["CreateNamespace=false"]), Ok(false));
    assert_eq!(opts(&["CreateNamespace=true", "CreateNamespace=true"]), Ok(true));
    for bad in [
        &["Prune=true"][..],
        &["CreateNamespace=yes"],
        &["createnamespace=true"],
        &["CreateNamespace=true", "CreateNamespace=false"],
    ] {
        assert_eq!(opts(bad).unwrap_err().reason, INVALID_SYNC_OPTION, "{bad:?}");
    }
    assert_eq!(opts(&["CreateNamespace=true"; 9]).unwrap_err().reason, FIELD_TOO_LONG);
    assert_eq!(opts(&["CreateNamespace=true\0"]).unwrap_err().reason, INVALID_CHARACTERS);
    let unknown = refused(|s| s.sync_policy = Some(SyncPolicy { sync_options: vec!["ServerSideApply=true".into()] }));
    assert_eq!(unknown.reason, INVALID_SYNC_OPTION);
    assert!(unknown.message.contains("syncOptions[0]"));
}

#[test]
fn environment_lookup_results() {
    let id = gitops_shared::model::ManagedEnvironmentId(4);
    assert_eq!(environment_resolved("staging", Some(EnvironmentRef { id })), Ok(id));
    assert_eq!(environment_resolved("staging", None).unwrap_err().reason, ENVIRONMENT_NOT_FOUND);
}

#[test]
fn fields_the_service_sets_are_refused_naming_the_field() {
    let project = refused(|s| s.project = Some("default".into()));
    assert_eq!(project.reason, FIELD_SET_BY_SERVICE);
    assert!(project.message.starts_with("spec.project "), "{}", project.message);
    let server = refused(|s| s.destination.server = Some("https://cluster.example.invalid".into()));
    assert!(server.message.starts_with("spec.destination.server "), "{}", server.message);
    let name = refused(|s| s.destination.name = Some("in-cluster".into()));
    assert!(name.message.starts_with("spec.destination.name "), "{}", name.message);
    // Empty counts as absent, as for every optional field.
    let mut empty = spec();
    empty.project = Some(String::new());
    empty.destination.server = Some(String::new());
    assert!(deployment(&empty).is_ok());
}
