//! Go programs of the tests (the sidecar's Go client, the client-go
//! executor), built once per source version into the cache.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The Go toolchain: `$GRACEGUARD_GO`, else Go at /usr/local/go (the
/// machine's current Go), else `go` on PATH.
pub fn go_tool() -> PathBuf {
    if let Some(p) = std::env::var_os("GRACEGUARD_GO") {
        return PathBuf::from(p);
    }
    let local = PathBuf::from("/usr/local/go/bin/go");
    if local.is_file() {
        return local;
    }
    PathBuf::from("go")
}

/// Builds the Go module in `src` into `<cache>/<cache_name>/<bin_name>-<hash>`,
/// keyed by its go.mod, go.sum and *.go files: a build under a temporary
/// name, renamed into place, so parallel tests never see half a binary.
pub fn cached(src: &Path, cache_name: &str, bin_name: &str) -> Result<PathBuf> {
    cached_package(src, ".", cache_name, bin_name)
}

/// Every go.mod, go.sum and *.go file under `dir`, sorted.
fn go_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            go_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "go")
            || p.file_name()
                .is_some_and(|n| n == "go.mod" || n == "go.sum")
        {
            out.push(p);
        }
    }
    Ok(())
}

/// [`cached`] for the command `package` (such as `./cmd/x`) of the module
/// in `src`, keyed by every Go file of the module.
pub fn cached_package(
    src: &Path,
    package: &str,
    cache_name: &str,
    bin_name: &str,
) -> Result<PathBuf> {
    let mut files = Vec::new();
    go_files(src, &mut files)?;
    files.sort();
    let mut key = String::new();
    for f in &files {
        key.push_str(
            &std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?,
        );
    }
    let hash = graceguard::core::pod_record::template_hash(&serde_json::Value::String(key));
    let dir = crate::binaries::cache_dir().join(cache_name);
    let bin = dir.join(format!("{bin_name}-{hash}"));
    if bin.is_file() {
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!("build-{}", std::process::id()));
    let out = std::process::Command::new(go_tool())
        .args(["build", "-trimpath", "-o"])
        .arg(&tmp)
        .arg(package)
        .current_dir(src)
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .env("CGO_ENABLED", "0")
        .output()
        .with_context(|| {
            format!(
                "running {} to build {} (Go 1.26 or newer is needed; scripts/test checks for it)",
                go_tool().display(),
                src.display()
            )
        })?;
    if !out.status.success() {
        bail!(
            "building {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::fs::rename(&tmp, &bin)?;
    Ok(bin)
}
