//! Reading AdmissionReviews and writing the answers.
//!
//! Every pod Create in the cluster passes through here, so a review is read
//! into lean types holding only what graceguard's decisions use: unknown
//! fields are skipped without being built, and the object is kept raw until a
//! pods request needs it. (kube's `AdmissionReview<DynamicObject>` buffers the
//! whole body twice through serde's `flatten`; see docs/benchmarks.md.)

use std::collections::BTreeMap;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use k8s_openapi::ByteString;
use kube::core::Status;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Why a body is not a usable AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview ({0}); send an admission.k8s.io/v1 AdmissionReview as JSON")]
    Json(serde_json::Error),
    #[error("the AdmissionReview has no `request`; the API server always sends one")]
    NoRequest,
    #[error(
        "the AdmissionReview's {field} is not a Pod ({source}); register graceguard for pods only"
    )]
    NotAPod {
        field: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Deserialize)]
struct ReviewIn<'a> {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(borrow)]
    request: Option<RawRequest<'a>>,
}

/// The request, with `object`, `oldObject` and `options` borrowed raw from the
/// body (no copy) until a decision asks for them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest<'a> {
    uid: String,
    resource: Gvr,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: String,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(borrow, default)]
    options: Option<&'a RawValue>,
}

/// The resource a request is for.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Gvr {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// Who sent the request.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

/// The metadata fields graceguard reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub deletion_timestamp: Option<String>,
    #[serde(default)]
    pub deletion_grace_period_seconds: Option<i64>,
    /// Orders the versions one DELETE's repeated reviews showed.
    #[serde(default)]
    pub resource_version: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub node_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct Condition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(rename = "lastTransitionTime", default)]
    pub last_transition_time: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
}

/// `pod` as graceguard's decisions read it (for a pod read from the API,
/// not from a review); `None` when it does not parse as one.
pub fn lean(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Pod> {
    serde_json::to_value(pod)
        .ok()
        .and_then(|v| serde_json::from_value(v).ok())
}

/// A pod, as far as graceguard reads one.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub spec: Option<PodSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

/// An admission request. `object` and `old_object` are read only for pods
/// requests; for anything else they stay `None`.
#[derive(Clone, Debug)]
pub struct Request {
    pub api_version: String,
    pub uid: String,
    pub resource: Gvr,
    pub sub_resource: String,
    pub name: String,
    pub namespace: String,
    /// CREATE, UPDATE, DELETE or CONNECT.
    pub operation: String,
    pub user_info: UserInfo,
    pub dry_run: bool,
    pub object: Option<Pod>,
    pub old_object: Option<Pod>,
    /// `object.metadata.name` of a Create of another kind (pods: in `object`).
    pub object_name: Option<String>,
    /// A Create's fencing token ([`graceguard_contract::fencing::ANNOTATION`]), read
    /// with its name when the pod is not read whole.
    pub fencing_token: Option<String>,
    /// `options.gracePeriodSeconds` (DELETE), or the Eviction's
    /// `deleteOptions.gracePeriodSeconds` (`pods/eviction` CREATE).
    pub grace_period_seconds: Option<i64>,
}

impl Request {
    /// True for `operation` on core `pods` with `subresource` ("" for none).
    pub fn is_pods(&self, operation: &str, subresource: &str) -> bool {
        self.operation == operation
            && self.resource.group.is_empty()
            && self.resource.resource == "pods"
            && self.sub_resource == subresource
    }

    /// True when a node sent it (user `system:node:*` or group `system:nodes`):
    /// such a request is never changed, since NodeRestriction refuses a node's
    /// update whose labels were changed on the way.
    pub fn is_from_node(&self) -> bool {
        self.user_info
            .username
            .as_deref()
            .is_some_and(|u| u.starts_with("system:node:"))
            || self
                .user_info
                .groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g == "system:nodes"))
    }

    /// The requesting user's name and groups (comma-separated).
    pub fn user(&self) -> (String, Option<String>) {
        let user = self.user_info.username.clone().unwrap_or_default();
        let groups = self.user_info.groups.as_ref().map(|g| g.join(","));
        (user, groups)
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    grace_period_seconds: Option<i64>,
    #[serde(default)]
    dry_run: Vec<String>,
}

/// Any object, as far as the collision guard reads one: its name.
#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    metadata: NameOnly,
}

#[derive(Deserialize, Default)]
struct NameOnly {
    #[serde(default)]
    name: Option<String>,
    /// Of the annotations, the fencing token alone: the others are skipped
    /// unbuilt.
    #[serde(default)]
    annotations: Option<TokenOnly>,
}

#[derive(Deserialize, Default)]
struct TokenOnly {
    /// [`graceguard_contract::fencing::ANNOTATION`] (serde needs the literal; a test
    /// holds them equal).
    #[serde(rename = "graceguard.io/fencing-token", default)]
    token: Option<String>,
}

/// A `policy/v1` (or `v1beta1`) Eviction, as far as graceguard reads one.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Eviction {
    #[serde(default)]
    delete_options: Option<DeleteOptions>,
}

fn pod(raw: Option<&RawValue>, field: &'static str) -> Result<Option<Pod>, ReviewError> {
    match raw {
        Some(r) if r.get() != "null" => serde_json::from_str(r.get())
            .map(Some)
            .map_err(|source| ReviewError::NotAPod { field, source }),
        _ => Ok(None),
    }
}

/// How much of a request's objects a decision reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// The collision guard: the Create's name, for any kind. The pod itself
    /// (labels, annotations, status) is never built.
    NameOnly,
    /// The tagger and the audits: pods requests' `object` and `oldObject`
    /// as [`Pod`]s; another kind's Create, its name.
    Pods,
}

/// Parses an `admission.k8s.io/v1` AdmissionReview, reading pods whole.
pub fn parse(body: &[u8]) -> Result<Request, ReviewError> {
    parse_as(body, Read::Pods)
}

/// Parses an `admission.k8s.io/v1` AdmissionReview in one pass over the
/// body, building only what `read` asks for.
pub fn parse_as(body: &[u8], read: Read) -> Result<Request, ReviewError> {
    let review: ReviewIn = serde_json::from_slice(body).map_err(ReviewError::Json)?;
    let r = review.request.ok_or(ReviewError::NoRequest)?;
    let pods = r.resource.group.is_empty() && r.resource.resource == "pods";
    let eviction = pods && r.sub_resource.as_deref() == Some("eviction");
    let (object, old_object) = if pods && !eviction && read == Read::Pods {
        (
            pod(r.object, "request.object")?,
            pod(r.old_object, "request.oldObject")?,
        )
    } else {
        (None, None)
    };
    // A Create's name when the pod is not read (or another kind's).
    // Unreadable means no name (allowed).
    let head = match r.object {
        Some(o) if r.operation == "CREATE" && object.is_none() && !eviction => {
            serde_json::from_str::<Head>(o.get()).ok()
        }
        _ => None,
    };
    let (object_name, fencing_token) = match head {
        Some(h) => (
            h.metadata.name,
            h.metadata.annotations.and_then(|a| a.token),
        ),
        None => (None, None),
    };
    let options = if eviction {
        // A missing or unreadable Eviction body still gets its audit record.
        r.object
            .and_then(|o| serde_json::from_str::<Eviction>(o.get()).ok())
            .and_then(|e| e.delete_options)
    } else {
        r.options
            .and_then(|o| serde_json::from_str::<DeleteOptions>(o.get()).ok())
    }
    .unwrap_or_default();
    Ok(Request {
        api_version: if review.api_version.is_empty() {
            "admission.k8s.io/v1".into()
        } else {
            review.api_version
        },
        uid: r.uid,
        resource: r.resource,
        sub_resource: r.sub_resource.unwrap_or_default(),
        name: r.name,
        namespace: r.namespace.unwrap_or_default(),
        operation: r.operation,
        user_info: r.user_info,
        dry_run: r.dry_run.unwrap_or(false) || !options.dry_run.is_empty(),
        object,
        old_object,
        object_name,
        fencing_token,
        grace_period_seconds: options.grace_period_seconds,
    })
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub allowed: bool,
    /// The denial (code, reason, message, details).
    pub status: Option<Status>,
    /// A JSONPatch, for the mutating endpoint.
    pub patch: Option<Vec<u8>>,
    /// Warnings the API server passes on to the client.
    pub warnings: Vec<String>,
    /// Written by the API server into its own audit log (keys prefixed with
    /// the webhook's name, e.g. `collision.graceguard.io/decision`): the
    /// trail security teams already collect carries graceguard's decision
    /// for the same request, whoever else can reach graceguard's port.
    pub audit_annotations: Vec<(&'static str, std::borrow::Cow<'static, str>)>,
}

impl Answer {
    pub fn allow() -> Self {
        Self {
            allowed: true,
            status: None,
            patch: None,
            warnings: Vec::new(),
            audit_annotations: Vec::new(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    /// Base64, as the API server expects `[]byte`.
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<ByteString>,
    /// Shown to the client (kubectl prints them).
    #[serde(skip_serializing_if = "Option::is_none")]
    warnings: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    audit_annotations:
        Option<std::collections::BTreeMap<&'static str, std::borrow::Cow<'static, str>>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'a str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

/// The AdmissionReview answering `req` with `answer`.
pub fn answer(req: &Request, answer: Answer) -> Response {
    let out = ReviewOut {
        api_version: &req.api_version,
        kind: "AdmissionReview",
        response: ResponseOut {
            uid: &req.uid,
            allowed: answer.allowed,
            status: answer.status.as_ref(),
            patch_type: answer.patch.as_ref().map(|_| "JSONPatch"),
            patch: answer.patch.map(ByteString),
            warnings: (!answer.warnings.is_empty()).then_some(answer.warnings),
            audit_annotations: (!answer.audit_annotations.is_empty())
                .then(|| answer.audit_annotations.into_iter().collect()),
        },
    };
    Json(out).into_response()
}

/// The answer to a body graceguard cannot use. When the review's uid can be
/// read, the request is allowed with a warning saying why: graceguard never
/// refuses what it does not understand, even under `failurePolicy: Fail`,
/// where an error answer would make the API server deny the request. Without
/// a uid no answer can be matched to the request: a 400 (the API server then
/// applies the failure policy).
pub fn unreadable(body: &[u8], e: &ReviewError) -> Response {
    #[derive(Deserialize)]
    struct UidOnly {
        #[serde(rename = "apiVersion", default)]
        api_version: String,
        request: Option<RequestUid>,
    }
    #[derive(Deserialize)]
    struct RequestUid {
        uid: String,
    }
    let Some((api_version, uid)) = serde_json::from_slice::<UidOnly>(body)
        .ok()
        .and_then(|r| Some((r.api_version, r.request?.uid)))
        .filter(|(_, uid)| !uid.is_empty())
    else {
        return bad_request(e);
    };
    let out = ReviewOut {
        api_version: if api_version.is_empty() {
            "admission.k8s.io/v1"
        } else {
            &api_version
        },
        kind: "AdmissionReview",
        response: ResponseOut {
            uid: &uid,
            allowed: true,
            status: None,
            patch_type: None,
            patch: None,
            warnings: Some(vec![format!(
                "graceguard allowed this request unchecked: {e}"
            )]),
            audit_annotations: None,
        },
    };
    Json(out).into_response()
}

/// A 400 for a body that is not a usable review. The API server treats it as a
/// failed call and applies the webhook's failurePolicy (Ignore: allowed).
pub fn bad_request(e: &ReviewError) -> Response {
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"error": e.to_string()})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_read_by_name_alone_still_reads_its_fencing_token() {
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{
            "uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},
            "resource":{"group":"","version":"v1","resource":"pods"},
            "namespace":"team-a","operation":"CREATE","userInfo":{"username":"alice"},
            "object":{"metadata":{"name":"task-0","annotations":{"a":"b","graceguard.io/fencing-token":"team-a/l/u/3"}}}}}"#;
        let req = parse_as(body, Read::NameOnly).expect("parses");
        assert_eq!(req.object_name.as_deref(), Some("task-0"));
        assert_eq!(req.fencing_token.as_deref(), Some("team-a/l/u/3"));
        let plain = String::from_utf8_lossy(body).replace("graceguard.io/fencing-token", "other");
        let req = parse_as(plain.as_bytes(), Read::NameOnly).expect("parses");
        assert_eq!(req.fencing_token, None);
    }
}
