#!/usr/bin/env bash
# Runs docker-compose.yml (the whole distributed system) on podman (or on a Docker daemon where one
# answers: deploy/local/images.sh engine), with nothing pulled from a registry:
#
#   deploy/local/compose.sh up     the images (deploy/local/images.sh, cached), podman's API socket,
#                                  `docker-compose up -d`; returns once the gateway answers on
#                                  http://127.0.0.1:$GPUQUOTA_COMPOSE_PORT (default 8642)
#   deploy/local/compose.sh down   `docker-compose down -v`: containers, network and volumes removed;
#                                  then the socket and the healthcheck runner stopped
#   deploy/local/compose.sh ARGS   any other docker-compose command on the same project and socket
#                                  (ps, logs scheduler, exec gateway gpuquota version, ...)
#
# The compose implementation is Debian's docker-compose 1.29 (installed here with apt-get, without its
# recommended Docker daemon) talking to podman's Docker-compatible API (`podman system service`): the
# same socket the testcontainers fixtures use, the compose-spec schema tests/unit/test_compose.py checks
# the file against, and network aliases, healthcheck conditions and restart policies as Docker has them.
# Debian's podman-compose 1.0.3 crashes on the node agents' network aliases; Compose v2 would be a Go
# build of ~200 modules on every fresh machine. docs/images.md says more.
#
# Podman runs a container's HEALTHCHECK from a systemd timer; without systemd (containers, CI
# sandboxes) it never runs and `depends_on: condition: service_healthy` would wait forever. So, while
# the project is up, a small loop here runs `podman healthcheck run` on its containers every
# $GPUQUOTA_COMPOSE_HEALTH_INTERVAL seconds (default 2), as the timer would.
#
# Environment: COMPOSE_PROJECT_NAME (default gpuquota), GPUQUOTA_COMPOSE_PORT (the gateway, default
# 8642), GPUQUOTA_COMPOSE_KAFKA_PORT (9094), GPUQUOTA_COMPOSE_POSTGRES_PORT (5432) on 127.0.0.1,
# GPUQUOTA_COMPOSE_TIMEOUT (seconds for `up`, default 300), COMPOSE_RUN_DIR (socket, pids, logs;
# default .cache/compose/$COMPOSE_PROJECT_NAME).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-gpuquota}"
export GPUQUOTA_COMPOSE_PORT="${GPUQUOTA_COMPOSE_PORT:-8642}"
RUN_DIR="${COMPOSE_RUN_DIR:-$ROOT/.cache/compose/$COMPOSE_PROJECT_NAME}"
TIMEOUT="${GPUQUOTA_COMPOSE_TIMEOUT:-300}"
HEALTH_INTERVAL="${GPUQUOTA_COMPOSE_HEALTH_INTERVAL:-2}"

log() { echo "compose.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_compose() {
  command -v docker-compose >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] || die "docker-compose missing: sudo apt-get install -y --no-install-recommends docker-compose"
  log "installing Debian's docker-compose (apt-get, without the Docker daemon it recommends)"
  local t0=$SECONDS
  {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker-compose; }
  } >&2 || die "apt-get install docker-compose failed"
  log "apt-get install took $((SECONDS - t0))s"
}

ENGINE="$(bash deploy/local/images.sh engine)"

socket() { # DOCKER_HOST of this project's podman API, started when it does not answer
  [ "$ENGINE" = docker ] && return 0 # a Docker daemon answers: compose talks to it
  DOCKER_HOST="$(bash deploy/local/podman.sh socket-start "$RUN_DIR")"
  export DOCKER_HOST
}

project_containers() {
  "$ENGINE" ps -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT_NAME"
}

health_loop() { # what podman's systemd timer would do: run each healthcheck now and then
  while :; do
    for id in $(project_containers); do
      podman healthcheck run "$id" >/dev/null 2>&1 || true # a failure is recorded in its state
    done
    sleep "$HEALTH_INTERVAL" # the timer's period, not a synchronisation
  done
}

start_health_loop() {
  [ "$ENGINE" = podman ] || return 0 # Docker runs healthchecks itself
  local pidfile="$RUN_DIR/health-loop.pid"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then return 0; fi
  health_loop </dev/null >/dev/null 2>&1 &
  echo $! >"$pidfile"
  disown
}

stop_health_loop() {
  local pidfile="$RUN_DIR/health-loop.pid"
  if [ -f "$pidfile" ]; then
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  fi
}

wait_for_gateway() {
  local url="http://127.0.0.1:$GPUQUOTA_COMPOSE_PORT/health/live" deadline=$((SECONDS + TIMEOUT))
  until curl -sf --max-time 5 "$url" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "the gateway does not answer $url after ${TIMEOUT}s"
    sleep 0.5 # polling the gateway's health endpoint
  done
}

up() {
  local t0=$SECONDS t1
  need_compose
  bash deploy/local/images.sh all
  t1=$SECONDS
  mkdir -p "$RUN_DIR"
  socket
  start_health_loop
  timeout "$TIMEOUT" docker-compose up -d --no-build >&2 || die "docker-compose up failed (compose.sh logs)"
  wait_for_gateway
  log "up in $((SECONDS - t1))s (images $((t1 - t0))s): gateway on http://127.0.0.1:$GPUQUOTA_COMPOSE_PORT"
}

down() {
  local t0=$SECONDS
  if [ -d "$RUN_DIR" ] || [ -n "$(project_containers)" ]; then
    need_compose
    socket
    docker-compose down -v --remove-orphans --timeout 20 >&2
  fi
  stop_health_loop
  if [ "$ENGINE" = podman ]; then bash deploy/local/podman.sh socket-stop "$RUN_DIR"; fi
  rm -rf "$RUN_DIR"
  log "down in $((SECONDS - t0))s"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  "") echo "usage: $0 up|down|DOCKER-COMPOSE-ARGS..." >&2; exit 2 ;;
  *) need_compose; mkdir -p "$RUN_DIR"; socket; exec docker-compose "$@" ;;
esac
