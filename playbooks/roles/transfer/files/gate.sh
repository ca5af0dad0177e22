#!/bin/sh
# The only command another node's transfer key runs on this node (its authorized_keys line forces it): what the
# image and weights copies send, `docker load` and rsync's receiver into the weights folder, and nothing else,
# so that the key is no root shell here. The line names the copies its key makes here, as the gate's arguments:
# image (docker load), weights (rsync's receiver), or both. gate.conf beside it, written by the transfer role,
# names the folder (weights=) and the engine (docker_host=, empty for the default).
set -eu
copies="$*"
weights='' docker_host=''
while IFS='=' read -r key value; do
  case $key in
    weights) weights=$value ;;
    docker_host) docker_host=$value ;;
  esac
done < "$(dirname "$0")/gate.conf"
command=${SSH_ORIGINAL_COMMAND:-}

refuse() {
  echo "dsaops transfer gate on $(hostname): refused '$command': $1" >&2
  exit 2
}

may() {  # the copy $1 only where the key's line names it
  case " $copies " in
    *" $1 "*) ;;
    *) refuse "this key is authorized here for the copies its authorized_keys line names (${copies:-none}),\
 not the $1 copy" ;;
  esac
}

if [ "$command" = "docker load" ]; then
  may image
  if [ -n "$docker_host" ]; then
    export DOCKER_HOST="$docker_host"
  fi
  exec docker load
fi

set -f   # the words are split on blanks below, never globbed
# shellcheck disable=SC2086
set -- $command
if [ "$#" -lt 5 ] || [ "$1" != rsync ] || [ "$2" != --server ] || [ -z "$weights" ]; then
  refuse "another node's transfer key runs docker load and rsync's receiver into the weights folder, nothing else"
fi
may weights
# rsync --server -<options>e<capabilities> [--stats] [--partial-dir .rsync-partial] . <folder>/
case $3 in
  -[!-]*e*) options=${3#-} options=${options%%e*} ;;
  *) refuse "rsync $3: only rsync's receiver runs here" ;;
esac
case $options in
  *[!rtIR]*) refuse "rsync -$options: the weights copy sends only -r, -t, -I and -R (no links, devices, owners or deletes)" ;;
esac
shift 3
while [ "$#" -gt 2 ]; do
  case $1 in
    --stats | --partial-dir=.rsync-partial) ;;
    --partial-dir)
      if [ "$2" != .rsync-partial ]; then
        refuse "rsync --partial-dir $2: the weights copy keeps partial files in .rsync-partial"
      fi
      shift ;;
    *) refuse "rsync $1: not an option the weights copy sends" ;;
  esac
  shift
done
if [ "$#" -ne 2 ] || [ "$1" != . ] || [ "$2" != "$weights/" ]; then
  refuse "rsync writes only into $weights/ here"
fi
# shellcheck disable=SC2086
exec $command
