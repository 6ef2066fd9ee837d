#!/usr/bin/env bash
# Throwaway PostgreSQL cluster for tests, from Debian's postgresql package.
#
#   deploy/local/postgres.sh start   initdb into a temp dir, start on a free 127.0.0.1 port, create
#                                    role+database (the role may create roles: tests of least-privilege
#                                    roles); prints "postgres ready on 127.0.0.1:PORT in N.Ns"
#   deploy/local/postgres.sh stop    pg_ctl stop -m fast, remove the temp dir
#   deploy/local/postgres.sh status  exit 0 and print the URL if running, else exit 1
#   deploy/local/postgres.sh crash   SIGKILL the postmaster and every server process (a crash: no
#                                    shutdown checkpoint), keeping the data dir
#   deploy/local/postgres.sh restart start the crashed (or stopped) cluster again on its data dir and
#                                    port (crash recovery replays the WAL); prints the seconds it took
#
# If DATABASE_URL is set, 'start' starts nothing: it records that URL and exits.
# Installs the postgresql package with apt-get only when no /usr/lib/postgresql/*/bin/initdb exists
# (needs root). PostgreSQL refuses to run as root, so as root the server runs as the 'postgres' user.
#
# Environment:
#   PG_RUN_DIR   state dir: url, pgdata path, logs (default .cache/postgres-run)
#   PG_PORT      port (default: a free port)
#   PG_USER / PG_PASSWORD / PG_DB   default gpuquota / gpuquota / gpuquota
#   PG_DURABLE   1: production durability (fsync, synchronous_commit, full_page_writes on), for the
#                crash tests; default off: speed over durability for a cluster that is thrown away
#
# After a successful start, $PG_RUN_DIR/url holds postgresql://USER:PASS@127.0.0.1:PORT/DB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RUN_DIR="${PG_RUN_DIR:-$ROOT/.cache/postgres-run}"
PGUSER_NAME="${PG_USER:-gpuquota}"
PGPASS="${PG_PASSWORD:-gpuquota}"
PGDB="${PG_DB:-gpuquota}"

log() { echo "postgres.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

pg_bindir() {
  local d
  d="$(find /usr/lib/postgresql -mindepth 3 -maxdepth 3 -path '*/bin/initdb' 2>/dev/null | sort -V | tail -1)"
  [ -n "$d" ] && dirname "$d"
}

# Runs a command as the cluster owner: 'postgres' when we are root, ourselves otherwise.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

ensure_installed() {
  local t0
  if [ -z "$(pg_bindir)" ]; then
    [ "$(id -u)" = 0 ] || die "PostgreSQL is not installed and we are not root: apt-get install -y postgresql"
    t0="$(now)"
    log "installing Debian's postgresql package (apt-get)"
    # no default 'main' cluster on :5432, and no service start by the package scripts: we only
    # want the binaries (a started cluster would be a stray server nobody stops)
    mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/gpuquota-no-main-cluster.conf
    local policy_added=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
      chmod +x /usr/sbin/policy-rc.d
      policy_added=1
    fi
    local rc=0
    {
      DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
    } >&2 || rc=$?
    [ "$policy_added" = 1 ] && rm -f /usr/sbin/policy-rc.d
    [ "$rc" = 0 ] || die "apt-get install postgresql failed (exit $rc)"
    log "apt-get install postgresql took $(elapsed "$t0")s"
    [ -n "$(pg_bindir)" ] || die "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    die "running as root but there is no 'postgres' user to run the server as"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

running() {
  [ -f "$RUN_DIR/pgdata" ] || return 1
  local base bin
  base="$(cat "$RUN_DIR/pgdata")"
  bin="$(pg_bindir)" || return 1
  [ -d "$base/data" ] && as_owner "$bin/pg_ctl" status -D "$base/data" >/dev/null 2>&1
}

start() {
  local t0 bin base port url
  if [ -n "${DATABASE_URL:-}" ]; then
    mkdir -p "$RUN_DIR"
    echo "$DATABASE_URL" >"$RUN_DIR/url"
    echo "postgres: using DATABASE_URL from the environment; nothing started"
    return 0
  fi
  if running && [ -f "$RUN_DIR/url" ]; then
    log "already running: $(sed 's#//\([^:]*\):[^@]*@#//\1:***@#' "$RUN_DIR/url")"
    return 0
  fi
  stop_quiet
  t0="$(now)"
  ensure_installed
  bin="$(pg_bindir)"
  mkdir -p "$RUN_DIR"
  base="$(mktemp -d "${TMPDIR:-/tmp}/gpuquota-pg.XXXXXX")"
  echo "$base" >"$RUN_DIR/pgdata"
  mkdir -p "$base/data" "$base/sock"
  chmod 0755 "$base"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$base"
  port="${PG_PORT:-$(free_port)}"

  as_owner "$bin/initdb" -D "$base/data" -U postgres -E UTF8 --locale=C.UTF-8 --no-sync \
    --auth-local=trust --auth-host=scram-sha-256 >"$base/initdb.log" 2>&1 \
    || { cat "$base/initdb.log" >&2; die "initdb failed"; }
  cat >>"$base/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$base/sock'
EOF
  if [ "${PG_DURABLE:-0}" != 1 ]; then
    # speed over durability: this cluster is thrown away (the crash tests set PG_DURABLE=1)
    cat >>"$base/data/postgresql.conf" <<EOF
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  fi
  cat >>"$base/data/postgresql.conf" <<EOF
wal_level = minimal
max_wal_senders = 0
max_connections = 200
shared_buffers = 128MB
logging_collector = off
EOF
  if ! as_owner "$bin/pg_ctl" start -D "$base/data" -l "$base/server.log" -w -t 60 >/dev/null; then
    cat "$base/server.log" >&2 || true
    die "pg_ctl start failed"
  fi
  as_owner "$bin/psql" -q -v ON_ERROR_STOP=1 -h "$base/sock" -p "$port" -U postgres -d postgres \
    -c "CREATE ROLE \"$PGUSER_NAME\" LOGIN CREATEROLE PASSWORD '$PGPASS'" \
    -c "CREATE DATABASE \"$PGDB\" OWNER \"$PGUSER_NAME\"" >&2 \
    || { stop; die "could not create role/database"; }
  url="postgresql://$PGUSER_NAME:$PGPASS@127.0.0.1:$port/$PGDB"
  # ready = a TCP client can authenticate with the URL's credentials
  PGPASSWORD="$PGPASS" "$bin/psql" -q -X -h 127.0.0.1 -p "$port" -U "$PGUSER_NAME" -d "$PGDB" \
    -c 'SELECT 1' >/dev/null || { stop; die "server started but TCP login failed"; }
  echo "$url" >"$RUN_DIR/url"
  echo "postgres ready on 127.0.0.1:$port in $(elapsed "$t0")s ($("$bin/postgres" --version), data $base)"
}

stop_quiet() {
  local base bin pid
  [ -f "$RUN_DIR/pgdata" ] || { rm -f "$RUN_DIR/url"; return 0; }
  base="$(cat "$RUN_DIR/pgdata")"
  bin="$(pg_bindir || true)"
  if [ -n "$bin" ] && [ -f "$base/data/postmaster.pid" ]; then
    if ! as_owner "$bin/pg_ctl" stop -D "$base/data" -m fast -w -t 30 >/dev/null 2>&1; then
      pid="$(head -1 "$base/data/postmaster.pid" 2>/dev/null || true)"
      if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        log "fast shutdown failed; sending SIGKILL to postmaster $pid"
        kill -KILL "$pid" 2>/dev/null || true
      fi
    fi
  fi
  case "$base" in */gpuquota-pg.*) rm -rf "$base" ;; esac
  rm -f "$RUN_DIR/pgdata" "$RUN_DIR/url"
}

stop() {
  if [ -f "$RUN_DIR/pgdata" ]; then
    stop_quiet
    log "stopped"
  else
    rm -f "$RUN_DIR/url"
  fi
}

# The postmaster and its children (backends, checkpointer, walwriter...), by pid.
server_pids() {
  local base pid
  base="$(cat "$RUN_DIR/pgdata")"
  pid="$(head -1 "$base/data/postmaster.pid" 2>/dev/null || true)"
  [ -n "$pid" ] || return 0
  echo "$pid"
  cat "/proc/$pid/task/$pid/children" 2>/dev/null || true
}

crash() {
  [ -f "$RUN_DIR/pgdata" ] || die "not running"
  local pids
  pids="$(server_pids | tr '\n' ' ')"
  [ -n "${pids// /}" ] || die "no postmaster.pid"
  # shellcheck disable=SC2086 # one pid per word
  kill -KILL $pids 2>/dev/null || true
  local p
  for p in $pids; do
    # gone, or a zombie its parent has not reaped yet (kill -0 succeeds on a zombie)
    while [ -e "/proc/$p" ] && [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ]; do sleep 0.05; done
  done
  log "killed (SIGKILL) $pids"
}

restart() {
  local t0 base bin
  [ -f "$RUN_DIR/pgdata" ] || die "no cluster to restart"
  t0="$(now)"
  base="$(cat "$RUN_DIR/pgdata")"
  bin="$(pg_bindir)"
  if ! as_owner "$bin/pg_ctl" start -D "$base/data" -l "$base/server.log" -w -t 60 >/dev/null; then
    tail -20 "$base/server.log" >&2 || true
    die "pg_ctl start failed"
  fi
  echo "postgres restarted in $(elapsed "$t0")s"
}

status() {
  if [ -f "$RUN_DIR/url" ] && { running || [ ! -f "$RUN_DIR/pgdata" ]; }; then
    echo "postgres: $(sed 's#//\([^:]*\):[^@]*@#//\1:***@#' "$RUN_DIR/url")"
  else
    echo "postgres not running"
    return 1
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  crash) crash ;;
  restart) restart ;;
  *) echo "usage: $0 start|stop|status|crash|restart" >&2; exit 2 ;;
esac
