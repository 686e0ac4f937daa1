#!/usr/bin/env bash
# Builds the relocated Jackson jar that the Iceberg runtime jar from PyPI lacks
# (org/apache/iceberg/shaded/com/fasterxml/jackson/...), offline, from pyspark's own Jackson jars.
# Usage: scripts/build_iceberg_jars.sh VENV_DIR      Idempotent: does nothing when the jar exists.
set -euo pipefail
venv=${1:?usage: build_iceberg_jars.sh VENV_DIR}
out_dir="$venv/share/lakehouse/jars"
out="$out_dir/iceberg-jackson-relocated-2.15.2.jar"
[ -s "$out" ] && exit 0

jarjar=/usr/share/java/jarjar.jar
[ -f "$jarjar" ] || { echo "missing $jarjar: apt-get install libjarjar-java" >&2; exit 1; }
pyspark_jars=$("$venv/bin/python" -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/classes"
for name in jackson-core jackson-databind jackson-annotations; do
  jar=$(ls "$pyspark_jars"/$name-2.15.2.jar)
  (cd "$work/classes" && jar xf "$jar")
done
# Multi-release and module descriptors do not survive relocation; Iceberg needs neither.
rm -rf "$work/classes/module-info.class" "$work/classes/META-INF/versions"
(cd "$work/classes" && jar cf "$work/merged.jar" .)
echo 'rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1' > "$work/rules.txt"
java -jar "$jarjar" process "$work/rules.txt" "$work/merged.jar" "$work/relocated.jar"
mkdir -p "$out_dir"
mv "$work/relocated.jar" "$out"
echo "built $out"
