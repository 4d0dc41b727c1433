# Shared helpers for graceguard's scripts. Source it; do not run it.

# Where expensive build products live: outside the clone, so CI runs and later
# checkouts reuse them. Override with GRACEGUARD_CACHE.
GRACEGUARD_CACHE="${GRACEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceguard}"
export GRACEGUARD_CACHE

# The cargo target dir is shared the same way, unless the caller chose one.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$GRACEGUARD_CACHE/target}"

# bound_caches: keep the shared build caches from filling the disk. Cargo's
# incremental state (which CI's fresh clones never reuse) is dropped once the
# target dir passes GRACEGUARD_TARGET_MAX_GB (default 25), and Go's build
# cache is emptied past GRACEGUARD_GOCACHE_MAX_GB (default 20): both grow
# without limit otherwise, and a full disk fails every later run. One cold
# run leaves 14 GB in Go's cache (two minors' control planes and nodes, the
# tools); at the old bound of 12 the next run emptied it and rebuilt the
# clients' and the executor's dependencies (2.5 minutes, 2026-12-07).
bound_caches() {
	local gb max dir
	max=${GRACEGUARD_TARGET_MAX_GB:-25}
	if [ -d "$CARGO_TARGET_DIR" ]; then
		gb=$(($(du -sk "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1) / 1048576))
		if [ "$gb" -gt "$max" ]; then
			info "the cargo target dir holds ${gb} GB (over $max): dropping its incremental state"
			for dir in "$CARGO_TARGET_DIR"/*/incremental "$CARGO_TARGET_DIR"/*/*/incremental; do
				[ -d "$dir" ] && rm -rf "$dir"
			done
			# Every rebuild of a changed crate leaves its old artifacts in
			# deps/ (cargo never removes them): still over, the debug
			# profile is dropped whole and rebuilt (a few minutes, once).
			gb=$(($(du -sk "$CARGO_TARGET_DIR" 2>/dev/null | cut -f1) / 1048576))
			if [ "$gb" -gt "$max" ]; then
				info "still ${gb} GB: dropping the debug profile's stale artifacts (rebuilt next)"
				rm -rf "$CARGO_TARGET_DIR/debug"
			fi
		fi
	fi
	local go
	go=$(find_new_go 2>/dev/null) || return 0
	dir=$("$go" env GOCACHE 2>/dev/null) || return 0
	max=${GRACEGUARD_GOCACHE_MAX_GB:-20}
	if [ -d "$dir" ]; then
		gb=$(($(du -sk "$dir" 2>/dev/null | cut -f1) / 1048576))
		if [ "$gb" -gt "$max" ]; then
			info "Go's build cache holds ${gb} GB (over $max): emptying it"
			"$go" clean -cache
		fi
	fi
}

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPO_ROOT

# step TEXT: a heading, with the time since the script started (bash's
# SECONDS), so a CI log shows where its minutes went.
step() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
info() { printf '    %s\n' "$*" >&2; }

# cargo_install ARGS...: `cargo install` for a tool the scripts run, not for
# what graceguard ships: its release profile made light (no LTO, opt-level 1,
# 16 codegen units, no debug info), since the tools' own speed does not matter
# here (a test runner, an SBOM writer, a cross-linker) and their first build
# is part of a cold CI run. Its effect on that run was not measured apart.
cargo_install() {
	CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
		CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_INCREMENTAL=false cargo install "$@"
}

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

# The Kubernetes minors of tests/kube/versions (the one list of versions).
KUBE_VERSIONS_FILE="$REPO_ROOT/tests/kube/versions"

# kube_minors SELECTION: the minors a selection names, one per line, oldest
# first. ci (the oldest and the newest: what scripts/test runs), all, or a
# comma-separated list of minors such as 1.30,1.37.
kube_minors() {
	local all sel=$1 m
	all=$(awk '!/^#/ && NF { print $1 }' "$KUBE_VERSIONS_FILE")
	case "$sel" in
	ci) { head -n1 <<<"$all"; tail -n1 <<<"$all"; } | uniq ;;
	all) echo "$all" ;;
	*)
		for m in ${sel//,/ }; do
			m=${m#v}
			m=$(awk -F. '{ print $1 "." $2 }' <<<"$m")
			grep -qx "$m" <<<"$all" || die "reading the version '$sel'" "'$m' is not a minor of tests/kube/versions; use one of: $(tr '\n' ' ' <<<"$all")(or ci, all)"
			echo "$m"
		done
		;;
	esac
}

# The end-to-end tests scripts/test runs on the newest minor only, leaving
# them out of its pass on the oldest to stay inside the CI budget (the two
# passes are bound by the machine's 2 cores, not by waiting: docs/testbed.md).
# Each is a long replay or release mechanics whose subject is not the API
# server's version, and each has a shorter test that does run on the oldest:
#   demo                      every scenario replayed end to end (7-8 min at
#                             two places); on the oldest, each scenario's own
#                             test (collision_guard, real_nodes, storm, ...)
#   airflow_executor          Airflow's own executor, six runs with PostgreSQL;
#                             on the oldest, the sidecar's Airflow seed tests
#   airflow_seed_at_scale     the same seed at scale
#   the_flyte_seed_on_real_nodes  the Flyte seed on real nodes; on the oldest,
#                             real_nodes' preemption and drain tests
#   helm_install's registry, emergency-switch and previous-release upgrade
#                             tests (Helm 3 and 4 each, serialized on the pod
#                             network: 7.5 of the 1.30 pass's 13 minutes);
#                             on the oldest, helm_installs and host_network
# scripts/matrix runs every test on every minor, these included.
# shellcheck disable=SC2034 # read by scripts/test and scripts/matrix
NEWEST_ONLY_TESTS='binary(e2e) & (test(/^(demo|airflow_executor)::/) | test(airflow_seed_at_scale) | test(the_flyte_seed_on_real_nodes) | test(/^helm_install::.*(oci_registry|upgrades_from|emergency_switch)/))'

# kube_release MINOR: the release tests/kube/versions pins for MINOR (v1.30.14).
kube_release() {
	awk -v m="$1" '$1 == m { print $2 }' "$KUBE_VERSIONS_FILE"
}

# kube_version_ldflags VERSION: what `make` stamps into a release build; the
# components read their own version from it.
kube_version_ldflags() {
	local version=$1 v major minor pkg out="-s -w"
	v=${version#v}
	major=${v%%.*}
	minor=${v#*.}
	minor=${minor%%.*}
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		out+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	echo "$out"
}

# export_helm_tools: builds (or finds cached) Helm 4, Helm 3, helm-docs and
# cert-manager's CRDs, and exports where they are for the tests.
export_helm_tools() {
	local helm_json
	helm_json=$("$REPO_ROOT/scripts/install-helm" --json) || die "building helm" "see the message above"
	GRACEGUARD_HELM=$(jq -r .helm <<<"$helm_json")
	GRACEGUARD_HELM3=$(jq -r .helm3 <<<"$helm_json")
	GRACEGUARD_CERT_MANAGER_CRDS=$(jq -r .cert_manager_crds <<<"$helm_json")
	GRACEGUARD_HELM_DOCS=$(jq -r .helm_docs <<<"$helm_json")
	export GRACEGUARD_HELM GRACEGUARD_HELM3 GRACEGUARD_CERT_MANAGER_CRDS GRACEGUARD_HELM_DOCS
}

# build_go_tools NAME MODDIR PKG...: builds each Go package PKG (a `tool` of
# the pinned module in MODDIR) into $GRACEGUARD_CACHE/NAME/, one binary per
# package named for its last path element, and prints that directory. Reused
# while the module pin and the Go version are the same (a stamp records
# both); the build is locked against a concurrent one.
build_go_tools() {
	local name=$1 mod=$2 go want dir pkg
	shift 2
	dir="$GRACEGUARD_CACHE/$name"
	go=$(find_new_go) || die "finding Go >= 1.26" "install Go 1.26 or newer first on PATH (the machine's /usr/local/go)"
	mkdir -p "$GRACEGUARD_CACHE"
	(
		flock 9
		want="go=$("$go" env GOVERSION) mod=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1) pkgs=$*"
		[ "$(cat "$dir/stamp" 2>/dev/null)" = "$want" ] && exit 0
		step "building $* ($(realpath --relative-to="$REPO_ROOT" "$mod")) with $("$go" env GOVERSION)"
		rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
		for pkg in "$@"; do
			(cd "$mod" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
				"$go" build -trimpath -ldflags "-s -w" -o "$dir.tmp/${pkg##*/}" "$pkg" >&2) ||
				die "building $pkg" "see the Go errors above; the Go module proxy must be reachable the first time"
		done
		printf '%s\n' "$want" >"$dir.tmp/stamp"
		rm -rf "$dir" && mv "$dir.tmp" "$dir"
	) 9>"$GRACEGUARD_CACHE/.build-$name.lock" || exit 1
	echo "$dir"
}

# export_registry_tools: builds (or finds cached) the OCI registry and crane
# and exports where they are (GRACEGUARD_REGISTRY_TOOLS, a JSON file).
export_registry_tools() {
	GRACEGUARD_REGISTRY_TOOLS="$GRACEGUARD_CACHE/registry-tools.json"
	"$REPO_ROOT/scripts/install-registry" --json >"$GRACEGUARD_REGISTRY_TOOLS" || die "building the registry and crane" "see the message above"
	export GRACEGUARD_REGISTRY_TOOLS
}

# export_signing_tools: builds (or finds cached) cosign and cargo-cyclonedx
# and exports where they are (GRACEGUARD_SIGNING_TOOLS, a JSON file).
export_signing_tools() {
	GRACEGUARD_SIGNING_TOOLS="$GRACEGUARD_CACHE/signing-tools.json"
	"$REPO_ROOT/scripts/install-signing" --json >"$GRACEGUARD_SIGNING_TOOLS" || die "building cosign and cargo-cyclonedx" "see the message above"
	export GRACEGUARD_SIGNING_TOOLS
}

# export_previous_release: builds (or finds cached) the release an upgrade
# starts from (tests/previous-release) and exports where its description is
# (GRACEGUARD_PREVIOUS_RELEASE, a JSON file).
export_previous_release() {
	GRACEGUARD_PREVIOUS_RELEASE="$GRACEGUARD_CACHE/previous-release.json"
	"$REPO_ROOT/scripts/previous-release" --json >"$GRACEGUARD_PREVIOUS_RELEASE" || die "building the previous release" "see the message above"
	export GRACEGUARD_PREVIOUS_RELEASE
}

# export_promtool: installs promtool (Debian's prometheus package) and exports its path.
export_promtool() {
	GRACEGUARD_PROMTOOL=$("$REPO_ROOT/scripts/install-promtool" --json | jq -r .promtool) || die "installing promtool" "see the message above"
	export GRACEGUARD_PROMTOOL
}
