//! Rule 4 (and 3): what a refused Create means.
//!
//! The API server's answer to a Create decides whether the task waits, fails,
//! or retries, and which budget pays. Reading a quota 403 as a user error, or
//! AlreadyExists as "Queued", is how flyteorg/flyte#8066 burns its retries.

/// An API error as the guard sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    /// The `reason` of each of the answer's `details.causes`.
    pub causes: Vec<String>,
}

/// The cause graceguard's webhook puts on a denial whose holder is
/// terminating (the shared contract).
pub use graceguard_contract::HOLDER_TERMINATING_CAUSE;

/// What to do about a refused Create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateRefusal {
    /// 403 exceeded quota: wait with the namespace's backoff; no attempt spent.
    QuotaFull,
    /// 403 exceeded quota, but the request alone is larger than the hard
    /// limit: it can never fit.
    ExceedsQuotaLimit { detail: String },
    /// 409 AlreadyExists (from the API server or graceguard's webhook): read
    /// the pod holding the name before deciding anything.
    NameTaken,
    /// 429 from graceguard's webhook: the name's holder is terminating.
    /// Waiting for a deletion to finish is no failure: wait the answer's
    /// Retry-After, spending no attempt and no transient retry.
    HolderTerminating,
    /// 429 and a 409 other than AlreadyExists (the ResourceQuota plugin's
    /// "Operation cannot be fulfilled on resourcequotas": its own write
    /// conflicted): nothing was written; retry with backoff, no attempt spent.
    Transient,
    /// 5xx: the write may have landed (a 504 after etcd took it): after the
    /// backoff, read the name before creating again, so a landed pod is
    /// adopted instead of met with a second Create (the 409-after-quota-charge
    /// graceguard exists to prevent). Counted like [`Self::Transient`].
    MaybeCreated,
    /// Anything else (RBAC or pod-security 403, an invalid manifest): the
    /// user's configuration is wrong; retrying cannot help.
    Configuration { message: String },
}

/// Classifies an API error answering a pod Create.
pub fn classify(e: &ApiError) -> CreateRefusal {
    match e.code {
        403 if e.message.contains("exceeded quota") => match exceeds_limit(&e.message) {
            Some(detail) => CreateRefusal::ExceedsQuotaLimit { detail },
            None => CreateRefusal::QuotaFull,
        },
        409 if e.reason == "AlreadyExists" => CreateRefusal::NameTaken,
        429 if e.causes.iter().any(|c| c == HOLDER_TERMINATING_CAUSE) => {
            CreateRefusal::HolderTerminating
        }
        409 | 429 => CreateRefusal::Transient,
        500..=599 => CreateRefusal::MaybeCreated,
        _ => CreateRefusal::Configuration {
            message: format!("{} {}: {}", e.code, e.reason, e.message),
        },
    }
}

/// In `exceeded quota: NAME, requested: cpu=2, used: cpu=0, limited: cpu=1`,
/// a resource whose request alone exceeds the limit, described; `None` when
/// every request would fit an empty quota.
pub fn exceeds_limit(message: &str) -> Option<String> {
    let field = |key: &str| -> Vec<(String, String)> {
        let Some(start) = message.find(key) else {
            return Vec::new();
        };
        let rest = &message[start + key.len()..];
        let end = [", used:", ", limited:"]
            .iter()
            .filter_map(|k| rest.find(k))
            .min()
            .unwrap_or(rest.len());
        rest[..end]
            .split(',')
            .filter_map(|kv| {
                let (k, v) = kv.trim().split_once('=')?;
                Some((k.trim().to_string(), v.trim().to_string()))
            })
            .collect()
    };
    let requested = field("requested: ");
    let limited = field("limited: ");
    for (res, req) in &requested {
        let Some((_, lim)) = limited.iter().find(|(k, _)| k == res) else {
            continue;
        };
        if let (Some(r), Some(l)) = (quantity(req), quantity(lim)) {
            if r > l {
                return Some(format!(
                    "the pod requests {res}={req} but the quota's hard limit is {res}={lim}"
                ));
            }
        }
    }
    None
}

/// A Kubernetes quantity as a number (enough to compare two of them).
fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0f64.powi(2),
        "Gi" => 1024.0f64.powi(3),
        "Ti" => 1024.0f64.powi(4),
        "Pi" => 1024.0f64.powi(5),
        "Ei" => 1024.0f64.powi(6),
        _ => return None,
    };
    Some(n * mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(code: u16, reason: &str, message: &str) -> ApiError {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            causes: Vec::new(),
        }
    }

    #[test]
    fn classification_table() {
        let cases = vec![
            (
                err(403, "Forbidden", "pods \"t-0\" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=10, limited: pods=10"),
                CreateRefusal::QuotaFull,
            ),
            (
                err(403, "Forbidden", "pods \"t-0\" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=0, limited: cpu=1"),
                CreateRefusal::ExceedsQuotaLimit {
                    detail: "the pod requests cpu=2 but the quota's hard limit is cpu=1".into(),
                },
            ),
            (
                err(403, "Forbidden", "exceeded quota: compute, requested: cpu=500m,memory=1Gi, used: cpu=800m,memory=0, limited: cpu=1,memory=2Gi"),
                CreateRefusal::QuotaFull,
            ),
            (
                err(403, "Forbidden", "exceeded quota: compute, requested: memory=3Gi, used: memory=0, limited: memory=2Gi"),
                CreateRefusal::ExceedsQuotaLimit {
                    detail: "the pod requests memory=3Gi but the quota's hard limit is memory=2Gi".into(),
                },
            ),
            (err(409, "AlreadyExists", "object is being deleted: pods \"t-0\" already exists"), CreateRefusal::NameTaken),
            (
                err(409, "Conflict", "Operation cannot be fulfilled on resourcequotas \"compute\": the object has been modified; please apply your changes to the latest version and try again"),
                CreateRefusal::Transient,
            ),
            (err(429, "TooManyRequests", "slow down"), CreateRefusal::Transient),
            (
                ApiError {
                    causes: vec![HOLDER_TERMINATING_CAUSE.into()],
                    ..err(429, "TooManyRequests", "admission webhook \"collision-guard.graceguard.io\" denied the request: pods \"t-0\" already exists and is terminating")
                },
                CreateRefusal::HolderTerminating,
            ),
            (
                ApiError {
                    causes: vec![HOLDER_TERMINATING_CAUSE.into()],
                    ..err(409, "AlreadyExists", "pods \"t-0\" already exists and is terminating")
                },
                CreateRefusal::NameTaken,
            ),
            (err(500, "InternalError", "etcd"), CreateRefusal::MaybeCreated),
            (err(503, "ServiceUnavailable", ""), CreateRefusal::MaybeCreated),
            (err(504, "Timeout", "the request timed out"), CreateRefusal::MaybeCreated),
            (
                err(403, "Forbidden", "pods is forbidden: User \"x\" cannot create resource \"pods\""),
                CreateRefusal::Configuration {
                    message: "403 Forbidden: pods is forbidden: User \"x\" cannot create resource \"pods\"".into(),
                },
            ),
            (
                err(422, "Invalid", "spec.containers: Required value"),
                CreateRefusal::Configuration {
                    message: "422 Invalid: spec.containers: Required value".into(),
                },
            ),
        ];
        for (e, want) in cases {
            assert_eq!(classify(&e), want, "{e:?}");
        }
    }

    #[test]
    fn quantities_compare() {
        assert!(quantity("1500m") < quantity("2"));
        assert!(quantity("1Gi") > quantity("1G"));
        assert_eq!(quantity("bogus"), None);
    }
}
