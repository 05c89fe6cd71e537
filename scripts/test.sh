#!/usr/bin/env bash
# The whole suite: static checks first (ruff, mypy strict), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# test-only system packages, installed when missing: a real PostgreSQL server for the PostgreSQL-catalog tests,
# kcat for the librdkafka command-line consumer tests
need_apt=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "test setup: installing ${need_apt[*]}"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
.venv/bin/ruff check .
.venv/bin/mypy
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider)
if [ "$#" -gt 0 ]; then  # chosen tests: one run
    exec "${PYTEST[@]}" --durations=25 "$@"
fi
# The whole suite in two pytest processes side by side (a 2-core machine waits on subprocesses most of the time):
# the modules that start Spark sessions in the test process, one after another in one of them (two sessions
# forking beside each other ran out of memory), with the two longest Spark-heavy modules, the TLS/SASL clients'
# module and the attach-against-Tansu module (mostly waiting on Tansu's slow rebalances) to even the halves out;
# everything else in the other. Each prints when it is done; the slowest tests of each are listed at the end of its
# output (the suite must stay fast).
spark_modules='^tests/test_(query_spark|query_catalog|spark_|table_topics\.py|table_topics_s3|table_topics_postgres|'
spark_modules+='table_topic_types|table_topic_upserts\.py|table_topic_v3|table_topic_maintenance|table_topic_upsert_faults|'
spark_modules+='security\.py|attach_clusters)'
mapfile -t spark < <(ls tests/test_*.py | grep -E "$spark_modules")
mapfile -t rest < <(ls tests/test_*.py | grep -vE "$spark_modules")
out="$(mktemp -d "${TMPDIR:-/tmp}/tabletopic-tests.XXXXXX")"
trap 'rm -rf "$out"' EXIT
"${PYTEST[@]}" --durations=15 --basetemp="$out/spark" "${spark[@]}" > "$out/spark.log" 2>&1 &
spark_pid=$!
"${PYTEST[@]}" --durations=15 --basetemp="$out/rest" "${rest[@]}" > "$out/rest.log" 2>&1 &
rest_pid=$!
rest_rc=0; wait "$rest_pid" || rest_rc=$?
echo "==== ${#rest[@]} modules (the half without Spark sessions): pytest exit code $rest_rc"
cat "$out/rest.log"
spark_rc=0; wait "$spark_pid" || spark_rc=$?
echo "==== ${#spark[@]} modules (Spark sessions in the test process, the heaviest Spark work): pytest exit code $spark_rc"
cat "$out/spark.log"
[ "$rest_rc" -eq 0 ] && [ "$spark_rc" -eq 0 ]
