#!/usr/bin/env bash
# EMR bootstrap action: make Trino see the Glue-backed Iceberg catalog under the name `lakehouse`,
# so one SQL text (`SELECT ... FROM lakehouse.ods_behavior.clickevent`) runs on Spark and Trino.
# - Spark already gets `spark.sql.catalog.lakehouse` from the cluster's spark-defaults classification.
# - Hive reads the Glue databases directly through hive-site's Glue client factory (no catalog name).
# - Trino: EMR's `trino-connector-iceberg` classification only configures the catalog `iceberg`;
#   this script adds the same connector as `lakehouse`.
# Bootstrap actions run on every node BEFORE EMR installs the applications, so by default this
# returns at once and leaves a detached waiter that writes the catalog file once Trino is installed,
# then restarts Trino. The write is atomic and idempotent: same arguments, no rewrite, no restart.
set -euo pipefail

readonly SCRIPT=configure-catalogs
readonly USAGE="usage: configure-catalogs.sh --region REGION [--catalog NAME] [--root DIR] [--foreground]
       [--poll-seconds S] [--max-wait-seconds S] [--restart-command CMD]
  --region REGION         AWS region of the Glue catalog and the S3 warehouse (required)
  --catalog NAME          Trino catalog name (default lakehouse)
  --root DIR              file-system root, for tests (default /)
  --foreground            wait and write in the foreground instead of a detached waiter
  --poll-seconds S        how often to look for the Trino install (default 10)
  --max-wait-seconds S    give up after this long (default 3600)
  --restart-command CMD   run after the catalog file changed (default: systemctl try-restart trino-server)"

log() { printf '%s: [%s] %s\n' "$SCRIPT" "$(date -u +%FT%TZ)" "$*" >&2; }
usage() {
  log "$1"
  printf '%s\n' "$USAGE" >&2
  exit 2
}

original_args=("$@")
catalog=lakehouse region='' root=/ foreground=false poll_seconds=10 max_wait_seconds=3600
# try-restart: restarts a running Trino, and leaves one not started yet to EMR (it reads the file then).
restart_command="systemctl try-restart trino-server"
while (($# > 0)); do
  opt=$1
  case $opt in
    -h | --help) printf '%s\n' "$USAGE"; exit 0 ;;
    --foreground) foreground=true; shift; continue ;;
    --*) (($# >= 2)) || usage "$opt needs a value"; value=$2; shift 2 ;;
    *) usage "unexpected argument: $opt" ;;
  esac
  case $opt in
    --catalog) catalog=$value ;;
    --region) region=$value ;;
    --root) root=$value ;;
    --poll-seconds) poll_seconds=$value ;;
    --max-wait-seconds) max_wait_seconds=$value ;;
    --restart-command) restart_command=$value ;;
    *) usage "unknown option: $opt" ;;
  esac
done

seconds='^[0-9]+(\.[0-9]+)?$'
[[ -n $region ]] || usage "--region is required"
[[ $region =~ ^[a-z]{2}(-[a-z]+)+-[0-9]+$ ]] || usage "--region is not an AWS region: '$region'"
[[ $catalog =~ ^[a-z][a-z0-9_]*$ ]] || usage "--catalog must be lower-case letters, digits, _: '$catalog'"
[[ -d $root ]] || usage "--root is not a directory: '$root'"
[[ $poll_seconds =~ $seconds && ! $poll_seconds =~ ^[0.]+$ ]] || usage "--poll-seconds must be > 0: '$poll_seconds'"
[[ $max_wait_seconds =~ $seconds ]] || usage "--max-wait-seconds must be a number: '$max_wait_seconds'"
[[ -n $restart_command ]] || usage "--restart-command must not be empty"

# Bootstrap actions run as the hadoop user; /etc, /var/log and systemctl need root.
if ((EUID != 0)) && [[ $root == / ]]; then
  exec sudo -n -- "$BASH" "$0" "${original_args[@]}"
fi

prefix=${root%/}
trino_conf=$prefix/etc/trino/conf
trino_install=$prefix/usr/lib/trino
catalog_dir=$trino_conf/catalog
catalog_file=$catalog_dir/$catalog.properties

if [[ $foreground == false ]]; then
  log_file=$prefix/var/log/lakehouse-bootstrap/$SCRIPT.log
  mkdir -p "${log_file%/*}"
  # Detached from the bootstrap action: own session, no terminal, no inherited stdout/stderr.
  setsid nohup "$BASH" "$0" --foreground --catalog "$catalog" --region "$region" --root "$root" \
    --poll-seconds "$poll_seconds" --max-wait-seconds "$max_wait_seconds" \
    --restart-command "$restart_command" </dev/null >>"$log_file" 2>&1 &
  log "waiter started (pid $!): writes $catalog_file once Trino is installed; log: $log_file"
  exit 0
fi

# Microseconds since the epoch, and seconds ("1.5") as microseconds: bash has integers only.
now_us() { printf '%s' "${EPOCHREALTIME//[!0-9]/}"; }
to_us() {
  local whole=${1%%.*} fraction=000000
  [[ $1 == *.* ]] && fraction=${1#*.}000000
  printf '%s' $((10#$whole * 1000000 + 10#${fraction:0:6}))
}

catalog_properties() {
  cat <<EOF
# written by lakehouse bootstrap/configure-catalogs.sh
connector.name=iceberg
iceberg.catalog.type=glue
hive.metastore.glue.region=$region
fs.native-s3.enabled=true
s3.region=$region
iceberg.file-format=PARQUET
EOF
}

trino_installed() { [[ -d $trino_conf && -e $trino_install ]]; }

if ! trino_installed; then
  log "waiting for Trino: $trino_conf and $trino_install (poll ${poll_seconds}s, max ${max_wait_seconds}s)"
  deadline=$(($(now_us) + $(to_us "$max_wait_seconds")))
  until trino_installed; do
    if (($(now_us) >= deadline)); then
      log "gave up: Trino not installed after ${max_wait_seconds}s, $catalog_file not written." \
        "Is Trino among the cluster's applications? To retry: $0 --foreground --region $region --catalog $catalog"
      exit 1
    fi
    sleep "$poll_seconds"
  done
fi

if [[ -f $catalog_file ]] && cmp -s "$catalog_file" <(catalog_properties); then
  log "$catalog_file already up to date: nothing to do"
  exit 0
fi

mkdir -p "$catalog_dir"
# Atomic: Trino (or a reader) sees the old file or the new one, never half of it. The temp name
# does not end in .properties, so Trino never loads it as a catalog.
tmp=$(mktemp "$catalog_dir/.$catalog.XXXXXX")
trap 'rm -f "$tmp"' EXIT
catalog_properties >"$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$catalog_file"
log "wrote $catalog_file (Iceberg on Glue, region $region)"

log "restarting Trino to load catalog '$catalog': $restart_command"
if ! "$BASH" -c "$restart_command"; then
  log "restart failed: Trino loads '$catalog' at its next start; run 'sudo systemctl restart trino-server' on this node"
  exit 1
fi
log "done"
