//! The guard's decisions, pure: no Kubernetes client, no tokio, no clock of
//! their own. Each takes what the runtime saw (pods, an API answer, the
//! time) and returns what to do, so every rule is unit-tested without a
//! server and a reader finds it here, in one place:
//!
//! * [`reconcile`]: a task's next step from its pods (rules 2 and 3);
//! * [`classify`] and [`backoff`]: what a refused Create means, how long to
//!   wait (rule 4);
//! * [`bounds`] and [`phase`]: the bounds on waits and failures, the phases a
//!   task reports (rule 5);
//! * [`naming`]: every name, label and annotation the guard writes (rule 1);
//! * [`pod_record`], [`template`], [`task`], [`run_identity`]: what a pod
//!   carries so a restarted process rebuilds its state from the pods;
//! * how an API answer becomes the reconciler's input (`answer`), a task's
//!   lifecycle flags (`lifecycle`) and which finished pods let go of the
//!   result finalizer (`result_finalizer`): used by [`crate::runtime`]'s
//!   loop, not part of the public API.
//!
//! `core_is_pure` (below) fails the build's tests if a module here names
//! `kube::` or `tokio::`.

pub(crate) mod answer;
pub mod backoff;
pub mod bounds;
pub mod classify;
pub(crate) mod error;
pub(crate) mod lifecycle;
pub mod naming;
pub mod phase;
pub mod pod_record;
pub mod reconcile;
pub(crate) mod result_finalizer;
pub mod run_identity;
pub mod task;
pub mod template;

pub use bounds::Bounds;
pub use error::TaskError;
pub use phase::{FailureKind, Phase, Transition};
pub use reconcile::{Outcome, TaskSpec};

#[cfg(test)]
mod tests {
    /// The core stays pure: no module of it names the Kubernetes client or
    /// tokio (k8s-openapi's types are data, and allowed). Unit tests, below
    /// a module's `#[cfg(test)]`, may take a reference instant from tokio.
    #[test]
    fn core_is_pure() {
        // Every module file of the core, read now: one added later is
        // checked without being listed here. `*_tests.rs` are test modules.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/core");
        let mut sources: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let file = path.file_name()?.to_str()?.to_string();
                let module =
                    file.ends_with(".rs") && file != "mod.rs" && !file.ends_with("_tests.rs");
                module.then(|| std::fs::read_to_string(&path).map(|text| (file, text)).ok())?
            })
            .collect();
        sources.sort();
        assert!(
            sources.len() >= 14,
            "only {} core modules read from {}",
            sources.len(),
            dir.display()
        );
        for (file, text) in &sources {
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for (n, line) in code.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                for io in [
                    "kube::",
                    "tokio::",
                    "crate::runtime",
                    "crate::sidecar",
                    "crate::cli",
                ] {
                    assert!(
                        !code.contains(io),
                        "guard/src/core/{file}:{}: `{io}` in the pure core; move the I/O to crate::runtime",
                        n + 1
                    );
                }
            }
        }
    }
}
