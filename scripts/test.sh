#!/usr/bin/env bash
# The whole suite: static checks first (ruff, mypy strict), then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
