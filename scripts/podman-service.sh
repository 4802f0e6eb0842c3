#!/usr/bin/env bash
# podman's Docker-compatible service, for code that speaks the Docker Engine
# API through the docker SDK (toolkit check-image, the e2e runner).
#
# Sourced: starts the service if it is not answering, exports DOCKER_HOST and
# CONTAINERS_CONF, and stops it when the sourcing shell exits.
# Run:     scripts/podman-service.sh start|stop
_dispatch_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export CONTAINERS_CONF="$_dispatch_repo/scripts/containers.conf"
_dispatch_sock=${DISPATCH_PODMAN_SOCKET:-/run/dispatch-podman/docker.sock}
export DOCKER_HOST="unix://$_dispatch_sock"

_dispatch_podman_ping() {
  curl -fsS --max-time 2 --unix-socket "$_dispatch_sock" http://d/_ping >/dev/null 2>&1
}

_dispatch_podman_start() {
  _dispatch_podman_ping && return 0
  mkdir -p "$(dirname "$_dispatch_sock")"
  rm -f "$_dispatch_sock"
  podman system service --time=0 "unix://$_dispatch_sock" \
    >"$(dirname "$_dispatch_sock")/service.log" 2>&1 &
  echo $! >"$(dirname "$_dispatch_sock")/service.pid"
  local _
  for _ in $(seq 100); do
    _dispatch_podman_ping && return 0
    sleep 0.1
  done
  echo "podman-service: the service did not answer on $_dispatch_sock" >&2
  return 1
}

_dispatch_podman_stop() {
  local pidfile
  pidfile="$(dirname "$_dispatch_sock")/service.pid"
  if [[ -f $pidfile ]]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile" "$_dispatch_sock"
  fi
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
  case ${1:-} in
    start) _dispatch_podman_start ;;
    stop) _dispatch_podman_stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
  esac
else
  _dispatch_podman_start || return 1
  trap _dispatch_podman_stop EXIT
fi
