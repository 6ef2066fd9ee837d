#!/usr/bin/env bash
# Throwaway S3-compatible server for tests and the quick start: S3Proxy (org.gaul:s3proxy) with
# jclouds' filesystem backend, built from Maven Central jars like kafka.sh's broker. No Docker.
#
#   deploy/local/s3.sh start    resolve jars (cached), start, wait until it answers HTTP; prints
#                               "s3 ready on http://127.0.0.1:PORT in N.Ns (...)"
#   deploy/local/s3.sh stop     SIGTERM with a deadline, then SIGKILL; keeps the data (S3_DATA_DIR)
#   deploy/local/s3.sh status   exit 0 and print the endpoint if running, else exit 1
#   deploy/local/s3.sh env      print the client's `export NAME=value` lines (exit 1 if not running)
#   deploy/local/s3.sh jars     resolve the jars only; prints their dir
#
# Interface (what other scripts and `gpuquota up --s3 local` rely on):
#   - endpoint: http://127.0.0.1:$S3_PORT, path-style addressing, Signature V2 or V4
#     (s3proxy.authorization=aws-v2-or-v4), any region name accepted (S3_REGION is what clients
#     are told, default us-east-1).
#   - one key pair: access key id $S3_ACCESS_KEY_ID (default "gpuquota-local"), secret in
#     $S3_RUN_DIR/secret (mode 600): S3_SECRET_ACCESS_KEY if given, else random, made once per run
#     dir and kept across restarts, so a restarted server takes the same key.
#   - after a successful start, in $S3_RUN_DIR:
#       endpoint    "http://127.0.0.1:PORT"
#       client.env  KEY=VALUE lines for the node agent (`set -a; . client.env; set +a`):
#                   GPUQUOTA_S3_ENDPOINT_URL, GPUQUOTA_S3_REGION, GPUQUOTA_S3_ACCESS_KEY_ID,
#                   GPUQUOTA_S3_SECRET_ACCESS_KEY_FILE
#       aws.env     KEY=VALUE lines for boto3 / the AWS CLI / the SageMaker SDK:
#                   AWS_ENDPOINT_URL_S3, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION
#   - `s3.sh env` prints both sets as `export` lines (the secret included: eval it, don't log it).
#   - buckets are directories under $S3_DATA_DIR; S3_BUCKETS="a b" creates them at start.
#   - unknown request headers are ignored (s3proxy.ignore-unknown-headers): boto3 >= 1.36 sends
#     flexible-checksum headers S3Proxy does not implement, and works unchanged this way.
#
# Environment:
#   S3_RUN_DIR        state dir: pid, endpoint, secret, logs (default .cache/s3-run)
#   S3_DATA_DIR       the buckets (default $S3_RUN_DIR/data)
#   S3_PORT           listening port (default: a free port)
#   S3_ACCESS_KEY_ID  default gpuquota-local
#   S3_SECRET_ACCESS_KEY  default: random, kept in $S3_RUN_DIR/secret
#   S3_REGION         default us-east-1
#   S3_BUCKETS        buckets to create at start, space-separated (default none)
#   S3_READY_TIMEOUT  seconds to wait for the server to answer (default 60)
#   S3_STOP_TIMEOUT   seconds to wait for it to stop before SIGKILL (default 15)
#   S3_HEAP_OPTS      default "-Xms64m -Xmx512m"
#   S3PROXY_LOG_LEVEL default INFO (logs in $S3_RUN_DIR/logs/server.out)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SCONF="$ROOT/deploy/local/s3"
RUN_DIR="${S3_RUN_DIR:-$ROOT/.cache/s3-run}"
DATA_DIR="${S3_DATA_DIR:-$RUN_DIR/data}"
CACHE_ROOT="$ROOT/.cache/s3-libs"
ACCESS_KEY="${S3_ACCESS_KEY_ID:-gpuquota-local}"
REGION="${S3_REGION:-us-east-1}"
BUCKETS="${S3_BUCKETS:-}"
READY_TIMEOUT="${S3_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${S3_STOP_TIMEOUT:-15}"
HEAP="${S3_HEAP_OPTS:--Xms64m -Xmx512m}"

log() { echo "s3.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

proc_running() {
  local st
  st="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ "$st" != Z* ]]
}

pid_alive() {
  # true if $1 is a live JVM started by this script for this run dir
  local pid="$1"
  [ -n "$pid" ] && proc_running "$pid" \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-Dgpuquota.s3.run=$RUN_DIR "
}

running_pid() {
  local pid=""
  [ -f "$RUN_DIR/s3.pid" ] && pid="$(cat "$RUN_DIR/s3.pid")"
  if pid_alive "$pid"; then echo "$pid"; fi
}

# Resolves S3Proxy's classpath into .cache/s3-libs/<hash of pom.xml>; reuses it without calling
# Maven when present. Prints the libs dir on stdout.
resolve_jars() {
  local hash libs t0 tmp mvnlog
  hash="$(sha256sum "$SCONF/pom.xml" | cut -c1-16)"
  libs="$CACHE_ROOT/$hash"
  t0="$(now)"
  if [ -f "$libs/.complete" ]; then
    log "s3proxy jars: cached in .cache/s3-libs/$hash ($(find "$libs" -name '*.jar' | wc -l) jars), $(elapsed "$t0")s"
  else
    command -v mvn >/dev/null || die "mvn not found; install Maven 3.8+ (apt-get install -y maven)"
    command -v java >/dev/null || die "java not found; install a JDK 17+ (apt-get install -y openjdk-17-jdk-headless)"
    mkdir -p "$CACHE_ROOT"
    tmp="$(mktemp -d "$CACHE_ROOT/.resolve.XXXXXX")"
    mvnlog="$tmp.log"
    if ! mvn -B -q -f "$SCONF/pom.xml" dependency:copy-dependencies \
        -Ds3.libs.dir="$tmp/libs" >"$mvnlog" 2>&1; then
      tail -40 "$mvnlog" >&2
      rm -rf "$tmp" "$mvnlog"
      die "maven could not resolve the S3Proxy jars (needs Maven Central or a warm ~/.m2)"
    fi
    rm -f "$mvnlog"
    touch "$tmp/libs/.complete"
    rm -rf "$libs"
    mv "$tmp/libs" "$libs"
    rm -rf "$tmp"
    log "s3proxy jars: resolved with maven into .cache/s3-libs/$hash ($(find "$libs" -name '*.jar' | wc -l) jars) in $(elapsed "$t0")s"
  fi
  echo "$libs"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

secret() {
  if [ ! -s "$RUN_DIR/secret" ]; then
    local value="${S3_SECRET_ACCESS_KEY:-}"
    [ -n "$value" ] || value="$(python3 -c 'import secrets; print(secrets.token_urlsafe(30))')"
    (umask 077 && printf '%s\n' "$value" >"$RUN_DIR/secret")
  fi
  cat "$RUN_DIR/secret"
}

wait_ready() {
  # the listener first, then one HTTP answer (403 without a signature is an answer)
  local port="$1" pid="$2" deadline
  deadline=$(($(date +%s) + READY_TIMEOUT))
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    proc_running "$pid" || { log "s3proxy exited during startup"; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
  python3 - "$port" <<'PY'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/", timeout=10)
except urllib.error.HTTPError:
    pass  # an S3 error document: the server answers
PY
}

start() {
  local pid libs port t0 key b
  mkdir -p "$RUN_DIR/logs" "$DATA_DIR"
  pid="$(running_pid)"
  if [ -n "$pid" ] && [ -f "$RUN_DIR/endpoint" ]; then
    log "already running (pid $pid) on $(cat "$RUN_DIR/endpoint")"
    return 0
  fi
  [ -n "$pid" ] && stop
  libs="$(resolve_jars)"
  rm -f "$RUN_DIR/endpoint" "$RUN_DIR/s3.pid"
  port="${S3_PORT:-$(free_port)}"
  key="$(secret)"
  for b in $BUCKETS; do mkdir -p "$DATA_DIR/$b"; done
  (umask 077 && cat >"$RUN_DIR/s3proxy.properties" <<EOF_PROPS
s3proxy.endpoint=http://127.0.0.1:$port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$ACCESS_KEY
s3proxy.credential=$key
s3proxy.ignore-unknown-headers=true
jclouds.provider=filesystem
jclouds.filesystem.basedir=$DATA_DIR
EOF_PROPS
  )
  t0="$(now)"
  # setsid: no terminal signals (Ctrl-C); callers stop it through 'stop'.
  # shellcheck disable=SC2086
  (exec setsid java $HEAP -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
      -Dgpuquota.s3.run="$RUN_DIR" -Dlogback.configurationFile="$SCONF/logback.xml" -cp "$libs/*" \
      org.gaul.s3proxy.Main --properties "$RUN_DIR/s3proxy.properties" \
      </dev/null >"$RUN_DIR/logs/server.out" 2>&1) &
  pid=$!
  echo "$pid" >"$RUN_DIR/s3.pid"
  if ! wait_ready "$port" "$pid"; then
    tail -40 "$RUN_DIR/logs/server.out" >&2 || true
    stop
    die "s3proxy did not become ready within ${READY_TIMEOUT}s"
  fi
  echo "http://127.0.0.1:$port" >"$RUN_DIR/endpoint"
  cat >"$RUN_DIR/client.env" <<EOF_ENV
GPUQUOTA_S3_ENDPOINT_URL=http://127.0.0.1:$port
GPUQUOTA_S3_REGION=$REGION
GPUQUOTA_S3_ACCESS_KEY_ID=$ACCESS_KEY
GPUQUOTA_S3_SECRET_ACCESS_KEY_FILE=$RUN_DIR/secret
EOF_ENV
  (umask 077 && cat >"$RUN_DIR/aws.env" <<EOF_AWS
AWS_ENDPOINT_URL_S3=http://127.0.0.1:$port
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$key
AWS_DEFAULT_REGION=$REGION
EOF_AWS
  )
  echo "s3 ready on http://127.0.0.1:$port in $(elapsed "$t0")s (pid $pid, access key $ACCESS_KEY, secret in $RUN_DIR/secret, data $DATA_DIR, logs $RUN_DIR/logs)"
}

stop() {
  local pid deadline
  pid="$(running_pid)"
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(($(date +%s) + STOP_TIMEOUT))
    while pid_alive "$pid" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    if pid_alive "$pid"; then
      log "s3proxy did not stop within ${STOP_TIMEOUT}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      while pid_alive "$pid"; do sleep 0.1; done
    fi
    log "stopped (pid $pid)"
  fi
  rm -f "$RUN_DIR/s3.pid" "$RUN_DIR/endpoint" "$RUN_DIR/client.env" "$RUN_DIR/aws.env"
}

status() {
  local pid
  pid="$(running_pid)"
  if [ -n "$pid" ] && [ -f "$RUN_DIR/endpoint" ]; then
    echo "s3 running (pid $pid) on $(cat "$RUN_DIR/endpoint")"
  else
    echo "s3 not running"
    return 1
  fi
}

print_env() {
  status >/dev/null || die "not running (deploy/local/s3.sh start)"
  local line
  while IFS= read -r line; do printf 'export %q\n' "$line"; done <"$RUN_DIR/client.env"
  while IFS= read -r line; do printf 'export %q\n' "$line"; done <"$RUN_DIR/aws.env"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) print_env ;;
  jars) resolve_jars ;;
  *) echo "usage: $0 start|stop|status|env|jars" >&2; exit 2 ;;
esac
