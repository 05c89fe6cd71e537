#!/usr/bin/env bash
# The whole suite: static checks first (ruff, mypy strict), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# test-only system package: a real PostgreSQL server for the PostgreSQL-catalog tests (installed when missing)
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "test setup: installing postgresql"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
