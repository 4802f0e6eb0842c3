#!/usr/bin/env bash
# podman's Docker-compatible service, for code that speaks the Docker Engine
# API through the docker SDK (toolkit check-image, the e2e runner): a real
# Docker engine where one exists, this service here (docs/images.md).
#
# Sourced (scripts/run-tests.sh does): exports CONTAINERS_CONF and
# DOCKER_HOST. A service already answering on $DOCKER_HOST is reused and left
# running; otherwise one is started on a socket of its own (a fresh directory,
# so parallel runs never share or stop each other's service) and stopped when
# the sourcing shell exits, after any EXIT trap the shell had already set.
#
# Run: scripts/podman-service.sh start|stop|status
#   on $DISPATCH_PODMAN_SOCKET (default /run/dispatch-k8s/podman.sock);
#   `start` prints the DOCKER_HOST line to eval.
#
# Invariant: this file stops only a service it started (its own pid file).

_dispatch_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CONTAINERS_CONF="$_dispatch_repo/scripts/containers.conf"

# _dispatch_podman_ping SOCKET: the service answers the Docker API's ping.
_dispatch_podman_ping() {
  [[ -S $1 ]] && curl -fsS --max-time 2 --unix-socket "$1" http://podman/_ping >/dev/null 2>&1
}

# _dispatch_podman_start SOCKET: starts the service on SOCKET unless it
# already answers; waits (at most 10 s) until it does.
_dispatch_podman_start() {
  local sock=$1 dir i
  _dispatch_podman_ping "$sock" && return 0
  dir=$(dirname "$sock")
  mkdir -p "$dir"
  rm -f "$sock"
  podman system service --time=0 "unix://$sock" >"$dir/service.log" 2>&1 &
  echo $! >"$sock.pid"
  for ((i = 0; i < 100; i++)); do
    _dispatch_podman_ping "$sock" && return 0
    kill -0 "$(cat "$sock.pid")" 2>/dev/null || break
    sleep 0.1
  done
  echo "podman-service: no answer on $sock; see $dir/service.log" >&2
  _dispatch_podman_stop "$sock"
  return 1
}

# _dispatch_podman_stop SOCKET: stops the service this file started there.
_dispatch_podman_stop() {
  local sock=$1 pid i
  [[ -f $sock.pid ]] || return 0
  pid=$(cat "$sock.pid")
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  rm -f "$sock.pid" "$sock"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  set -euo pipefail
  _dispatch_sock=${DISPATCH_PODMAN_SOCKET:-/run/dispatch-k8s/podman.sock}
  case ${1:-} in
    start)
      _dispatch_podman_start "$_dispatch_sock"
      echo "export DOCKER_HOST=unix://$_dispatch_sock CONTAINERS_CONF=$CONTAINERS_CONF"
      ;;
    stop) _dispatch_podman_stop "$_dispatch_sock" ;;
    status) _dispatch_podman_ping "$_dispatch_sock" && echo "answering on $_dispatch_sock" ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
  esac
elif [[ ${DOCKER_HOST:-} == unix://* ]] && _dispatch_podman_ping "${DOCKER_HOST#unix://}"; then
  : # an engine the caller already runs: use it, never stop it
else
  _dispatch_sock=$(mktemp -d "${TMPDIR:-/tmp}/dispatch-podman.XXXXXX")/podman.sock
  _dispatch_podman_start "$_dispatch_sock" || return 1
  export DOCKER_HOST="unix://$_dispatch_sock"
  # Chain after the shell's own EXIT trap, if it has one, rather than replace it.
  # `trap -p EXIT` prints "trap -- 'CMD' EXIT", quoted for eval.
  _dispatch_prior=$(trap -p EXIT)
  if [[ -n $_dispatch_prior ]]; then
    _dispatch_words=()
    eval "_dispatch_words=($_dispatch_prior)"
    _dispatch_prior="${_dispatch_words[2]}; "
  fi
  # shellcheck disable=SC2064 # expanded now on purpose: the socket and prior trap are fixed here
  trap "${_dispatch_prior}_dispatch_podman_stop '$_dispatch_sock'; rm -rf '${_dispatch_sock%/*}'" EXIT
  unset _dispatch_prior _dispatch_words
fi
