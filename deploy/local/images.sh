#!/usr/bin/env bash
# Builds every container image the project uses from Debian's packages only (no registry is reached):
#
#   deploy/local/images.sh [all]     base, gpuquota:dev, the Kafka, PostgreSQL and python image (cached)
#   deploy/local/images.sh base      only the base; prints its name (for images built on it)
#   deploy/local/images.sh gpuquota|kafka|postgres|python   that image (and the base when needed)
#   deploy/local/images.sh extra NAME CONTEXT [CONTAINERFILE]
#                                    any other image on the base: builds CONTAINERFILE (default
#                                    CONTEXT/Containerfile) with --build-arg BASE=<the base>, tags NAME;
#                                    cached like the others on the base and the context's files
#   deploy/local/images.sh list      the images with their sizes
#   deploy/local/images.sh engine    prints the engine used (podman, or docker where its daemon answers)
#
# The images (docs/images.md):
#   localhost/gpuquota-base:bookworm   Debian 12 (mmdebstrap --variant=apt, `podman import`) with
#                                      python3, python3-venv, ca-certificates, passwd; no docs or man pages
#   localhost/gpuquota:dev             deploy/docker/Dockerfile on the base (BASE build argument)
#   localhost/gpuquota-kafka:dev       Kafka 4.1.2 in KRaft mode: the Maven jars of deploy/local/kafka.sh
#                                      on Debian's openjdk-17-jre-headless (deploy/local/images/kafka)
#   localhost/gpuquota-postgres:dev    Debian's postgresql-15 (deploy/local/images/postgres)
#   localhost/gpuquota-python:dev      python3 and pip: the SageMaker SDK's jobs' local training image
#                                      (deploy/local/images/python)
#
# Caching: each image carries the label gpuquota.inputs, a hash of what it is built from (for the base:
# its package list and this script's recipe; for the others: their files and the base's image id). An
# image whose label matches is not rebuilt, so `make images` with nothing changed takes seconds.
# FORCE=1 rebuilds anyway. Environment: GPUQUOTA_CONTAINER_ENGINE (podman|docker), PIP_INDEX_URL and
# GPUQUOTA_CA_BUNDLE (a PEM file, default $PIP_CERT: the CA of a TLS proxy between pip and the index)
# for pip inside the gpuquota build, DEBIAN_MIRROR (default: the
# host's first deb.debian.org-style mirror, else http://deb.debian.org/debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
HERE="deploy/local/images"
BASE="localhost/gpuquota-base:bookworm"
SUITE=bookworm
# the base's packages: python3 for gpuquota and the training images built on it, passwd for useradd
BASE_PACKAGES="ca-certificates,python3,python3-venv,passwd"
BASE_RECIPE_VERSION=2 # bump when the mmdebstrap command below changes

log() { echo "images.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

engine() {
  if [ -n "${GPUQUOTA_CONTAINER_ENGINE:-}" ]; then
    echo "$GPUQUOTA_CONTAINER_ENGINE"
  elif command -v docker >/dev/null 2>&1 && env -u DOCKER_HOST timeout 10 docker info >/dev/null 2>&1; then
    echo docker # a Docker daemon answers: build where compose and testcontainers will look
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  else
    die "neither podman nor a Docker daemon: bash deploy/local/podman.sh install"
  fi
}
ENGINE="$(engine)"

label_of() { # the gpuquota.inputs label of image $1, or nothing
  "$ENGINE" image inspect --format '{{ index .Config.Labels "gpuquota.inputs" }}' "$1" 2>/dev/null || true
}

image_id() { "$ENGINE" image inspect --format '{{ .Id }}' "$1"; }

hash_files() { # a hash of the named files' paths and contents, and of the extra words in $EXTRA
  { printf '%s\n' "${EXTRA:-}"; for f in "$@"; do printf '%s\n' "$f"; cat "$f"; done; } | sha256sum | cut -c1-16
}

fresh() { # image $1 exists with inputs hash $2
  [ "${FORCE:-0}" != 1 ] && [ "$(label_of "$1")" = "$2" ]
}

mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri="$(grep -hoE '^URIs: \S+/debian$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | cut -d' ' -f2 || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}

BASE_CHECKED=0 # build_base runs once per invocation (FORCE=1 rebuilds the base once, not per image)

build_base() {
  local hash t0=$SECONDS
  [ "$BASE_CHECKED" = 1 ] && return
  BASE_CHECKED=1
  hash="$(EXTRA="$SUITE $BASE_PACKAGES $BASE_RECIPE_VERSION" hash_files)"
  if fresh "$BASE" "$hash"; then log "$BASE: up to date"; return; fi
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || die "mmdebstrap missing: sudo apt-get install -y mmdebstrap"
    log "installing Debian's mmdebstrap (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >&2 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >&2; }
  fi
  log "$BASE: mmdebstrap $SUITE from $(mirror) (log: .cache/images/mmdebstrap.log)"
  local quiet=()
  [ "$ENGINE" = podman ] && quiet=(-q) # docker import has no --quiet
  mkdir -p "$ROOT/.cache/images"
  # The dpkg path excludes stay in the image (/etc/dpkg/dpkg.cfg.d), so images built on it are slim
  # too; copyright files are kept.
  # merged-usr hook: /usr merged by mmdebstrap itself, not by the usrmerge package (which pulls perl, 47 MB)
  mmdebstrap --variant=apt --include="$BASE_PACKAGES" --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --aptopt='APT::Install-Recommends "false"' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
    --quiet "$SUITE" - "$(mirror)" 2>"$ROOT/.cache/images/mmdebstrap.log" \
    | "$ENGINE" import "${quiet[@]}" --change "LABEL gpuquota.inputs=$hash" --change 'CMD ["/bin/bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE" >/dev/null \
    || die "$BASE: mmdebstrap | $ENGINE import failed: $(tail -20 "$ROOT/.cache/images/mmdebstrap.log")"
  log "$BASE: built in $((SECONDS - t0))s"
}

build() { # build NAME HASH CONTAINERFILE CONTEXT [extra build args...]
  local name="$1" hash="$2" file="$3" context="$4" t0=$SECONDS
  shift 4
  if fresh "$name" "$hash"; then log "$name: up to date"; return; fi
  local format=() tags=(-t "$name")
  [ "$ENGINE" = podman ] && format=(--format docker) # the OCI format drops HEALTHCHECK
  # podman finds localhost/gpuquota:dev by its short name gpuquota:dev (docker-compose.yml's, the
  # plugin's default); docker does not, so it gets that tag too
  [ "$ENGINE" = docker ] && tags+=(-t "${name#localhost/}")
  log "$name: building $file"
  # --network host: RUN steps reach Debian's mirror and the package index without a container network
  "$ENGINE" build "${format[@]}" --network host -q --label "gpuquota.inputs=$hash" \
    --build-arg "BASE=$BASE" "$@" -f "$file" "${tags[@]}" "$context" >/dev/null
  log "$name: built in $((SECONDS - t0))s"
}

build_gpuquota() {
  build_base
  local files hash args=()
  # what the Dockerfile copies: the checkout's files, less what .gitignore ignores (caches, builds)
  mapfile -t files < <(git ls-files -co --exclude-standard -- services pyproject.toml README.md \
    deploy/docker .dockerignore | sort)
  local ca="${GPUQUOTA_CA_BUNDLE:-${PIP_CERT:-}}"
  hash="$(EXTRA="$(image_id "$BASE") ${PIP_INDEX_URL:-} $(if [ -n "$ca" ]; then sha256sum <"$ca"; fi)" \
    hash_files "${files[@]}")"
  [ -n "${PIP_INDEX_URL:-}" ] && args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
  if [ -n "$ca" ]; then
    # the Dockerfile reads the bundle from the build context (.gitignore'd)
    install -m 644 "$ca" deploy/docker/.ca-bundle.pem
    args+=(--build-arg "CA_BUNDLE=deploy/docker/.ca-bundle.pem")
  fi
  build localhost/gpuquota:dev "$hash" deploy/docker/Dockerfile . "${args[@]}"
}

build_kafka() {
  build_base
  local libs hash
  libs="$(bash deploy/local/kafka.sh jars)"
  # the jars travel in the build context: a copy under .cache (the context is the image's directory)
  local ctx="$ROOT/.cache/images/kafka"
  mkdir -p "$ctx"
  rm -rf "$ctx/libs"
  cp -a "$libs" "$ctx/libs"
  cp "$HERE/kafka/"* deploy/local/kafka/log4j2.properties "$ctx/"
  hash="$(EXTRA="$(image_id "$BASE") $(basename "$libs")" hash_files "$HERE"/kafka/* deploy/local/kafka/log4j2.properties)"
  build localhost/gpuquota-kafka:dev "$hash" "$ctx/Containerfile" "$ctx"
}

build_postgres() {
  build_base
  local hash
  hash="$(EXTRA="$(image_id "$BASE")" hash_files "$HERE"/postgres/*)"
  build localhost/gpuquota-postgres:dev "$hash" "$HERE/postgres/Containerfile" "$HERE/postgres"
}

build_python() {
  build_base
  local hash
  hash="$(EXTRA="$(image_id "$BASE")" hash_files "$HERE"/python/*)"
  build localhost/gpuquota-python:dev "$hash" "$HERE/python/Containerfile" "$HERE/python"
}

build_extra() { # NAME CONTEXT [CONTAINERFILE]
  local name="${1:?usage: images.sh extra NAME CONTEXT [CONTAINERFILE]}" context="${2:?context}"
  local file="${3:-$2/Containerfile}" files hash
  build_base
  mapfile -t files < <(find "$context" -type f | sort)
  hash="$(EXTRA="$(image_id "$BASE")" hash_files "$file" "${files[@]}")"
  build "$name" "$hash" "$file" "$context"
}

list() {
  "$ENGINE" images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E '^localhost/gpuquota(-base|-kafka|-postgres|-python)?:' || true
}

case "${1:-all}" in
  all)
    t0=$SECONDS
    build_base
    # the four on the base at once: their time is mostly apt's and pip's downloads, not the CPU
    pids=()
    for image in gpuquota kafka postgres python; do
      "build_$image" &
      pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
    [ "$failed" = 0 ] || die "an image failed to build (see above)"
    log "all images ready in $((SECONDS - t0))s ($ENGINE)"
    # .ci/run's summary (the file test-stack.sh also writes to)
    if [ -n "${GPUQUOTA_TIMINGS_FILE:-}" ]; then echo "images_s=$((SECONDS - t0))" >>"$GPUQUOTA_TIMINGS_FILE"; fi
    ;;
  base) build_base; echo "$BASE" ;;
  gpuquota) build_gpuquota ;;
  kafka) build_kafka ;;
  postgres) build_postgres ;;
  python) build_python ;;
  extra) shift; build_extra "$@" ;;
  list) list ;;
  engine) echo "$ENGINE" ;;
  *) echo "usage: $0 [all|base|gpuquota|kafka|postgres|python|extra NAME CONTEXT [FILE]|list|engine]" >&2; exit 2 ;;
esac
