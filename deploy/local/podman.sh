#!/usr/bin/env bash
# The container engine of the `container` runtime (docs/runtimes.md), from Debian's packages.
#
#   deploy/local/podman.sh install   apt-get install podman, runc, busybox-static, netavark, aardvark-dns
#                                    and iptables when one is missing
#                                    (as root; otherwise a warning; a no-op when everything is there, or
#                                    when docker is installed and GPUQUOTA_CONTAINER_ENGINE=docker)
#   deploy/local/podman.sh check     exit 0 when podman or docker is installed, print which
#   deploy/local/podman.sh socket-start DIR
#                                    podman's Docker-compatible API on unix://DIR/podman.sock (in
#                                    $TMPDIR when DIR is too deep for a socket's path) (`podman
#                                    system service --time=0`), for docker-compose and testcontainers;
#                                    waits until it answers /_ping, prints its DOCKER_HOST; a no-op when
#                                    it already answers. The pid goes to DIR/podman-service.pid
#   deploy/local/podman.sh socket-stop DIR
#                                    stops that service (its containers keep running: conmon holds them)
#
# busybox-static is what the tests put in their locally built training image (no registry is reached);
# netavark and aardvark-dns give a multi-instance attempt's network its DNS (host names algo-1, ...).
# runc: crun, podman's default OCI runtime in Debian 12, refuses hosts whose cgroup controllers sit on
# both hierarchies ("hybrid mode"); the container runtime uses runc when it is installed.
set -euo pipefail

log() { echo "podman.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

missing() {
  local need=()
  command -v podman >/dev/null 2>&1 || need+=(podman)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  # the image is FROM scratch: Debian's dynamically linked busybox package would not run in it
  dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
  # multi-instance containers resolve each other by name through netavark's DNS server
  [ -x /usr/lib/podman/netavark ] || need+=(netavark)
  [ -x /usr/lib/podman/aardvark-dns ] || need+=(aardvark-dns)
  # netavark 1.4 sets up a container's network with iptables, which a minimal Debian lacks (then every
  # networked container fails: "netavark: No such file or directory")
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
  echo "${need[@]}"
}

install() {
  if [ "${GPUQUOTA_CONTAINER_ENGINE:-}" = docker ] && command -v docker >/dev/null 2>&1; then
    return 0
  fi
  local need
  need="$(missing)"
  [ -z "$need" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    # not fatal: only --runtime container and its tests need them (the tests fail, saying so)
    log "WARNING: missing $need and we are not root: sudo apt-get install -y $need"
    return 0
  fi
  log "installing Debian's $need (apt-get)"
  local t0=$SECONDS
  # shellcheck disable=SC2086
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
  } >&2 || die "apt-get install $need failed"
  log "apt-get install took $((SECONDS - t0))s"
}

# podman 4.3 gives every container RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 by default; where the
# hard limits are lower (this sandbox: 20000 open files), runc may not raise them and every container
# fails ("error setting rlimit type 7"). No default ulimits: containers inherit podman's own limits.
configure() {
  local conf=/etc/containers/containers.conf.d/50-gpuquota-ulimits.conf
  [ -f "$conf" ] && return 0
  [ "$(id -u)" = 0 ] || { log "WARNING: not root: put 'default_ulimits = []' under [containers] in $conf"; return 0; }
  mkdir -p "${conf%/*}"
  printf '[containers]\n# deploy/local/podman.sh: containers inherit the limits of podman (the sandbox caps them)\ndefault_ulimits = []\n' >"$conf"
  log "wrote $conf (default_ulimits = [])"
}

check() {
  command -v podman >/dev/null 2>&1 || command -v docker >/dev/null 2>&1 || die "no podman or docker"
  log "engine: $(command -v podman || command -v docker)"
}

answers() { curl -sf --max-time 5 --unix-socket "$1" http://podman/_ping >/dev/null 2>&1; }

# A private socket per caller (test run, compose project) rather than the machine's
# /run/podman/podman.sock: stopping it never breaks another caller's containers or API clients.
socket_path() { # the socket of DIR: DIR/podman.sock, or a short path named in DIR/podman-socket
  local dir="$1" sock
  if [ -f "$dir/podman-socket" ]; then cat "$dir/podman-socket"; return; fi
  sock="$dir/podman.sock"
  # a unix socket's path has at most 107 bytes; a deep DIR (pytest's tmp_path) gets one in $TMPDIR
  if [ "${#sock}" -gt 100 ]; then sock="$(mktemp -u "${TMPDIR:-/tmp}/gpuquota-api.XXXXXX").sock"; fi
  echo "$sock" >"$dir/podman-socket"
  echo "$sock"
}

socket_start() {
  local dir="${1:?usage: podman.sh socket-start DIR}" sock pid deadline
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  sock="$(socket_path "$dir")"
  if ! answers "$sock"; then
    rm -f "$sock"
    # setsid: the service outlives the shell that started it, not its process group's Ctrl-C
    setsid podman system service --time=0 "unix://$sock" >"$dir/podman-service.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$dir/podman-service.pid"
    deadline=$((SECONDS + 30))
    until answers "$sock"; do
      kill -0 "$pid" 2>/dev/null || die "podman system service exited: $(tail -5 "$dir/podman-service.log")"
      [ "$SECONDS" -lt "$deadline" ] || die "podman system service: no answer on $sock after 30 s"
      sleep 0.2 # polling the socket for its first answer
    done
  fi
  echo "unix://$sock"
}

socket_stop() {
  local dir="${1:?usage: podman.sh socket-stop DIR}" pid deadline
  [ -f "$dir/podman-service.pid" ] || return 0
  pid="$(cat "$dir/podman-service.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    deadline=$((SECONDS + 10))
    while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/podman-service.pid" "$(socket_path "$dir")" "$dir/podman-socket"
}

case "${1:-}" in
  install) install && configure ;;
  check) check ;;
  socket-start) socket_start "${2:-}" ;;
  socket-stop) socket_stop "${2:-}" ;;
  *) echo "usage: $0 install|check|socket-start DIR|socket-stop DIR" >&2; exit 2 ;;
esac
