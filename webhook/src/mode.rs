//! How a denial is phrased: `conflict` (409 AlreadyExists, what the API server
//! itself would answer, so clients behave exactly as without graceguard) or
//! `retry` (429 with `retryAfterSeconds`, for clients that should wait out the
//! grace period). Chosen per install, overridable per namespace by label.

use std::str::FromStr;

/// The namespace label that overrides the install-wide mode.
pub const MODE_LABEL: &str = "graceguard.io/mode";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    #[default]
    Conflict,
    Retry,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Conflict => "conflict",
            Mode::Retry => "retry",
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "conflict" => Ok(Mode::Conflict),
            "retry" => Ok(Mode::Retry),
            other => Err(format!(
                "{other:?} is not a graceguard mode; use \"conflict\" or \"retry\""
            )),
        }
    }
}
