//! Build script of graceguard-contract (`graceguard_contract::build`): the
//! source revision for `--version` and `graceguard_build_info{revision}` of
//! the webhook and the guard, so an operator sees which code a replica runs. `GRACEGUARD_REVISION` wins when set (a release build from
//! a tarball), else `git rev-parse`, else `unknown`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=GRACEGUARD_REVISION");
    let given = std::env::var("GRACEGUARD_REVISION")
        .ok()
        .filter(|s| !s.is_empty());
    let revision = given.or_else(|| {
        // Rebuilt when HEAD moves: a commit, a checkout, a fetch into packed refs.
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            for f in ["HEAD", "refs/heads", "packed-refs"] {
                let p = Path::new(&dir).join(f);
                if p.exists() {
                    println!("cargo:rerun-if-changed={}", p.display());
                }
            }
        }
        git(&["rev-parse", "--short=12", "HEAD"])
    });
    println!(
        "cargo:rustc-env=GRACEGUARD_REVISION={}",
        revision.as_deref().unwrap_or("unknown")
    );
}
