//! Reading AdmissionReviews and writing the answers.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;

/// Why a body is not a usable AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview ({0}); send an admission.k8s.io/v1 AdmissionReview as JSON")]
    Json(serde_json::Error),
    #[error("the AdmissionReview has no `request`; the API server always sends one")]
    NoRequest,
}

/// Parses an `admission.k8s.io/v1` AdmissionReview.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, ReviewError> {
    let review: AdmissionReview<DynamicObject> =
        serde_json::from_slice(body).map_err(ReviewError::Json)?;
    review.try_into().map_err(|_| ReviewError::NoRequest)
}

/// The HTTP answer carrying `response`.
pub fn answer(response: AdmissionResponse) -> Response {
    Json(response.into_review()).into_response()
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

/// The requesting user's name and groups.
pub fn user_of<T: kube::Resource>(req: &AdmissionRequest<T>) -> (String, Option<String>) {
    let user = req.user_info.username.clone().unwrap_or_default();
    let groups = req.user_info.groups.as_ref().map(|g| g.join(","));
    (user, groups)
}
