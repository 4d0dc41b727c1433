//! How a denial is phrased: `conflict` (409 AlreadyExists, what the API server
//! itself would answer, so clients behave exactly as without graceguard),
//! `retry` (429 with `retryAfterSeconds` = the grace left, for clients that
//! should wait out the grace period) or `adaptive` (409 at first, 429 with
//! short, growing waits once the same client keeps re-creating the name:
//! see `collision::phrasing`). Chosen per install, overridable per namespace
//! by label.

use std::str::FromStr;

/// The namespace label that overrides the install-wide mode.
pub const MODE_LABEL: &str = "graceguard.io/mode";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Conflict,
    Retry,
    #[default]
    Adaptive,
}

impl Mode {
    /// The modes that can answer a collision with 429 (`conflict` never does).
    pub const ANSWERING_429: [Mode; 2] = [Mode::Retry, Mode::Adaptive];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Conflict => "conflict",
            Mode::Retry => "retry",
            Mode::Adaptive => "adaptive",
        }
    }
}

/// A mode name (`--mode`, a namespace's `graceguard.io/mode` label) that
/// is none of graceguard's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a graceguard mode; use \"conflict\", \"retry\" or \"adaptive\"")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "conflict" => Ok(Mode::Conflict),
            "retry" => Ok(Mode::Retry),
            "adaptive" => Ok(Mode::Adaptive),
            other => Err(UnknownMode(other.to_string())),
        }
    }
}
