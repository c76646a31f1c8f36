//! The authentication and authorization steps every request passes, in
//! kube-apiserver's order: bearer token → identity (`auth::TokenBook`; no token
//! is `system:anonymous`, a bad one is 401), then RBAC (`rbac::authorize`,
//! reading the Role/Binding objects of the store) → 403 with the real message.

use serde_json::{Value, json};

use super::auth::{Authn, Identity, TokenBook};
use super::errors::ApiError;
use super::rbac::{self, Attributes, RbacObjects};
use super::resources::RBAC_GROUP;
use super::store::State;

/// The identity behind an `Authorization` header.
pub fn authenticate(book: &TokenBook, header: Option<&str>, state: &State) -> Result<Identity, ApiError> {
    let bearer = super::auth::bearer_token(header);
    let sa_exists = |namespace: &str, name: &str, uid: &str| {
        state.get("/serviceaccounts", namespace, name).is_some_and(|sa| super::meta::uid(&sa) == uid)
    };
    match book.authenticate(bearer, &sa_exists) {
        Authn::Anonymous => Ok(Identity::anonymous()),
        Authn::User(identity) => Ok(identity),
        Authn::Invalid => Err(ApiError::unauthorized()),
    }
}

/// The RBAC objects of the store, for [`rbac::decide`].
pub struct StoreRbac<'a>(pub &'a State);

impl RbacObjects for StoreRbac<'_> {
    fn cluster_roles(&self) -> Vec<Value> {
        self.0.values(&format!("{RBAC_GROUP}/clusterroles"), None)
    }
    fn cluster_role_bindings(&self) -> Vec<Value> {
        self.0.values(&format!("{RBAC_GROUP}/clusterrolebindings"), None)
    }
    fn roles(&self, namespace: &str) -> Vec<Value> {
        self.0.values(&format!("{RBAC_GROUP}/roles"), Some(namespace))
    }
    fn role_bindings(&self, namespace: &str) -> Vec<Value> {
        self.0.values(&format!("{RBAC_GROUP}/rolebindings"), Some(namespace))
    }
}

/// What is asked of a resource, for authorization and its error message.
pub struct ResourceAsk<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub plural: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

pub fn authorize_resource(state: &State, who: &Identity, ask: &ResourceAsk) -> Result<(), ApiError> {
    if who.is_master() {
        return Ok(());
    }
    let attrs = Attributes {
        verb: ask.verb,
        api_group: ask.group,
        resource: ask.plural,
        subresource: ask.subresource,
        namespace: ask.namespace.filter(|ns| !ns.is_empty()),
        name: ask.name.filter(|n| !n.is_empty()),
        non_resource_path: None,
    };
    let decision = rbac::decide(&StoreRbac(state), who, &attrs);
    if decision.allowed {
        return Ok(());
    }
    let message = rbac::forbidden_message_with_reason(who, &attrs, &decision.reason);
    let mut details = serde_json::Map::new();
    if let Some(name) = attrs.name {
        details.insert("name".into(), json!(name));
    }
    if !ask.group.is_empty() {
        details.insert("group".into(), json!(ask.group));
    }
    details.insert("kind".into(), json!(ask.plural));
    Err(ApiError::forbidden(message, Value::Object(details)))
}

pub fn authorize_path(state: &State, who: &Identity, verb: &str, path: &str) -> Result<(), ApiError> {
    if who.is_master() {
        return Ok(());
    }
    let attrs = Attributes {
        verb,
        api_group: "",
        resource: "",
        subresource: None,
        namespace: None,
        name: None,
        non_resource_path: Some(path),
    };
    let decision = rbac::decide(&StoreRbac(state), who, &attrs);
    if decision.allowed {
        return Ok(());
    }
    Err(ApiError::forbidden(rbac::forbidden_message_with_reason(who, &attrs, &decision.reason), json!({})))
}
