# Makes the Python virtualenv the chart tests run in (scripts/chart-tests: they
# call the real helm CLI that scripts/install-helm builds, parse its output
# with PyYAML, check values.schema.json with jsonschema, and scan the rendered
# chart with checkov, test_scan.py), and where the end-to-end tests run the
# official Kubernetes Python client (tests/clients/kubernetes-python). Source
# it; do not run it.
#
# Idempotent: a venv whose stamp matches the pinned packages is reused; a
# missing, broken or stale one is rebuilt. Exports GRACEGUARD_PY, the venv's
# python. Needs python3 >= 3.10 with the venv module, and PyPI.
#
#   source scripts/helm-venv.sh && "$GRACEGUARD_PY" scripts/chart-tests/run.py

# Bump RECIPE when the way the venv is built changes, so old ones are rebuilt.
_GG_HELM_RECIPE=3
# checkov's findings differ between releases: scripts/chart-tests/checkov-accepted.yaml
# is written for this one, and test_scan.py refuses to run another.
# kubernetes 36.0.3: 37.x conflicts with checkov 3.3.30's boto3 pin.
_GG_HELM_PACKAGES=(PyYAML==6.0.3 jsonschema==4.26.0 checkov==3.3.30 kubernetes==36.0.3)

_gg_helm_venv() {
	local cache="${GRACEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceguard}"
	local venv="$cache/helm-venv"
	local python="${GRACEGUARD_PYTHON:-python3}"

	_gg_fail() {
		printf '\nerror: %s failed.\n  fix: %s\n' "$1" "$2" >&2
		return 1
	}

	command -v "$python" >/dev/null 2>&1 ||
		{ _gg_fail "finding $python" "install Python 3.10 or newer (apt-get install python3 python3-venv), or set GRACEGUARD_PYTHON to one"; return 1; }
	local pyver
	pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])') ||
		{ _gg_fail "running $python" "check that '$python --version' works"; return 1; }
	"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' ||
		{ _gg_fail "checking the Python version ($pyver)" "the chart tests need Python 3.10 or newer; set GRACEGUARD_PYTHON to one"; return 1; }

	local want_stamp="recipe=$_GG_HELM_RECIPE python=$pyver packages=${_GG_HELM_PACKAGES[*]}"

	mkdir -p "$cache" || { _gg_fail "creating $cache" "make it writable, or set GRACEGUARD_CACHE to a writable directory"; return 1; }
	# One builder at a time (scripts/test and a developer's shell may race).
	local lockfd
	exec {lockfd}>"$cache/.helm-venv.lock"
	flock "$lockfd"

	local ok=0
	if [ -x "$venv/bin/python" ] && [ -f "$venv/stamp" ] && [ "$(cat "$venv/stamp")" = "$want_stamp" ] &&
		"$venv/bin/python" -c 'import yaml, jsonschema, checkov.version, kubernetes' >/dev/null 2>&1; then
		ok=1
	fi

	if [ "$ok" -eq 0 ]; then
		printf '\n==> %s\n' "building the Helm venv in $venv (${_GG_HELM_PACKAGES[*]})" >&2
		rm -rf "$venv"
		if ! "$python" -m venv "$venv" >&2; then
			rm -rf "$venv"
			exec {lockfd}>&-
			_gg_fail "creating the virtualenv $venv" "install the venv module (Debian: apt-get install python3-venv), or set GRACEGUARD_PYTHON to a Python that has it"
			return 1
		fi
		if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${_GG_HELM_PACKAGES[@]}" >&2; then
			rm -rf "$venv"
			exec {lockfd}>&-
			_gg_fail "pip install ${_GG_HELM_PACKAGES[*]}" "check that PyPI is reachable (pip's error is above) and re-run; wheels for this platform are needed for checkov's rustworkx"
			return 1
		fi
		if ! "$venv/bin/python" -c 'import yaml, jsonschema' >&2; then
			rm -rf "$venv"
			exec {lockfd}>&-
			_gg_fail "loading PyYAML and jsonschema" "the packages installed but do not import; see the Python error above"
			return 1
		fi
		if ! "$venv/bin/python" -c 'import checkov.version; print("checkov", checkov.version.version)' >&2; then
			rm -rf "$venv"
			exec {lockfd}>&-
			_gg_fail "loading checkov" "the package installed but does not import; see the Python error above"
			return 1
		fi
		printf '%s\n' "$want_stamp" >"$venv/stamp"
	fi
	exec {lockfd}>&-

	GRACEGUARD_PY="$venv/bin/python"
	export GRACEGUARD_PY
}

_gg_helm_venv || { unset -f _gg_helm_venv _gg_fail; return 1 2>/dev/null || exit 1; }
unset -f _gg_helm_venv _gg_fail
