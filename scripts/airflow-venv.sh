# Makes one Python virtualenv per Airflow provider version the Airflow seed
# measures (tests/src/airflow_executor.rs): apache-airflow 3.3.2 with
# apache-airflow-providers-cncf-kubernetes at that version, psycopg2 and
# asyncpg for the PostgreSQL metadata database, every other package pinned by
# tests/airflow/constraints.txt (Airflow's own constraint files live on a
# host this machine cannot reach). Source it; do not run it. Exports
# GRACEGUARD_AIRFLOW_PY_10_18_0 and GRACEGUARD_AIRFLOW_PY_10_25_0; graceguard's
# own executor (integrations/airflow) is installed into each, as a user does.

_GG_AIRFLOW_RECIPE=1
_GG_AIRFLOW_PROVIDERS=(10.18.0 10.25.0)

_gg_airflow_venvs() {
	local cache="${GRACEGUARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/graceguard}"
	local python="${GRACEGUARD_PYTHON:-python3}"
	local repo
	repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
	local constraints="$repo/tests/airflow/constraints.txt"
	_gg_fail() {
		printf '\nerror: %s failed.\n  fix: %s\n' "$1" "$2" >&2
		return 1
	}
	command -v "$python" >/dev/null 2>&1 || { _gg_fail "finding $python" "install Python 3.10 or newer, or set GRACEGUARD_PYTHON"; return 1; }
	mkdir -p "$cache" || { _gg_fail "creating $cache" "make it writable, or set GRACEGUARD_CACHE"; return 1; }
	local lockfd
	exec {lockfd}>"$cache/.airflow-venv.lock"
	flock "$lockfd"
	local v venv stamp
	for v in "${_GG_AIRFLOW_PROVIDERS[@]}"; do
		venv="$cache/airflow-venv-$v"
		stamp="recipe=$_GG_AIRFLOW_RECIPE provider=$v constraints=$(sha256sum "$constraints" | cut -c1-16)"
		if ! { [ -x "$venv/bin/python" ] && [ "$(cat "$venv/stamp" 2>/dev/null)" = "$stamp" ]; }; then
			printf '\n==> %s\n' "building the Airflow venv $venv (apache-airflow 3.3.2, cncf.kubernetes provider $v)" >&2
			rm -rf "$venv"
			"$python" -m venv "$venv" >&2 &&
				"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -c "$constraints" \
					apache-airflow==3.3.2 "apache-airflow-providers-cncf-kubernetes==$v" psycopg2-binary asyncpg >&2 &&
				"$venv/bin/python" -c 'import airflow.providers.cncf.kubernetes.executors.kubernetes_executor' >&2 ||
				{ rm -rf "$venv"; exec {lockfd}>&-; _gg_fail "building $venv" "check that PyPI is reachable (pip's error is above) and re-run"; return 1; }
			printf '%s\n' "$stamp" >"$venv/stamp"
		fi
		# graceguard's executor (integrations/airflow), from a copy so pip
		# leaves nothing in the working tree; every time, so it is the tree's.
		local src
		src=$(mktemp -d)
		cp -r "$repo/integrations/airflow/." "$src/"
		"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --no-deps --force-reinstall "$src" >&2 ||
			{ rm -rf "$src"; exec {lockfd}>&-; _gg_fail "pip install ./integrations/airflow into $venv" "see pip's error above"; return 1; }
		rm -rf "$src"
		export "GRACEGUARD_AIRFLOW_PY_${v//./_}=$venv/bin/python"
	done
	exec {lockfd}>&-
}

_gg_airflow_venvs || { unset -f _gg_airflow_venvs _gg_fail; return 1 2>/dev/null || exit 1; }
unset -f _gg_airflow_venvs _gg_fail
