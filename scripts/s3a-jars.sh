#!/usr/bin/env bash
# Hadoop's S3A connector for the Spark side process (s3:// warehouses), installed into <prefix>/share/tabletopic/jars,
# where tabletopic.spark looks for it (Path(sys.prefix)/share/tabletopic/jars).
#   usage: scripts/s3a-jars.sh <prefix>   the Python environment tabletopic runs in: scripts/setup.sh passes the
#                                         venv, docker/Dockerfile /usr/local; <prefix>/bin/python runs pip.
# Quick (no download) when the pinned jars are already there.
#
# hadoop-aws and the AWS SDK bundle it was built against. No registry package carries hadoop-aws 3.3.4 (pyspark's
# Hadoop) or the AWS SDK v2 that Iceberg's S3FileIO needs; the sagemaker-pyspark 1.4.5 source package on PyPI carries
# hadoop-aws 3.3.1 and aws-java-sdk-bundle 1.11.901, which work beside pyspark's Hadoop 3.3.4 client
# (tests/test_table_topics_s3.py). The two jars are taken out of it, checksums pinned.
set -euo pipefail

PREFIX="${1:?usage: $0 <prefix of the Python environment tabletopic runs in, e.g. .venv or /usr/local>}"
S3_JARS="$PREFIX/share/tabletopic/jars"
s3_jar_sums="6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e  hadoop-aws-3.3.1.jar
b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead  aws-java-sdk-bundle-1.11.901.jar"
if ! (cd "$S3_JARS" 2>/dev/null && echo "$s3_jar_sums" | sha256sum --check --quiet --status); then
    echo "setup: fetching Hadoop's S3A connector for Spark (hadoop-aws 3.3.1 + AWS SDK bundle, from sagemaker-pyspark 1.4.5)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$PREFIX/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$tmp" sagemaker-pyspark==1.4.5
    tar -xzf "$tmp"/sagemaker_pyspark-1.4.5.tar.gz -C "$tmp" \
        sagemaker_pyspark-1.4.5/deps/jars/hadoop-aws-3.3.1.jar \
        sagemaker_pyspark-1.4.5/deps/jars/aws-java-sdk-bundle-1.11.901.jar
    (cd "$tmp/sagemaker_pyspark-1.4.5/deps/jars" && echo "$s3_jar_sums" | sha256sum --check --quiet)
    mkdir -p "$S3_JARS"
    mv "$tmp"/sagemaker_pyspark-1.4.5/deps/jars/*.jar "$S3_JARS/"
fi
