//! Time as the Kubernetes API writes it, for the objects the bed writes
//! itself (node heartbeats, conditions).

/// Now, as the API writes times.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
