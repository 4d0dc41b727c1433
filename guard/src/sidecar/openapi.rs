//! The sidecar's OpenAPI document, generated from the handlers and the
//! types they read and write (`utoipa`), with the Kubernetes schemas of a
//! pod template included so the document stands alone.
//!
//! `guard/openapi.json` is this document as committed (regenerate it with
//! `graceguard openapi > guard/openapi.json`); a unit test keeps the two
//! equal. `guard/openapi-kubernetes.json` holds the schemas reachable from
//! `io.k8s.api.core.v1.PodTemplateSpec` as a kube-apiserver serves them at
//! `/openapi/v3/api/v1`; an end-to-end test compares it with the test bed's
//! API server.

use std::sync::OnceLock;

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr, Schema};
use utoipa::{Modify, OpenApi};

use super::{api, handlers, status};

/// The document as committed.
pub const COMMITTED: &str = include_str!("../../openapi.json");

/// The Kubernetes schemas the document includes, as committed.
pub const KUBERNETES: &str = include_str!("../../openapi-kubernetes.json");

/// The schema every pod template is checked against by the API server.
pub const POD_TEMPLATE_SCHEMA: &str = "io.k8s.api.core.v1.PodTemplateSpec";

/// `PutTask.template`'s schema: Kubernetes' own.
pub fn pod_template() -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(POD_TEMPLATE_SCHEMA))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "graceguard sidecar API",
        description = "The guard's executor core as a local HTTP+JSON API: submit tasks, follow their events, acknowledge results. Served on a Unix socket (no token) or loopback TCP (bearer token on /v1). Every error answer is a Status object.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        handlers::put_task,
        handlers::get_task,
        handlers::delete_task,
        handlers::retry_task,
        handlers::list_tasks,
        handlers::events,
        handlers::ack,
        handlers::healthz,
        handlers::openapi,
    ),
    components(schemas(status::ApiStatus, api::PutTask, api::Ack)),
    modifiers(&Security),
    tags((name = "tasks", description = "Submit, read, retry and abort tasks"),
         (name = "events", description = "Follow and acknowledge what happened"),
         (name = "meta", description = "Health and this document")),
)]
struct ApiDoc;

struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The content of the sidecar's --token-file; a TCP listener requires it on every /v1 request, a Unix socket does not (its file mode guards it).",
                    ))
                    .build(),
            ),
        );
    }
}

/// Why the document could not be put together.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    #[error("guard/openapi-kubernetes.json is not a JSON object with \"schemas\" ({0}); regenerate it (see docs/sidecar-api.md)")]
    Kubernetes(String),
    #[error("serializing the OpenAPI document: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// The document, pretty-printed, ending in a newline.
pub fn generate() -> Result<String, DocumentError> {
    let mut doc = serde_json::to_value(ApiDoc::openapi())?;
    let kube: serde_json::Value = serde_json::from_str(KUBERNETES)?;
    let Some(kube) = kube.get("schemas").and_then(|s| s.as_object()) else {
        return Err(DocumentError::Kubernetes("no \"schemas\" object".into()));
    };
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(|s| s.as_object_mut())
    else {
        return Err(DocumentError::Kubernetes(
            "the generated document has no components".into(),
        ));
    };
    for (name, schema) in kube {
        schemas.insert(name.clone(), schema.clone());
    }
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

/// The document served at `/openapi.json` (generated once).
pub fn served() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    // Generation cannot fail on the committed inputs (a unit test proves
    // it); if it ever did, the committed document is the next best answer.
    DOC.get_or_init(|| generate().unwrap_or_else(|_| COMMITTED.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_document_is_the_generated_one() {
        let generated = generate().expect("the document generates");
        assert!(
            generated == COMMITTED,
            "guard/openapi.json is stale: run `cargo run -p graceguard -- openapi > guard/openapi.json`"
        );
    }

    #[test]
    fn every_reference_resolves_inside_the_document() {
        let doc: serde_json::Value =
            serde_json::from_str(&generate().expect("generates")).expect("JSON");
        let mut refs = Vec::new();
        collect_refs(&doc, &mut refs);
        assert!(refs.iter().any(|r| r.ends_with(POD_TEMPLATE_SCHEMA)));
        for r in refs {
            let name = r
                .strip_prefix("#/components/schemas/")
                .expect("a local schema ref");
            assert!(
                doc["components"]["schemas"].get(name).is_some(),
                "{r} dangles"
            );
        }
    }

    fn collect_refs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v.as_str()) {
                        ("$ref", Some(r)) => out.push(r.to_string()),
                        _ => collect_refs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }
}
