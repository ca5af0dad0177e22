#!/usr/bin/env bash
# The image's entrypoint: `docker run IMAGE <sglang.launch_server args...>`.
#
# Starts SGLang with its output appended to $DSAOPS_LOG_FILE (rotated by size by
# `dsaops log-writer`: DSAOPS_LOG_MAX_BYTES, DSAOPS_LOG_KEEP; also shown by `docker logs`).
# DSAOPS_EXPORTER chooses where the exporter runs: 1 (the default, for an image run by hand)
# starts it here beside SGLang, following that log, with its state file on the log's volume;
# 0 leaves it to its own container (what the playbooks deploy).
# SIGTERM/SIGINT (`docker stop`) go to SGLang, which shuts down cleanly; the exporter is
# stopped after SGLang has exited, and the container exits with SGLang's status. Before that they
# end DSAOPS_BEFORE_START's command, and SGLang does not start (exit 143).
# A first argument that is not an option runs as a command instead (`docker run IMAGE bash`).
set -uo pipefail

if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    exec "$@"
fi

# PID 1 ignores a signal it has no trap for: from here on SIGTERM/SIGINT go to what runs now (the
# before-start command, then SGLang), and nothing starts after them.
stopping=""
child=""
trap 'stopping=1; kill -TERM "$child" 2>/dev/null' TERM INT
# Waits for $child, setting status to its exit status; `wait` returns early when a trapped signal arrives.
await_child() {
    [ -z "$stopping" ] || kill -TERM "$child" 2>/dev/null
    while :; do
        wait "$child"
        status=$?
        kill -0 "$child" 2>/dev/null || return 0
    done
}

log=${DSAOPS_LOG_FILE:-/var/log/dsaops/sglang.log}
port=${DSAOPS_SERVER_PORT:-30000}
# Where SGLang answers from this machine: loopback unless its --host is one address (then only that; IPv6 bracketed).
host=${DSAOPS_SERVER_HOST:-127.0.0.1}
# The module is a setting only so the entrypoint can be exercised where SGLang cannot serve (CI).
module=${DSAOPS_SERVER_MODULE:-sglang.launch_server}

# The health check and the exporter reach SGLang at DSAOPS_SERVER_HOST:DSAOPS_SERVER_PORT. Its --host and
# --port, on the command line or in its --config YAML, must agree (else exit 2 naming the -e setting to add);
# without a port from either, DSAOPS_SERVER_PORT becomes its --port (dsaops/server_address.py).
given=$(python3 -m dsaops.server_address "$host" "$port" -- "$@") || exit
[ -n "$given" ] || set -- "$@" --port "$port"

# The health check counts this node's scheduler ranks (a worker node's /health always answers 200);
# how many there are, SGLang's launch arguments say: worked out once, here (dsaops/node_ranks.py).
if [ -n "${DSAOPS_HEALTHCHECK_ARGS:-}" ]; then
    if ! ranks=$(python3 -m dsaops.node_ranks -- "$@") || ! mkdir -p "$(dirname "$DSAOPS_HEALTHCHECK_ARGS")" \
        || ! printf -- '--expect-ranks %s\n' "$ranks" > "$DSAOPS_HEALTHCHECK_ARGS"; then
        rm -f "$DSAOPS_HEALTHCHECK_ARGS"
        echo "dsaops-entrypoint: the health check will not count scheduler ranks (see above)" >&2
    fi
fi

# DSAOPS_BEFORE_START: a command to run before SGLang, whose failure stops the container (its status
# becomes the container's). The playbooks set it to the node's memory wait on unified memory, so a
# container that Docker restarts after a crash waits for the memory the crashed one held.
if [ -n "${DSAOPS_BEFORE_START:-}" ]; then
    # shellcheck disable=SC2086  # a command line: the words are its arguments
    $DSAOPS_BEFORE_START &
    child=$!
    await_child
    child=""
    [ "$status" = 0 ] || exit "$status"
fi
[ -z "$stopping" ] || exit 143

if ! mkdir -p "$(dirname "$log")" || ! touch "$log"; then
    echo "dsaops-entrypoint: cannot write DSAOPS_LOG_FILE=$log; mount a writable folder there or set it elsewhere" >&2
    exit 2
fi

# SGLang's output reaches the log and `docker logs` through the log writer; its pid is kept to wait
# for it at the end, so that SGLang's last lines (its shutdown) are written before this shell, PID 1
# of the container, exits and the kernel ends every process left in the container with it.
exec {out}> >(dsaops log-writer "$log")
writer_pid=$!
python3 -m "$module" "$@" >&"$out" 2>&1 &
child=$!
exec {out}>&-  # only SGLang holds the pipe now: the writer ends once SGLang and its children have exited

exporter=""
if [ "${DSAOPS_EXPORTER:-1}" != 0 ]; then
    # DSAOPS_EXPORTER_PLAN: `dsaops plan --json` output, for the "KV pool below plan" alert;
    # DSAOPS_EXPORTER_API_KEY_FILE: the server's API key, for /server_info (never on a command line);
    # DSAOPS_EXPORTER_TOKEN_FILE: the bearer token scrapes must carry, required unless it listens on
    # loopback (DSAOPS_EXPORTER_LISTEN, default 127.0.0.1:9860).
    options=()
    [ -z "${DSAOPS_EXPORTER_PLAN:-}" ] || options+=(--plan "$DSAOPS_EXPORTER_PLAN")
    [ -z "${DSAOPS_EXPORTER_API_KEY_FILE:-}" ] || options+=(--api-key-file "$DSAOPS_EXPORTER_API_KEY_FILE")
    [ -z "${DSAOPS_EXPORTER_TOKEN_FILE:-}" ] || options+=(--token-file "$DSAOPS_EXPORTER_TOKEN_FILE")
    state="$(dirname "$log")/dsaops-exporter.state.json"
    dsaops exporter --server-url "http://$host:$port" --log-file "$log" --state-file "$state" \
        --listen "${DSAOPS_EXPORTER_LISTEN:-127.0.0.1:9860}" --node "${DSAOPS_NODE:-$(hostname)}" "${options[@]}" &
    exporter=$!
fi

await_child

if [ -n "$exporter" ]; then
    kill -TERM "$exporter" 2>/dev/null
    wait "$exporter"
fi
# at most 5 s: a child of SGLang still holding the pipe must not keep the container alive
for _ in $(seq 50); do
    kill -0 "$writer_pid" 2>/dev/null || break
    sleep 0.1
done
exit "$status"
