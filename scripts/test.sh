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
# two workers (pytest-xdist): the modules that run JVMs (tests/conftest.py's "jvm" group) on one, one after the
# other, so that two never hold their memory at once, the rest on the other; the slowest tests are listed at the
# end (the suite must stay fast on a 2-core machine)
exec .venv/bin/python -m pytest -p no:cacheprovider -n 2 --dist loadgroup --durations=25 "$@"
