#!/usr/bin/env bash
# EMR bootstrap action (runs on every node, before EMR installs the applications): make sure the
# interpreter the jobs run with exists and works. The jobs' dependencies come per step in a
# `spark.archives` archive (a plain `pip install --target` tree run by this interpreter), so nothing
# else is installed here.
# Idempotent: when the interpreter is already there, it is only checked.
set -euo pipefail

readonly SCRIPT=node-setup
readonly USAGE="usage: node-setup.sh [--python PATH] [--root DIR] [--install-command CMD]
  --python PATH           interpreter the jobs use, named pythonX.Y (default /usr/bin/python3.11)
  --root DIR              file-system root, for tests (default /)
  --install-command CMD   how to install it when missing (default: dnf install -y pythonX.Y)"

log() { printf '%s: %s\n' "$SCRIPT" "$*" >&2; }
usage() {
  log "$1"
  printf '%s\n' "$USAGE" >&2
  exit 2
}

original_args=("$@")
python=/usr/bin/python3.11 root=/ install_command=''
while (($# > 0)); do
  opt=$1
  case $opt in
    -h | --help) printf '%s\n' "$USAGE"; exit 0 ;;
    --*) (($# >= 2)) || usage "$opt needs a value"; value=$2; shift 2 ;;
    *) usage "unexpected argument: $opt" ;;
  esac
  case $opt in
    --python) python=$value ;;
    --root) root=$value ;;
    --install-command) install_command=$value ;;
    *) usage "unknown option: $opt" ;;
  esac
done

[[ $python == /* ]] || usage "--python must be an absolute path, got '$python'"
[[ ${python##*/} =~ ^python([0-9]+)\.([0-9]+)$ ]] ||
  usage "--python must name a versioned interpreter (pythonX.Y), got '$python'"
major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
[[ -d $root ]] || usage "--root is not a directory: '$root'"
root=${root%/}
install_command=${install_command:-dnf install -y python$major.$minor}
target=$root$python

if [[ -x $target ]]; then
  log "$target present, nothing to install"
else
  # Bootstrap actions run as the hadoop user; installing needs root.
  if ((EUID != 0)) && [[ -z $root ]]; then
    exec sudo -n -- "$BASH" "$0" "${original_args[@]}"
  fi
  log "$target missing: running '$install_command'"
  "$BASH" -c "$install_command" || {
    log "install failed: '$install_command' exited $?; check the node's package repositories"
    exit 1
  }
  [[ -x $target ]] || {
    log "'$install_command' succeeded but $target is still missing; pass the right --install-command"
    exit 1
  }
fi

if ! version=$("$target" -c "import sys; assert sys.version_info[:2] == ($major, $minor); print(sys.version)" 2>&1); then
  log "$target does not run as Python $major.$minor: $version"
  exit 1
fi
log "$target OK: Python ${version%%$'\n'*}"
