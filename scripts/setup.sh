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

# Hadoop's S3A connector for the Spark side process (s3:// warehouses): hadoop-aws and the AWS SDK bundle it was
# built against. No registry package carries hadoop-aws 3.3.4 (pyspark's Hadoop) or the AWS SDK v2 that Iceberg's
# S3FileIO needs; the sagemaker-pyspark 1.4.5 source package on PyPI carries hadoop-aws 3.3.1 and
# aws-java-sdk-bundle 1.11.901, which work beside pyspark's Hadoop 3.3.4 client (tests/test_table_topics_s3.py).
# The two jars are taken out of it (checksums pinned) into the venv, where tabletopic.spark looks for them.
S3_JARS="$VENV/share/tabletopic/jars"
s3_jar_sums="6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e  hadoop-aws-3.3.1.jar
b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead  aws-java-sdk-bundle-1.11.901.jar"
if ! (cd "$S3_JARS" 2>/dev/null && echo "$s3_jar_sums" | sha256sum --check --quiet --status); then
    echo "setup: fetching Hadoop's S3A connector for Spark (hadoop-aws 3.3.1 + AWS SDK bundle, from sagemaker-pyspark 1.4.5)"
    tmp="$(mktemp -d)"
    "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$tmp" sagemaker-pyspark==1.4.5
    tar -xzf "$tmp"/sagemaker_pyspark-1.4.5.tar.gz -C "$tmp" \
        sagemaker_pyspark-1.4.5/deps/jars/hadoop-aws-3.3.1.jar \
        sagemaker_pyspark-1.4.5/deps/jars/aws-java-sdk-bundle-1.11.901.jar
    (cd "$tmp/sagemaker_pyspark-1.4.5/deps/jars" && echo "$s3_jar_sums" | sha256sum --check --quiet)
    mkdir -p "$S3_JARS"
    mv "$tmp"/sagemaker_pyspark-1.4.5/deps/jars/*.jar "$S3_JARS/"
    rm -rf "$tmp"
fi
