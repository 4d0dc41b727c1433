//! Which code a process runs, the same on the webhook and the sidecar: the
//! workspace's version and the source revision (`build/revision.rs`, this
//! crate's build script: `GRACEGUARD_REVISION` when set, else `git
//! rev-parse`, else `unknown`), for `--version` and `graceguard_build_info`.

/// The workspace's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The source revision the binaries were built from.
pub const REVISION: &str = env!("GRACEGUARD_REVISION");

/// `--version`'s text, after the command's name: what a bug report must name.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("GRACEGUARD_REVISION"),
    ")"
);

/// The labels of `graceguard_build_info`.
pub fn labels() -> Vec<(&'static str, &'static str)> {
    vec![("version", VERSION), ("revision", REVISION)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_the_release_and_a_revision() {
        assert_eq!(VERSION_LINE, format!("{VERSION} (revision {REVISION})"));
        assert!(!REVISION.is_empty());
        assert_eq!(labels(), [("version", VERSION), ("revision", REVISION)]);
    }
}
