# Makes sure the Rust tools the scripts use are there. Source it after lib.sh.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
	step "installing rustfmt and clippy"
	rustup component add rustfmt clippy >&2 || die "installing rustfmt/clippy" "run 'rustup component add rustfmt clippy'"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
	step "installing cargo-nextest"
	cargo_install --locked cargo-nextest >&2 || die "installing cargo-nextest" "run 'cargo install --locked cargo-nextest'"
fi
