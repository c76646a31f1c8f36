//! From an HTTP request to an API answer: path parsing as kube-apiserver's
//! RequestInfo does it (syntactically, so authorization comes before any lookup),
//! authentication and authorization, then dispatch to discovery or to a verb.
//! Work happens under the store lock; serialization and watch streams after it.
//! A write that validating webhooks must see is prepared under the lock, sent to
//! them without it, and stored under it again if what it was based on is unchanged
//! (else prepared and sent again, as kube-apiserver's update loop does).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::access::{self, ResourceAsk};
use super::admission::{self, Call};
use super::auth::TokenBook;
use super::builtin;
use super::delete::{self, DeleteOptions, Deleted};
use super::discovery;
use super::dry_run;
use super::errors::{ApiError, Cause, success_status};
use super::meta;
use super::openapi;
use super::patch::PatchType;
use super::protobuf;
use super::read::{self, ListPage};
use super::resources::ResourceInfo;
use super::review;
use super::selector::{FieldSelector, Filter, LabelSelector};
use super::store::State;
use super::table;
use super::watch::{self as watch_stream, WatchSpec};
use super::webhook_client;
use super::write::{self, Prepared, Target, Writer, present};

pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What every connection shares.
pub struct Shared {
    pub state: Arc<Mutex<State>>,
    pub book: TokenBook,
    /// host:port, for `serverAddressByClientCIDRs`.
    pub server_address: String,
    pub stop: watch::Receiver<bool>,
}

pub fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The answer decided under the lock.
enum Outcome {
    Json(StatusCode, Vec<u8>),
    Text(StatusCode, &'static str),
    Binary(StatusCode, Vec<u8>),
    Watch(WatchSpec),
    /// A write for validating webhooks, answered once they allow it and it is stored.
    Admit(Box<Admission>),
}

/// A prepared write, the webhooks it goes to, and the status code of its success.
struct Admission {
    prepared: Prepared,
    calls: Vec<Call>,
    code: StatusCode,
    /// `dryRun=All`: answered, not stored.
    dry_run: bool,
}

/// How often a write is prepared again when its object changed while webhooks looked
/// at it, before it fails with a Conflict.
const ADMISSION_ATTEMPTS: usize = 5;

fn json_outcome(code: StatusCode, value: &Value) -> Outcome {
    Outcome::Json(code, serde_json::to_vec(value).unwrap_or_default())
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

fn respond(code: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response.headers_mut().insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache, private"));
    response
}

pub fn error_response(error: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    respond(code, "application/json", full(serde_json::to_vec(&error.status()).unwrap_or_default()))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(pair), String::new()),
        })
        .collect()
}

/// Handles one request.
pub async fn handle(
    shared: Arc<Shared>,
    request: http::Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Ok(error_response(&ApiError::bad_request("could not read the request body"))),
    };
    let mut attempts = 0;
    let outcome = loop {
        let outcome = {
            let mut state = lock(&shared.state);
            route(&shared, &mut state, &parts.method, &parts.uri, &parts.headers, &body)
        };
        let Ok(Outcome::Admit(admission)) = outcome else { break outcome };
        let Admission { prepared, calls, code, dry_run } = *admission;
        if let Err(refusal) = webhook_client::run(&calls).await {
            break Err(refusal);
        }
        let info = prepared.target.info.clone();
        let name = prepared.name.clone();
        if dry_run {
            let answer = write::finish_dry(&lock(&shared.state), prepared);
            break answer.map(|object| json_outcome(code, &present(&info, &Arc::new(object))));
        }
        let stored = write::finish(&mut lock(&shared.state), prepared);
        match stored {
            Ok(Some(object)) => break Ok(json_outcome(code, &present(&info, &object))),
            Ok(None) if attempts + 1 < ADMISSION_ATTEMPTS => attempts += 1,
            Ok(None) => break Err(ApiError::conflict(&info, &name)),
            Err(error) => break Err(error),
        }
    };
    Ok(match outcome {
        Ok(Outcome::Json(code, bytes)) => respond(code, "application/json", full(bytes)),
        Ok(Outcome::Binary(code, bytes)) => respond(code, "application/octet-stream", full(bytes)),
        Ok(Outcome::Text(code, text)) => respond(code, "text/plain; charset=utf-8", full(text)),
        Ok(Outcome::Watch(spec)) => {
            let body = watch_stream::start(shared.state.clone(), spec, shared.stop.clone());
            respond(StatusCode::OK, "application/json", body.boxed_unsync())
        }
        Ok(Outcome::Admit(_)) => error_response(&ApiError::internal("an admission left unfinished")),
        Err(error) => error_response(&error),
    })
}

fn route(
    shared: &Shared,
    state: &mut State,
    method: &Method,
    uri: &http::Uri,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Outcome, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let who = access::authenticate(&shared.book, header("authorization"), state)?;
    let path = uri.path();
    let query = parse_query(uri.query());
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // kubectl's protobuf bodies, read as the JSON they stand for (see `protobuf`).
    let mut content_type = header("content-type").unwrap_or("");
    let converted;
    let body = if protobuf::is_protobuf(content_type) && !body.is_empty() {
        converted = Bytes::from(protobuf::to_json(body)?);
        content_type = "application/json";
        &converted
    } else {
        body
    };
    let request = Request {
        method,
        query: &query,
        body,
        content_type,
        user_agent: header("user-agent").unwrap_or(""),
        accept: header("accept").unwrap_or(""),
    };
    match segments.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => resource(shared, state, &who, "", "v1", rest, &request),
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            resource(shared, state, &who, group, version, rest, &request)
        }
        _ => {
            let verb = method.as_str().to_lowercase();
            access::authorize_path(state, &who, &verb, path)?;
            if method != Method::GET {
                return Err(ApiError::method_not_allowed());
            }
            non_resource(shared, state, &segments, header("accept").unwrap_or(""))
        }
    }
}

fn non_resource(shared: &Shared, state: &State, segments: &[&str], accept: &str) -> Result<Outcome, ApiError> {
    let not_found = Outcome::Text(StatusCode::NOT_FOUND, "404 page not found\n");
    Ok(match segments {
        [] => json_outcome(
            StatusCode::OK,
            &json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2", "/readyz", "/version"]}),
        ),
        ["version"] => json_outcome(StatusCode::OK, &discovery::version()),
        ["healthz" | "livez" | "readyz", ..] => Outcome::Text(StatusCode::OK, "ok"),
        ["api"] => json_outcome(StatusCode::OK, &discovery::api_versions(&shared.server_address)),
        ["api", "v1"] => match discovery::api_resource_list(&state.registry, "", "v1") {
            Some(list) => json_outcome(StatusCode::OK, &list),
            None => not_found,
        },
        ["apis"] => json_outcome(StatusCode::OK, &discovery::api_group_list(&state.registry)),
        ["apis", group] => match discovery::api_group(&state.registry, group) {
            Some(group) => json_outcome(StatusCode::OK, &group),
            None => not_found,
        },
        ["apis", group, version] => match discovery::api_resource_list(&state.registry, group, version) {
            Some(list) => json_outcome(StatusCode::OK, &list),
            None => not_found,
        },
        ["openapi", "v2"] => {
            if accept.contains("protobuf") && !accept.contains("json") && !accept.contains("*/*") {
                return Ok(Outcome::Binary(StatusCode::OK, openapi::v2_protobuf(state)));
            }
            json_outcome(StatusCode::OK, &openapi::v2(state))
        }
        _ => not_found,
    })
}

struct Request<'a> {
    method: &'a Method,
    query: &'a HashMap<String, String>,
    body: &'a Bytes,
    content_type: &'a str,
    user_agent: &'a str,
    accept: &'a str,
}

impl Request<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        self.query.get(name).map(String::as_str)
    }

    fn flag(&self, name: &str) -> bool {
        matches!(self.param(name), Some("true" | "1"))
    }

    fn filter(&self, info: &ResourceInfo) -> Result<Filter, ApiError> {
        Ok(Filter {
            labels: LabelSelector::parse(self.param("labelSelector").unwrap_or(""))?,
            fields: FieldSelector::parse(self.param("fieldSelector").unwrap_or(""), info.is_custom())?,
        })
    }

    fn writer(&self, who: &super::auth::Identity) -> Writer {
        let manager = match self.param("fieldManager").filter(|m| !m.is_empty()) {
            Some(manager) => manager.to_owned(),
            None => meta::manager_from_user_agent(self.user_agent),
        };
        Writer { manager, now: meta::now_rfc3339(), who: who.clone() }
    }
}

/// Stores a prepared write now when no webhook wants to see it; otherwise hands it
/// to `handle` for the webhooks.
fn admit(
    state: &mut State,
    who: &super::auth::Identity,
    request: &Request,
    prepared: Prepared,
    code: StatusCode,
) -> Result<Outcome, ApiError> {
    let dry_run = dry_run::requested(request.param("dryRun"))?;
    let calls = admission::plan_write(state, &prepared, who, request.param("fieldManager"), dry_run);
    if !calls.is_empty() {
        return Ok(Outcome::Admit(Box::new(Admission { prepared, calls, code, dry_run })));
    }
    let info = prepared.target.info.clone();
    if dry_run {
        let object = write::finish_dry(state, prepared)?;
        return Ok(json_outcome(code, &present(&info, &Arc::new(object))));
    }
    let stored =
        write::finish(state, prepared)?.ok_or_else(|| ApiError::internal("the object changed under the store lock"))?;
    Ok(json_outcome(code, &present(&info, &stored)))
}

/// `/api/v1/…` and `/apis/{group}/{version}/…` below the group version.
#[allow(clippy::too_many_arguments)]
fn resource(
    shared: &Shared,
    state: &mut State,
    who: &super::auth::Identity,
    group: &str,
    version: &str,
    rest: &[&str],
    request: &Request,
) -> Result<Outcome, ApiError> {
    // Syntactic parse, as RequestInfo does.
    let mut parts = rest;
    let mut namespace: Option<&str> = None;
    if parts[0] == "namespaces" && parts.len() > 1 {
        namespace = Some(parts[1]);
        if parts.len() > 2 && !matches!(parts[2], "status" | "finalize") {
            parts = &parts[2..];
        }
    }
    let plural = parts[0];
    let name = parts.get(1).copied();
    let subresource = parts.get(2).copied();
    if parts.len() > 3 {
        return Err(ApiError::no_such_resource());
    }
    let media = request.content_type.split(';').next().unwrap_or("").trim();
    if matches!(*request.method, Method::POST | Method::PUT) && !matches!(media, "" | "application/json" | "*/*") {
        return Err(ApiError::unsupported_media_type(&["application/json"]));
    }
    let verb = match (request.method.clone(), name) {
        (Method::GET, None) if request.flag("watch") => "watch",
        (Method::GET, None) => "list",
        (Method::GET, Some(_)) => "get",
        (Method::POST, _) => "create",
        (Method::PUT, _) => "update",
        (Method::PATCH, _) => "patch",
        (Method::DELETE, None) => "deletecollection",
        (Method::DELETE, Some(_)) => "delete",
        _ => return Err(ApiError::method_not_allowed()),
    };
    access::authorize_resource(state, who, &ResourceAsk { verb, group, plural, subresource, namespace, name })?;

    let info = state.registry.lookup(group, version, plural).ok_or_else(ApiError::no_such_resource)?;
    let is_namespaces = group.is_empty() && plural == "namespaces";
    let store_ns = if is_namespaces { "" } else { namespace.unwrap_or("") };
    if !is_namespaces && (info.namespaced != namespace.is_some()) && (name.is_some() || !info.namespaced) {
        return Err(ApiError::no_such_resource());
    }
    let sub_ok = match (subresource, verb) {
        (None, _) => true,
        (Some("status"), "get" | "update" | "patch") => info.status_subresource,
        (Some("token"), "create") => group.is_empty() && plural == "serviceaccounts",
        (Some("finalize"), "update") => is_namespaces,
        _ => false,
    };
    if !sub_ok || (verb == "create" && name.is_some() && subresource.is_none()) {
        return Err(if subresource.is_some() { ApiError::no_such_resource() } else { ApiError::method_not_allowed() });
    }
    if verb == "deletecollection" && !info.deletecollection {
        return Err(ApiError::method_not_allowed());
    }
    if info.create_only {
        if verb != "create" || name.is_some() {
            return Err(ApiError::method_not_allowed());
        }
        let writer = request.writer(who);
        let answer = review::create(state, who, &info, store_ns, request.body, &writer.manager, &writer.now)?;
        return Ok(json_outcome(StatusCode::CREATED, &answer));
    }
    let list_ns = if info.namespaced { namespace } else { None };
    let target = Target {
        info: info.clone(),
        namespace: store_ns.to_owned(),
        name: name.unwrap_or("").to_owned(),
        subresource: subresource.filter(|s| matches!(*s, "status" | "finalize")).map(str::to_owned),
    };
    match verb {
        "get" => {
            let object = read::get(state, &info, store_ns, &target.name)?;
            if table::wanted(request.accept) {
                let list_meta = json!({"resourceVersion": meta::resource_version(&object)});
                let include = request.param("includeObject");
                let table = table::render(state, &info, &[object], list_meta, request.accept, include)?;
                return Ok(json_outcome(StatusCode::OK, &table));
            }
            Ok(json_outcome(StatusCode::OK, &object))
        }
        "list" => {
            let limit = request.param("limit").and_then(|l| l.parse().ok());
            let page: ListPage =
                read::list(state, &info, list_ns, &request.filter(&info)?, limit, request.param("continue"))?;
            if table::wanted(request.accept) {
                let objects: Vec<Arc<Value>> =
                    page.items.iter().filter_map(|item| serde_json::from_slice(item).ok()).map(Arc::new).collect();
                let mut list_meta = json!({"resourceVersion": page.resource_version.to_string()});
                if let Some(token) = &page.continue_token {
                    list_meta["continue"] = json!(token);
                }
                if let Some(remaining) = page.remaining.filter(|r| *r > 0) {
                    list_meta["remainingItemCount"] = json!(remaining);
                }
                let include = request.param("includeObject");
                let table = table::render(state, &info, &objects, list_meta, request.accept, include)?;
                return Ok(json_outcome(StatusCode::OK, &table));
            }
            Ok(Outcome::Json(StatusCode::OK, read::render_list(&info, &page)))
        }
        "watch" => {
            let since = match request.param("resourceVersion").unwrap_or("") {
                "" | "0" => None,
                rv => Some(rv.parse::<u64>().map_err(|_| {
                    ApiError::invalid(
                        "WatchOptions",
                        "",
                        "",
                        vec![Cause::new(
                            "FieldValueInvalid",
                            "resourceVersion",
                            format!("Invalid value: \"{rv}\": must be a number"),
                        )],
                    )
                })?),
            };
            Ok(Outcome::Watch(WatchSpec {
                info: info.clone(),
                namespace: list_ns.map(str::to_owned),
                filter: request.filter(&info)?,
                since,
                bookmarks: request.flag("allowWatchBookmarks"),
                timeout: request.param("timeoutSeconds").and_then(|t| t.parse().ok()).map(Duration::from_secs),
            }))
        }
        "create" if subresource == Some("token") => {
            token_request(shared, state, &info, store_ns, &target.name, request.body)
        }
        "create" => {
            let prepared = write::create(state, &request.writer(who), &target, request.body)?;
            admit(state, who, request, prepared, StatusCode::CREATED)
        }
        "update" => {
            let prepared = write::update(state, &request.writer(who), &target, request.body)?;
            admit(state, who, request, prepared, StatusCode::OK)
        }
        "patch" => {
            let patch_type = PatchType::from_content_type(request.content_type).ok_or_else(|| {
                let mut accepted = vec!["application/json-patch+json", "application/merge-patch+json"];
                if !info.is_custom() {
                    accepted.push("application/strategic-merge-patch+json");
                }
                accepted.push("application/apply-patch+yaml");
                ApiError::unsupported_media_type(&accepted)
            })?;
            if patch_type == PatchType::Apply && request.param("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::invalid(
                    "PatchOptions",
                    "meta.k8s.io",
                    "",
                    vec![Cause::new(
                        "FieldValueRequired",
                        "fieldManager",
                        "Required value: is required for apply patch",
                    )],
                ));
            }
            let force = request.flag("force");
            let prepared = write::patch(state, &request.writer(who), &target, patch_type, request.body, force)?;
            let code = if prepared.old.is_none() { StatusCode::CREATED } else { StatusCode::OK };
            admit(state, who, request, prepared, code)
        }
        "delete" => {
            let options = DeleteOptions::from_body(request.body)?;
            let now = meta::now_rfc3339();
            if dry_run::requested_in_delete(request.param("dryRun"), request.body)? {
                let (object, held) = dry_run::delete(state, &info, store_ns, &target.name, &options, &now)?;
                return Ok(if held || info.returns_deleted_object {
                    json_outcome(StatusCode::OK, &present(&info, &object))
                } else {
                    json_outcome(StatusCode::OK, &success_status(&info, &target.name, meta::uid(&object)))
                });
            }
            match delete::delete(state, &info, store_ns, &target.name, &options, &now)? {
                Deleted::Pending(object) => Ok(json_outcome(StatusCode::OK, &present(&info, &object))),
                Deleted::Gone(object) if info.returns_deleted_object => {
                    Ok(json_outcome(StatusCode::OK, &present(&info, &object)))
                }
                Deleted::Gone(object) => {
                    Ok(json_outcome(StatusCode::OK, &success_status(&info, &target.name, meta::uid(&object))))
                }
            }
        }
        "deletecollection" => {
            let now = meta::now_rfc3339();
            let items = delete::delete_collection(state, &info, list_ns, &request.filter(&info)?, &now);
            let page = ListPage {
                resource_version: state.current_rv(),
                items: items.iter().map(|o| super::store::to_json(&present(&info, o))).collect(),
                continue_token: None,
                remaining: None,
            };
            Ok(Outcome::Json(StatusCode::OK, read::render_list(&info, &page)))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// POST …/serviceaccounts/{name}/token.
fn token_request(
    shared: &Shared,
    state: &State,
    info: &ResourceInfo,
    namespace: &str,
    name: &str,
    body: &Bytes,
) -> Result<Outcome, ApiError> {
    let account = state.get(&info.storage_key(), namespace, name).ok_or_else(|| ApiError::not_found(info, name))?;
    let request: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid TokenRequest: {e}")))?
    };
    let expiration = request.pointer("/spec/expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
    if let Err(message) = super::auth::validate_expiration_seconds(expiration) {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            "",
            vec![Cause::new("FieldValueInvalid", "spec.expirationSeconds", message)],
        ));
    }
    let (token, expires) =
        shared.book.mint_service_account_token(namespace, name, meta::uid(&account), expiration, meta::now_unix());
    Ok(json_outcome(StatusCode::CREATED, &builtin::token_request_response(&request, &token, expires, expiration)))
}
