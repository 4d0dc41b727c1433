# Makes the Python virtualenv of the sidecar API's clients and document:
# clients/python installed by pip (as a user installs it), pytest for its
# tests, openapi-spec-validator to validate guard/openapi.json and
# openapi-python-client + mypy to generate a client from it and type-check
# that. Source it; do not run it. Exports GRACEGUARD_CLIENTS_PY.
#
# The pinned tools are installed once (a stamp names them); clients/python
# is reinstalled every time, so the tests always run the working tree's.

_GG_CLIENTS_RECIPE=1
_GG_CLIENTS_PACKAGES=(pytest==9.2.0 openapi-spec-validator==0.9.0 openapi-python-client==0.29.1 mypy==2.4.1)

_gg_clients_venv() {
	local cache="${GRACEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceguard}"
	local venv="$cache/clients-venv"
	local python="${GRACEGUARD_PYTHON:-python3}"
	local repo
	repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
	_gg_fail() {
		printf '\nerror: %s failed.\n  fix: %s\n' "$1" "$2" >&2
		return 1
	}
	command -v "$python" >/dev/null 2>&1 || { _gg_fail "finding $python" "install Python 3.9 or newer, or set GRACEGUARD_PYTHON to one"; return 1; }
	local want_stamp
	want_stamp="recipe=$_GG_CLIENTS_RECIPE python=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') packages=${_GG_CLIENTS_PACKAGES[*]}"
	mkdir -p "$cache" || { _gg_fail "creating $cache" "make it writable, or set GRACEGUARD_CACHE"; return 1; }
	local lockfd
	exec {lockfd}>"$cache/.clients-venv.lock"
	flock "$lockfd"
	if ! { [ -x "$venv/bin/python" ] && [ "$(cat "$venv/stamp" 2>/dev/null)" = "$want_stamp" ]; }; then
		printf '\n==> %s\n' "building the clients venv in $venv (${_GG_CLIENTS_PACKAGES[*]})" >&2
		rm -rf "$venv"
		"$python" -m venv "$venv" >&2 &&
			"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${_GG_CLIENTS_PACKAGES[@]}" >&2 ||
			{ rm -rf "$venv"; exec {lockfd}>&-; _gg_fail "building $venv" "check that PyPI is reachable (pip's error is above) and re-run"; return 1; }
		printf '%s\n' "$want_stamp" >"$venv/stamp"
	fi
	# A copy, so pip's build leaves nothing in the working tree.
	local src
	src=$(mktemp -d)
	cp -r "$repo/clients/python/." "$src/"
	if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps --force-reinstall "$src" >&2; then
		rm -rf "$src"
		exec {lockfd}>&-
		_gg_fail "pip install ./clients/python" "see pip's error above"
		return 1
	fi
	rm -rf "$src"
	exec {lockfd}>&-
	GRACEGUARD_CLIENTS_PY="$venv/bin/python"
	export GRACEGUARD_CLIENTS_PY
}

_gg_clients_venv || { unset -f _gg_clients_venv _gg_fail; return 1 2>/dev/null || exit 1; }
unset -f _gg_clients_venv _gg_fail
