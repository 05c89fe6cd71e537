#!/usr/bin/env bash
# One set-up for `make run` and `make test`: a repo-local .venv with the project and everything it needs,
# plus the system packages (Java, JDBC drivers) installed only when missing. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV=.venv
STAMP="$VENV/.tabletopic-installed"

need_apt=()
# Debian's python3 needs its venv/ensurepip package before `python3 -m venv` works
"$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=("python3-venv")
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
[ -f /usr/share/java/sqlite-jdbc.jar ] || need_apt+=(libxerial-sqlite-jdbc-java)
[ -f /usr/share/java/postgresql.jar ] || need_apt+=(libpostgresql-jdbc-java)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "setup: installing system packages: ${need_apt[*]}"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi

want="$(cat pyproject.toml | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "setup: installing tabletopic and its dependencies into $VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -e '.[test]'
    echo "$want" > "$STAMP"
fi

# Hadoop's S3A connector for the Spark side process (s3:// warehouses): pinned jars into the venv, where
# tabletopic.spark looks for them (scripts/s3a-jars.sh; docker/Dockerfile installs the same ones)
bash scripts/s3a-jars.sh "$VENV"
