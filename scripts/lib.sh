# Shared helpers for graceguard's scripts. Source it; do not run it.

# Where expensive build products live: outside the clone, so CI runs and later
# checkouts reuse them. Override with GRACEGUARD_CACHE.
GRACEGUARD_CACHE="${GRACEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceguard}"
export GRACEGUARD_CACHE

# The cargo target dir is shared the same way, unless the caller chose one.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$GRACEGUARD_CACHE/target}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

step() { printf '\n==> %s\n' "$*" >&2; }
info() { printf '    %s\n' "$*" >&2; }

# die STEP HINT: say which step failed and what to do about it, then exit 1.
die() {
	printf '\nerror: %s failed.\n  fix: %s\n' "$1" "$2" >&2
	exit 1
}

# Run apt-get as root, or through sudo when we are not root.
as_root() {
	if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# The machine's Go, never Debian's 1.19: the first `go` on PATH that is >= 1.26.
find_new_go() {
	local g v
	for g in $(type -ap go) /usr/local/go/bin/go; do
		v=$("$g" env GOVERSION 2>/dev/null) || continue
		v=${v#go}
		if [ "$(printf '%s\n1.26\n' "${v%%[a-z]*}" | sort -V | head -n1)" = "1.26" ]; then
			echo "$g"
			return 0
		fi
	done
	return 1
}
