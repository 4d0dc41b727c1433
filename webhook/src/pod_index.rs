//! What the webhook keeps per pod: who holds a name, and whether that pod is
//! in its graceful deletion. Names and these few fields only, never specs.

use kube::core::ObjectMeta;

use crate::meta_index::MetaIndex;
use crate::mode::{Mode, MODE_LABEL};

/// A graceful deletion in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deletion {
    /// `metadata.deletionTimestamp` (unix seconds): when the grace period ends.
    pub at_unix: i64,
    /// `metadata.deletionGracePeriodSeconds`.
    pub grace_seconds: i64,
}

impl Deletion {
    /// When the deletion was requested: the end of grace minus the grace.
    /// Saturating: the grace comes from an API answer, and no value of it
    /// may wrap or panic.
    pub fn requested_unix(&self) -> i64 {
        self.at_unix.saturating_sub(self.grace_seconds)
    }

    /// Seconds of grace left at `now_unix` (never negative).
    pub fn seconds_left(&self, now_unix: i64) -> i64 {
        self.at_unix.saturating_sub(now_unix).max(0)
    }
}

/// The pod holding a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldPod {
    pub uid: String,
    pub deletion: Option<Deletion>,
}

impl HeldPod {
    /// Projects pod metadata (from the watch or from a live GET).
    pub fn from_meta(m: &ObjectMeta) -> Self {
        Self {
            uid: m.uid.clone().unwrap_or_default(),
            deletion: m.deletion_timestamp.as_ref().map(|t| Deletion {
                at_unix: t.0.as_second(),
                grace_seconds: m.deletion_grace_period_seconds.unwrap_or(0),
            }),
        }
    }
}

/// What a live read says about a name's holder: the index's fields plus the
/// finalizers, which say what keeps a terminating object (of any kind) from
/// going away. Only confirmations carry them; the index does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub held: HeldPod,
    pub finalizers: Vec<String>,
}

impl Holder {
    pub fn from_meta(m: &ObjectMeta) -> Self {
        Self {
            held: HeldPod::from_meta(m),
            finalizers: m.finalizers.clone().unwrap_or_default(),
        }
    }
}

impl From<HeldPod> for Holder {
    fn from(held: HeldPod) -> Self {
        Self {
            held,
            finalizers: Vec::new(),
        }
    }
}

/// Pod names, by namespace.
pub type PodIndex = MetaIndex<HeldPod>;

/// The label that opts a namespace or a pod out: the chart's selectors keep
/// the collision guard and the tagger away from it; the audits still see
/// it (nobody may make a deletion unaudited by labelling), and graceguard
/// writes nothing to it ([`crate::follow_up`]).
pub const OPT_OUT_LABEL: &str = "graceguard.io/ignore";

/// What graceguard reads from a namespace's labels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceSettings {
    /// Its valid `graceguard.io/mode` label, if any.
    pub mode: Option<Mode>,
    /// It carries `graceguard.io/ignore=true`.
    pub opted_out: bool,
}

/// Namespaces that carry a valid `graceguard.io/mode` label or opt out.
pub type NamespaceModes = MetaIndex<NamespaceSettings>;

/// Whether `labels` carry `graceguard.io/ignore=true`.
pub fn opts_out(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(OPT_OUT_LABEL))
        .is_some_and(|v| v == "true")
}

/// A namespace's settings, if it has any to keep.
pub fn namespace_settings(m: &ObjectMeta) -> Option<NamespaceSettings> {
    let s = NamespaceSettings {
        mode: namespace_mode(m),
        opted_out: opts_out(m.labels.as_ref()),
    };
    (s != NamespaceSettings::default()).then_some(s)
}

/// The mode a namespace's `graceguard.io/mode` label names, if valid.
pub fn namespace_mode(m: &ObjectMeta) -> Option<Mode> {
    let value = m.labels.as_ref()?.get(MODE_LABEL)?;
    match value.parse() {
        Ok(mode) => Some(mode),
        Err(e) => {
            tracing::warn!(namespace = m.name.as_deref().unwrap_or(""), label = MODE_LABEL, error = %e, "ignoring namespace mode label");
            None
        }
    }
}
