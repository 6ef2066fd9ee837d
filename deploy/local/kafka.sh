#!/usr/bin/env bash
# Throwaway single-node Apache Kafka broker (KRaft, broker+controller in one JVM) built from
# Maven Central jars. No Docker, no tarball download.
#
#   deploy/local/kafka.sh start    resolve jars (cached), format storage, start, wait until a
#                                  client can produce; prints "kafka ready on 127.0.0.1:PORT in N.Ns"
#   deploy/local/kafka.sh start --sasl
#                                  the same with SASL/SCRAM (as KAFKA_SASL=scram): see below
#   deploy/local/kafka.sh stop     SIGTERM (controlled shutdown) with a deadline, then SIGKILL;
#                                  removes the data dir
#   deploy/local/kafka.sh status   exit 0 and print the bootstrap address if running, else exit 1
#
# Environment:
#   KAFKA_RUN_DIR        state dir: pid, bootstrap, logs (default .cache/kafka-run)
#   KAFKA_PORT           broker port (default: a free port)
#   KAFKA_CONTROLLER_PORT controller port (default: a free port)
#   KAFKA_PYTHON         python with aiokafka for the readiness probe (default .venv/bin/python)
#   KAFKA_READY_TIMEOUT  seconds to wait for the broker to accept produce requests (default 60)
#   KAFKA_STOP_TIMEOUT   seconds to wait for a clean shutdown before SIGKILL (default 30)
#   KAFKA_HEAP_OPTS      default "-Xms512m -Xmx1g"
#   KAFKA_GC_OPTS        default "-XX:+UseSerialGC"; GC pauses are logged to $KAFKA_RUN_DIR/logs/gc.log
#   KAFKA_JIT_OPTS       default "-XX:TieredStopAtLevel=1" (C1 only: starts fast, for tests); "" lets
#                        C2 compile the hot paths (less CPU per record after warm-up: benchmarks)
#   KAFKA_SASL           "scram": the client listener is SASL_PLAINTEXT with SCRAM-SHA-512 only (no
#                        plaintext listener); default "" (PLAINTEXT, no authentication)
#   KAFKA_SASL_USER      the SCRAM user created at format time, also used between the broker and
#                        itself (default admin)
#   KAFKA_SASL_PASSWORD  its password (default: a random one); letters, digits and ._~+- only
#   KAFKA_SASL_USERS     more SCRAM users, space-separated (e.g. "gateway scheduler node events"),
#                        each with a random password in $KAFKA_RUN_DIR/sasl-password-<user>
#   KAFKA_ACLS           "1" (with KAFKA_SASL=scram): ACLs are enforced (StandardAuthorizer; no ACL
#                        means no access); KAFKA_SASL_USER is a super user, and so is the controller
#                        listener's ANONYMOUS, which only this JVM reaches on 127.0.0.1
#
# After a successful start, $KAFKA_RUN_DIR/bootstrap holds "127.0.0.1:PORT". With SASL, also
# $KAFKA_RUN_DIR/sasl-password (the password, mode 600) and $KAFKA_RUN_DIR/client.env, the GPUQUOTA_*
# variables of a client (KEY=VALUE lines: `set -a; . "$KAFKA_RUN_DIR/client.env"; set +a`). The
# controller listener stays PLAINTEXT on 127.0.0.1 (KRaft combined mode: only this JVM uses it).
# $KAFKA_RUN_DIR/admin.properties is a Kafka CLI client config of that user (--command-config).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KCONF="$ROOT/deploy/local/kafka"
RUN_DIR="${KAFKA_RUN_DIR:-$ROOT/.cache/kafka-run}"
CACHE_ROOT="$ROOT/.cache/kafka-libs"
PYTHON="${KAFKA_PYTHON:-$ROOT/.venv/bin/python}"
READY_TIMEOUT="${KAFKA_READY_TIMEOUT:-60}"
STOP_TIMEOUT="${KAFKA_STOP_TIMEOUT:-30}"
HEAP="${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g}"
GC="${KAFKA_GC_OPTS:--XX:+UseSerialGC}"
JIT="${KAFKA_JIT_OPTS--XX:TieredStopAtLevel=1}"
SASL="${KAFKA_SASL:-}"
SASL_USER="${KAFKA_SASL_USER:-admin}"
SASL_USERS="${KAFKA_SASL_USERS:-}"
ACLS="${KAFKA_ACLS:-}"
SASL_MECHANISM=SCRAM-SHA-512

log() { echo "kafka.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

proc_running() {
  # true if process $1 exists and is not a zombie
  local st
  st="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  [[ "$st" != Z* ]]
}

pid_alive() {
  # true if $1 is a live JVM started by this script for this run dir
  local pid="$1"
  [ -n "$pid" ] && proc_running "$pid" \
    && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-Dgpuquota.kafka.run=$RUN_DIR "
}

running_pid() {
  local pid=""
  [ -f "$RUN_DIR/kafka.pid" ] && pid="$(cat "$RUN_DIR/kafka.pid")"
  if pid_alive "$pid"; then echo "$pid"; fi
}

# Resolves the broker classpath into .cache/kafka-libs/<hash of pom.xml>; reuses it without
# calling Maven when present. Prints the libs dir on stdout.
resolve_jars() {
  local hash libs t0 tmp mvnlog
  hash="$(sha256sum "$KCONF/pom.xml" | cut -c1-16)"
  libs="$CACHE_ROOT/$hash"
  t0="$(now)"
  if [ -f "$libs/.complete" ]; then
    log "kafka jars: cached in .cache/kafka-libs/$hash ($(find "$libs" -name '*.jar' | wc -l) jars), $(elapsed "$t0")s"
  else
    command -v mvn >/dev/null || die "mvn not found; install Maven 3.8+ (apt-get install -y maven)"
    command -v java >/dev/null || die "java not found; install a JDK 17+ (apt-get install -y openjdk-17-jdk-headless)"
    mkdir -p "$CACHE_ROOT"
    tmp="$(mktemp -d "$CACHE_ROOT/.resolve.XXXXXX")"
    mvnlog="$tmp.log"
    # Maven reads ~/.m2 first and goes to Maven Central only for what is missing
    # (maven-dependency-plugin 3.8.1 included), so this works offline once ~/.m2 is warm.
    if ! mvn -B -q -f "$KCONF/pom.xml" dependency:copy-dependencies \
        -Dkafka.libs.dir="$tmp/libs" >"$mvnlog" 2>&1; then
      tail -40 "$mvnlog" >&2
      rm -rf "$tmp" "$mvnlog"
      die "maven could not resolve the broker jars (needs Maven Central or a warm ~/.m2 with maven-dependency-plugin 3.8.1)"
    fi
    rm -f "$mvnlog"
    check_single_slf4j_provider "$tmp/libs"
    touch "$tmp/libs/.complete"
    rm -rf "$libs"
    mv "$tmp/libs" "$libs"
    rm -rf "$tmp"
    log "kafka jars: resolved with maven into .cache/kafka-libs/$hash ($(find "$libs" -name '*.jar' | wc -l) jars) in $(elapsed "$t0")s"
  fi
  check_single_slf4j_provider "$libs"
  echo "$libs"
}

check_single_slf4j_provider() {
  local providers n
  providers="$(find "$1" -maxdepth 1 -name '*.jar' -printf '%f\n' | grep -E \
    '^(log4j-slf4j2?-impl|slf4j-(reload4j|log4j12|simple|nop|jdk14|jcl)|logback-classic)-[0-9]' || true)"
  n="$(printf '%s' "$providers" | grep -c . || true)"
  [ "$n" = 1 ] || die "expected exactly one SLF4J provider on the broker classpath, found $n: ${providers:-none}"
}

free_ports() {
  python3 - <<'PY'
import socket
socks = []
for _ in range(2):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
PY
}

probe() {
  # Succeeds once a producer can write to a probe topic (auto-created) on $1.
  "$PYTHON" - "$1" "$2" <<'PY'
import asyncio, logging, os, sys, time
from aiokafka import AIOKafkaProducer

logging.basicConfig(level=logging.CRITICAL)  # "topic not found" warnings are expected here

bootstrap, timeout = sys.argv[1], float(sys.argv[2])
sasl = {}
if os.environ.get("PROBE_SASL_USER"):  # the password comes through the environment, not argv
    sasl = dict(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=os.environ["PROBE_SASL_MECHANISM"],
        sasl_plain_username=os.environ["PROBE_SASL_USER"],
        sasl_plain_password=os.environ["PROBE_SASL_PASSWORD"],
    )

async def once() -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, **sasl)
    await producer.start()
    try:
        await producer.send_and_wait("__gpuquota_probe", b"ping")
    finally:
        await producer.stop()

async def main() -> int:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            await asyncio.wait_for(once(), timeout=max(1.0, deadline - time.monotonic()))
            return 0
        except Exception as exc:  # broker not ready yet
            last = exc
            await asyncio.sleep(0.25)
    print(f"probe: broker {bootstrap} not producible after {timeout}s: {last!r}", file=sys.stderr)
    return 1

sys.exit(asyncio.run(main()))
PY
}

start() {
  local pid libs ports port cport data cid t0
  pid="$(running_pid)"
  if [ -n "$pid" ] && [ -f "$RUN_DIR/bootstrap" ]; then
    log "already running (pid $pid) on $(cat "$RUN_DIR/bootstrap")"
    return 0
  fi
  [ -n "$pid" ] && stop
  [ -x "$PYTHON" ] || die "readiness probe needs python with aiokafka at $PYTHON (run 'make install' or set KAFKA_PYTHON)"
  libs="$(resolve_jars)"

  mkdir -p "$RUN_DIR/logs"
  rm -f "$RUN_DIR/bootstrap" "$RUN_DIR/kafka.pid"
  ports="$(free_ports)"
  port="${KAFKA_PORT:-${ports% *}}"
  cport="${KAFKA_CONTROLLER_PORT:-${ports#* }}"
  data="$(mktemp -d "${TMPDIR:-/tmp}/gpuquota-kafka.XXXXXX")"
  echo "$data" >"$RUN_DIR/datadir"
  sed -e "s#@DATA@#$data#g" -e "s#@PORT@#$port#g" -e "s#@CPORT@#$cport#g" \
    "$KCONF/server.properties.in" >"$RUN_DIR/server.properties"
  local scram=()
  if [ "$SASL" = scram ]; then
    sasl_configure "$port" "$cport"
    scram=(--add-scram "$SASL_MECHANISM=[name=$SASL_USER,password=$(cat "$RUN_DIR/sasl-password")]")
    local user
    for user in $SASL_USERS; do
      scram+=(--add-scram "$SASL_MECHANISM=[name=$user,password=$(cat "$RUN_DIR/sasl-password-$user")]")
    done
  fi

  local logopts=(-Dlog4j2.configurationFile="$KCONF/log4j2.properties" -Dkafka.logs.dir="$RUN_DIR/logs")
  t0="$(now)"
  # base64url of a random UUID; like Kafka's Uuid.randomUuid, never starting with "-" (an id such
  # as "-abc..." would be parsed as an option)
  cid="$(python3 -c 'import base64,uuid
while (c := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"): pass
print(c)')"
  if ! java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 "${logopts[@]}" -cp "$libs/*" \
      kafka.tools.StorageTool format --cluster-id="$cid" -c "$RUN_DIR/server.properties" "${scram[@]}" \
      >"$RUN_DIR/logs/format.out" 2>&1; then
    cat "$RUN_DIR/logs/format.out" >&2
    rm -rf "$data"
    die "kafka storage format failed"
  fi

  # setsid: the broker gets no terminal signals (Ctrl-C); callers stop it through 'stop'.
  # shellcheck disable=SC2086
  (exec setsid java $HEAP $GC -Xlog:gc:file="$RUN_DIR/logs/gc.log":uptime $JIT -Djava.awt.headless=true \
      -Dgpuquota.kafka.run="$RUN_DIR" "${logopts[@]}" -cp "$libs/*" \
      kafka.Kafka "$RUN_DIR/server.properties" </dev/null >"$RUN_DIR/logs/server.out" 2>&1) &
  pid=$!
  echo "$pid" >"$RUN_DIR/kafka.pid"

  if ! probe_until_ready "127.0.0.1:$port" "$pid"; then
    tail -60 "$RUN_DIR/logs/server.out" >&2 || true
    stop
    die "kafka did not become ready within ${READY_TIMEOUT}s"
  fi
  if grep -qE 'SLF4J\(W\): (No SLF4J providers|Class path contains multiple)' "$RUN_DIR/logs/server.out"; then
    grep -E 'SLF4J' "$RUN_DIR/logs/server.out" >&2
    stop
    die "SLF4J provider problem (see above)"
  fi
  echo "127.0.0.1:$port" >"$RUN_DIR/bootstrap"
  local mode=""
  [ "$SASL" = scram ] && mode=", SASL_PLAINTEXT $SASL_MECHANISM user $SASL_USER: client settings in $RUN_DIR/client.env"
  echo "kafka ready on 127.0.0.1:$port in $(elapsed "$t0")s (pid $pid, controller $cport, logs $RUN_DIR/logs$mode)"
}

# SASL/SCRAM mode: the client listener and the broker's own connections to it (inter-broker) take
# SCRAM-SHA-512; the user exists from the start because format writes its credentials (KRaft has no
# ZooKeeper to add them to before the broker runs). Writes the password and the client's variables.
sasl_configure() {
  local port="$1" cport="$2" password="${KAFKA_SASL_PASSWORD:-}"
  [ "$SASL" = scram ] || die "KAFKA_SASL must be scram or empty, not '$SASL'"
  [[ "$SASL_USER" =~ ^[A-Za-z0-9._-]+$ ]] || die "KAFKA_SASL_USER: letters, digits and ._- only"
  if [ -z "$password" ]; then
    password="$(python3 -c 'import secrets; print(secrets.token_urlsafe(18))')"
  fi
  # the password is written into the JAAS line and the --add-scram list: nothing to quote there
  [[ "$password" =~ ^[A-Za-z0-9._~+-]+$ ]] || die "KAFKA_SASL_PASSWORD: letters, digits and ._~+- only"
  (umask 077 && printf '%s\n' "$password" >"$RUN_DIR/sasl-password")
  chmod 600 "$RUN_DIR/server.properties" # it holds the password too (the broker's JAAS login)
  cat >>"$RUN_DIR/server.properties" <<EOF_SASL
# SASL/SCRAM mode (kafka.sh KAFKA_SASL=scram): these override the plaintext listener above
listeners=SASL_PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$port
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
sasl.enabled.mechanisms=$SASL_MECHANISM
sasl.mechanism.inter.broker.protocol=$SASL_MECHANISM
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$SASL_USER" password="$password";
EOF_SASL
  local user
  for user in $SASL_USERS; do
    [[ "$user" =~ ^[A-Za-z0-9._-]+$ ]] || die "KAFKA_SASL_USERS: letters, digits and ._- only, not '$user'"
    (umask 077 && python3 -c 'import secrets; print(secrets.token_urlsafe(18))' >"$RUN_DIR/sasl-password-$user")
  done
  if [ "$ACLS" = 1 ]; then
    cat >>"$RUN_DIR/server.properties" <<EOF_ACLS
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:$SASL_USER;User:ANONYMOUS
EOF_ACLS
  fi
  (umask 077 && cat >"$RUN_DIR/admin.properties" <<EOF_ADMIN
security.protocol=SASL_PLAINTEXT
sasl.mechanism=$SASL_MECHANISM
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$SASL_USER" password="$password";
EOF_ADMIN
  )
  cat >"$RUN_DIR/client.env" <<EOF_ENV
GPUQUOTA_KAFKA=127.0.0.1:$port
GPUQUOTA_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT
GPUQUOTA_KAFKA_SASL_MECHANISM=$SASL_MECHANISM
GPUQUOTA_KAFKA_SASL_USERNAME=$SASL_USER
GPUQUOTA_KAFKA_SASL_PASSWORD_FILE=$RUN_DIR/sasl-password
EOF_ENV
}

probe_until_ready() {
  local bootstrap="$1" pid="$2" deadline
  deadline=$(($(date +%s) + READY_TIMEOUT))
  # wait for the listener first (cheap), watching that the JVM is still alive
  until (exec 3<>"/dev/tcp/127.0.0.1/${bootstrap##*:}") 2>/dev/null; do
    proc_running "$pid" || { log "broker process exited during startup"; return 1; }
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  proc_running "$pid" || return 1
  if [ "$SASL" = scram ]; then
    PROBE_SASL_USER="$SASL_USER" PROBE_SASL_MECHANISM="$SASL_MECHANISM" \
      PROBE_SASL_PASSWORD="$(cat "$RUN_DIR/sasl-password")" probe "$bootstrap" "$((deadline - $(date +%s)))"
  else
    probe "$bootstrap" "$((deadline - $(date +%s)))"
  fi
}

stop() {
  local pid data deadline
  pid="$(running_pid)"
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$(($(date +%s) + STOP_TIMEOUT))
    # pid_alive is false for a zombie (empty cmdline) as well as for a reaped process
    while pid_alive "$pid" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
    if pid_alive "$pid"; then
      log "broker did not stop within ${STOP_TIMEOUT}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      while pid_alive "$pid"; do sleep 0.1; done
    fi
    log "stopped (pid $pid)"
  fi
  if [ -f "$RUN_DIR/datadir" ]; then
    data="$(cat "$RUN_DIR/datadir")"
    case "$data" in */gpuquota-kafka.*) rm -rf "$data" ;; esac
  fi
  rm -f "$RUN_DIR/kafka.pid" "$RUN_DIR/bootstrap" "$RUN_DIR/datadir" "$RUN_DIR/sasl-password" \
    "$RUN_DIR"/sasl-password-* "$RUN_DIR/client.env" "$RUN_DIR/admin.properties"
}

status() {
  local pid
  pid="$(running_pid)"
  if [ -n "$pid" ] && [ -f "$RUN_DIR/bootstrap" ]; then
    echo "kafka running (pid $pid) on $(cat "$RUN_DIR/bootstrap")"
  else
    echo "kafka not running"
    return 1
  fi
}

case "${1:-}" in
  start)
    if [ "${2:-}" = --sasl ]; then SASL=scram; fi
    start
    ;;
  stop) stop ;;
  status) status ;;
  jars) resolve_jars ;;
  *) echo "usage: $0 start|stop|status|jars" >&2; exit 2 ;;
esac
