#!/usr/bin/env bash
# Provisions Kafka and PostgreSQL for the test suite, runs pytest, and tears down what it started.
#
#   deploy/local/test-stack.sh [pytest args...]
#
# - KAFKA_BOOTSTRAP_SERVERS set: use that broker, start none. Otherwise start deploy/local/kafka.sh.
# - DATABASE_URL set: use that database, start none. Otherwise start deploy/local/postgres.sh.
# Both are exported to pytest. Also podman's Docker-compatible API on a socket of this run, exported as
# GPUQUOTA_TEST_DOCKER_HOST (not DOCKER_HOST: the plugin's auto mode would then run every
# gpuquota_stack in a container) for the tests that use testcontainers (tests/testcontainers_services.py).
# Whatever this script started is stopped on exit, on failure and on Ctrl-C/SIGTERM (trap). Exit status is pytest's (5 = no tests collected), or 1 if provisioning failed.
#
# GPUQUOTA_TIMINGS_FILE (optional): file that receives "provision_s=", "tests_s=", "pytest_rc=" lines.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTEST="${PYTEST:-$ROOT/.venv/bin/pytest}"
# private state per invocation, so concurrent runs in one checkout do not share a broker
mkdir -p "$ROOT/.cache/test-stack"
STACK_DIR="$(mktemp -d "$ROOT/.cache/test-stack/run.XXXXXX")"
export KAFKA_RUN_DIR="$STACK_DIR/kafka"
export PG_RUN_DIR="$STACK_DIR/postgres"
TIMINGS="${GPUQUOTA_TIMINGS_FILE:-/dev/null}"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

started_kafka=0
started_pg=0
started_api=0
pg_job=""
cleaned=0
cleanup() {
  local rc=$?
  [ "$cleaned" = 1 ] && return
  cleaned=1
  trap '' INT TERM # finish tearing down even on a second Ctrl-C
  if [ -n "$pg_job" ]; then wait "$pg_job" 2>/dev/null || true; fi
  local t0
  t0="$(now)"
  if [ "$started_kafka" = 1 ]; then bash deploy/local/kafka.sh stop || true; fi
  if [ "$started_pg" = 1 ]; then bash deploy/local/postgres.sh stop || true; fi
  if [ "$started_api" = 1 ]; then bash deploy/local/podman.sh socket-stop "$STACK_DIR/podman" || true; fi
  if [ "$started_kafka" = 1 ] || [ "$started_pg" = 1 ]; then
    echo "test-stack: teardown took $(elapsed "$t0")s"
  fi
  if [ "$rc" = 0 ]; then
    rm -rf "$STACK_DIR"
  else
    echo "test-stack: logs kept in ${STACK_DIR#"$ROOT"/}"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

t_prov="$(now)"
if [ -z "${DATABASE_URL:-}" ]; then
  started_pg=1
  # start PostgreSQL in the background while the JVM starts
  bash deploy/local/postgres.sh start &
  pg_job=$!
else
  echo "test-stack: using DATABASE_URL from the environment"
fi
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  started_kafka=1
  bash deploy/local/kafka.sh start
  KAFKA_BOOTSTRAP_SERVERS="$(cat "$KAFKA_RUN_DIR/bootstrap")"
else
  echo "test-stack: using KAFKA_BOOTSTRAP_SERVERS=$KAFKA_BOOTSTRAP_SERVERS from the environment"
fi
if [ -n "$pg_job" ]; then
  job="$pg_job"
  pg_job=""
  wait "$job" || { echo "test-stack: PostgreSQL failed to start" >&2; exit 1; }
  DATABASE_URL="$(cat "$PG_RUN_DIR/url")"
fi
export KAFKA_BOOTSTRAP_SERVERS DATABASE_URL
if [ -z "${GPUQUOTA_TEST_DOCKER_HOST:-}" ] && command -v podman >/dev/null 2>&1; then
  started_api=1
  if GPUQUOTA_TEST_DOCKER_HOST="$(bash deploy/local/podman.sh socket-start "$STACK_DIR/podman")"; then
    export GPUQUOTA_TEST_DOCKER_HOST
    echo "test-stack: podman's Docker API on $GPUQUOTA_TEST_DOCKER_HOST"
  else
    echo "test-stack: WARNING: podman's Docker API did not start; the testcontainers tests start their own" >&2
  fi
fi
provision_s="$(elapsed "$t_prov")"
echo "test-stack: provisioning took ${provision_s}s (KAFKA_BOOTSTRAP_SERVERS=$KAFKA_BOOTSTRAP_SERVERS)"
echo "provision_s=$provision_s" >>"$TIMINGS"

t_tests="$(now)"
set +e
"$PYTEST" "$@"
pytest_rc=$?
set -e
tests_s="$(elapsed "$t_tests")"
echo "test-stack: pytest exited $pytest_rc after ${tests_s}s"
printf 'tests_s=%s\npytest_rc=%s\n' "$tests_s" "$pytest_rc" >>"$TIMINGS"
exit "$pytest_rc"
