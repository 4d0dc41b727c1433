//! Everything graceguard derives from one review body without the network:
//! the parse (or the answer to an unreadable body) and every pure decision
//! taken on a parsed request. One entry point, so the fuzzer (`webhook/fuzz`)
//! and the unit test that replays its corpus drive exactly the code a request
//! body, or an API answer shaped like its object, can reach.

use kube::core::ObjectMeta;

use crate::collision::{self, Confirmation};
use crate::endpoints::deletion_audit;
use crate::mode::Mode;
use crate::pod_index::Holder;
use crate::quota_kinds::GroupResource;
use crate::review::{self, Answer};
use crate::{disruption, tagger};

/// Runs `body` through the parser and the pure decisions; returns the HTTP
/// status of the answer graceguard would send. Must never panic.
pub fn process(body: &[u8], now_unix: i64) -> u16 {
    if let Ok(req) = review::parse_as(body, review::Read::NameOnly) {
        let _ = (req.object_name.as_deref(), req.is_pods("CREATE", ""));
    }
    let req = match review::parse(body) {
        Ok(req) => req,
        Err(e) => return review::unreadable(body, &e).status().as_u16(),
    };
    let _ = (req.user(), req.is_from_node());
    if let Some(pod) = req.object.as_ref() {
        if let Some(d) = disruption::of_pod(pod) {
            let _ = (
                tagger::may_tag_now(pod),
                tagger::patch_for(&pod.metadata, &d),
                tagger::label_value(&d.reason),
            );
        }
    }
    if req.is_pods("DELETE", "") {
        let _ = deletion_audit::record(&req);
    }
    // The object's metadata read as a live GET's answer would be: the holder
    // of the name a later Create collides with.
    if let Some(meta) = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.pointer("/request/object/metadata").cloned())
        .and_then(|m| serde_json::from_value::<ObjectMeta>(m).ok())
    {
        let holder = Holder::from_meta(&meta);
        let name = meta.name.as_deref().unwrap_or_default();
        for mode in [Mode::Conflict, Mode::Retry, Mode::Adaptive] {
            let _ = collision::decide(
                &GroupResource::pods(),
                &Confirmation::Held(holder.clone()),
                name,
                mode,
                now_unix,
            );
        }
    }
    review::answer(&req, Answer::allow()).status().as_u16()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replays every input of the fuzzer's committed corpus (seeds and what
    /// fuzzing found) and the captured fixtures: none may panic, and every
    /// body with a readable uid is answered 200.
    #[test]
    fn fuzz_corpus_replays_without_a_panic() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut n = 0;
        for dir in ["fuzz/corpus/review", "tests/fixtures"] {
            let entries =
                std::fs::read_dir(root.join(dir)).unwrap_or_else(|e| panic!("reading {dir}: {e}"));
            for entry in entries.flatten() {
                let body = std::fs::read(entry.path()).unwrap_or_default();
                let status = process(&body, 1_700_000_000);
                assert!(
                    status == 200 || status == 400,
                    "{:?} answered {status}",
                    entry.path()
                );
                n += 1;
            }
        }
        assert!(
            n >= 20,
            "only {n} corpus inputs found: is webhook/fuzz/corpus/review committed?"
        );
    }

    #[test]
    fn a_readable_review_is_answered_200_and_garbage_400() {
        let body = include_bytes!("../tests/fixtures/03-delete-pods.json");
        assert_eq!(process(body, 1_700_000_000), 200);
        assert_eq!(process(b"{\"request\":", 1_700_000_000), 400);
    }
}
