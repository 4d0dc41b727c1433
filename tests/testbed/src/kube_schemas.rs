//! The Kubernetes schemas the sidecar's OpenAPI document includes for a pod
//! template, read from a real kube-apiserver as OpenAPI v3
//! (`/openapi/v3/api/v1`, what the document holds); an older minor's are
//! compared by the properties each schema names.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::control_plane::TestBed;

/// The schema the closure starts from.
pub const ROOT: &str = "io.k8s.api.core.v1.PodTemplateSpec";

async fn get_json(bed: &TestBed, path: &str) -> Result<Value> {
    let req = http::Request::get(path)
        .body(Vec::new())
        .context("building the request")?;
    let text = bed
        .client
        .request_text(req)
        .await
        .with_context(|| format!("GET {path} from the API server"))?;
    serde_json::from_str(&text).with_context(|| format!("{path} is not JSON"))
}

/// `root` and every schema it reaches through `$ref`s starting with `prefix`.
pub fn closure(
    schemas: &serde_json::Map<String, Value>,
    prefix: &str,
) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![ROOT.to_string()];
    while let Some(name) = todo.pop() {
        if out.contains_key(&name) {
            continue;
        }
        let s = schemas
            .get(&name)
            .with_context(|| format!("the API server's document has no schema {name}"))?;
        let mut refs = Vec::new();
        collect_refs(s, &mut refs);
        for r in refs {
            match r.strip_prefix(prefix) {
                Some(n) => todo.push(n.to_string()),
                None => bail!("{name} refers to {r}, outside {prefix}"),
            }
        }
        out.insert(name, s.clone());
    }
    Ok(out)
}

/// Drops the two kinds of `default` Kubernetes' generator writes for Go
/// zero values that are not values of their schema: `""` on an enum that
/// lacks `""` (openapi-spec-validator rejects it) and `{}` beside an
/// `allOf`/`$ref` (code generators refuse a default on a model). Neither is
/// a default the API server applies. Everything else is kept as served.
pub fn drop_zero_defaults(v: &mut Value) {
    match v {
        Value::Object(m) => {
            let invalid = match m.get("default") {
                Some(Value::String(d)) if d.is_empty() => m
                    .get("enum")
                    .and_then(Value::as_array)
                    .is_some_and(|e| !e.iter().any(|x| x == "")),
                Some(Value::Object(d)) if d.is_empty() => {
                    m.contains_key("allOf") || m.contains_key("$ref")
                }
                _ => false,
            };
            if invalid {
                m.remove("default");
            }
            m.values_mut().for_each(drop_zero_defaults);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_zero_defaults),
        _ => {}
    }
}

fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v.as_str()) {
                    ("$ref", Some(r)) => out.push(r.to_string()),
                    _ => collect_refs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// The v3 schemas a v1.24+ API server serves for a pod template, with
/// [`drop_zero_defaults`] applied.
pub async fn served_v3(bed: &TestBed) -> Result<BTreeMap<String, Value>> {
    let doc = get_json(bed, "/openapi/v3/api/v1").await?;
    let schemas = doc
        .pointer("/components/schemas")
        .and_then(Value::as_object)
        .context("/openapi/v3/api/v1 has no components.schemas")?;
    let mut out = closure(schemas, "#/components/schemas/")?;
    out.values_mut().for_each(drop_zero_defaults);
    Ok(out)
}

/// The property names a schema lists.
pub fn properties(schema: &Value) -> BTreeSet<String> {
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}
