#!/usr/bin/env bash
# Measures the resident memory of every Mandate service while it idles:
# each service runs as its own process over Postgres, as in the README's
# "Running the services separately", first from the all-in-one `mandate`
# binary, then from its own binary (cmd/mandate-<service>) as BASELINE
# builds it if given, then as the working tree builds it, one set after
# the other in the same run. Once every process of a set answers /healthz
# and has idled SETTLE seconds, VmRSS, RssAnon and RssFile are read from
# /proc/PID/status.
#
# Usage: scripts/idle-rss.sh   (from the repository root; Linux only)
#
#   LDFLAGS      go build -ldflags (default "-s -w", as deploy/compose/Dockerfile)
#   TAGS         go build -tags of the per-service binaries (default grpcnotrace,
#                as `make binaries`; the all-in-one is built as the Dockerfile does)
#   CGO_ENABLED  default 0, as deploy/compose/Dockerfile: static binaries, no libc mapped
#   DATABASE     Postgres server, without a database (default postgres://postgres@127.0.0.1:5432);
#                a scratch database is created and dropped
#   PORT_BASE    first of the loopback ports the services listen on (default 47100)
#   SETTLE       seconds to idle before reading (default 3)
#   BASELINE     a git revision (e.g. main) whose per-service binaries are
#                built and measured too, in the same run, so that a change
#                is compared with what it changes side by side (default: none)
#   BASELINE_TAGS go build -tags of the baseline's binaries (default: none)
set -euo pipefail

LDFLAGS=${LDFLAGS-"-s -w"}
TAGS=${TAGS-grpcnotrace}
BASELINE_TAGS=${BASELINE_TAGS-}
export CGO_ENABLED=${CGO_ENABLED:-0}
DATABASE=${DATABASE:-postgres://postgres@127.0.0.1:5432}
PORT_BASE=${PORT_BASE:-47100}
SETTLE=${SETTLE:-3}
services=(audit confirm catalog helpdesk executor mcpbridge)

root=$(git rev-parse --show-toplevel)
cd "$root"
work=$(mktemp -d)
db="mandate_idle_rss_$$"
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  psql -q "$DATABASE/postgres" -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "building with CGO_ENABLED=$CGO_ENABLED -trimpath -ldflags='$LDFLAGS' (per-service: -tags='$TAGS') into $work" >&2
go build -trimpath -ldflags="$LDFLAGS" -o "$work/mandate" ./cmd/mandate
per_service=()
for s in "${services[@]}"; do
  if [ -d "cmd/mandate-$s" ]; then
    go build -trimpath -tags="$TAGS" -ldflags="$LDFLAGS" -o "$work/mandate-$s" "./cmd/mandate-$s"
    per_service+=("$s")
  fi
done
# The baseline's binaries are built from an export of that revision, with
# the same flags, into $work/baseline.
baseline=()
if [ -n "${BASELINE:-}" ]; then
  echo "building the per-service binaries of $BASELINE" >&2
  mkdir "$work/baseline-src" "$work/baseline"
  git archive "$BASELINE" | tar -x -C "$work/baseline-src"
  for s in "${services[@]}"; do
    if [ -d "$work/baseline-src/cmd/mandate-$s" ]; then
      (cd "$work/baseline-src" && go build -trimpath -tags="$BASELINE_TAGS" -ldflags="$LDFLAGS" -o "$work/baseline/mandate-$s" "./cmd/mandate-$s")
      baseline+=("$s")
    fi
  done
fi

psql -q "$DATABASE/postgres" -c "CREATE DATABASE $db" >/dev/null
export MANDATE_DATABASE_URL="$DATABASE/$db?sslmode=disable"
export MANDATE_DEV_SECRET=idle-rss-dev-secret-0123456789abcdef0123456789
export MANDATE_SERVICE_SECRET=idle-rss-service-secret-0123456789abcdef01234
export MANDATE_LOG_LEVEL=warn
"$work/mandate" migrate --sample >/dev/null
"$work/mandate" policy apply -f examples/policy/demo.yaml >/dev/null

# Service i listens on gRPC PORT_BASE+10i+1 and HTTP PORT_BASE+10i+2.
grpc_addr() { echo "127.0.0.1:$((PORT_BASE + 10 * $1 + 1))"; }
http_addr() { echo "127.0.0.1:$((PORT_BASE + 10 * $1 + 2))"; }
index_of() {
  local i
  for i in "${!services[@]}"; do [ "${services[$i]}" = "$1" ] && echo "$i" && return; done
}

# args_of prints the flags service $1 runs with: its addresses, and for the
# executor and the bridge the addresses of the services they call.
args_of() {
  local i
  i=$(index_of "$1")
  echo "--grpc-addr $(grpc_addr "$i") --http-addr $(http_addr "$i")"
  case $1 in
    executor)
      echo "--backend examples.helpdesk.v1.HelpdeskService=$(grpc_addr "$(index_of helpdesk)"),mandate.v1.CatalogService=$(grpc_addr "$(index_of catalog)")"
      echo "--audit-addr $(grpc_addr "$(index_of audit)") --confirm-addr $(grpc_addr "$(index_of confirm)")" ;;
    mcpbridge)
      echo "--catalog-addr $(grpc_addr "$(index_of catalog)") --executor-addr $(grpc_addr "$(index_of executor)")"
      echo "--confirm-addr $(grpc_addr "$(index_of confirm)")" ;;
  esac
}

kib() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$2/status"; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# binary_of prints the binary that runs service $2 in set $1.
binary_of() {
  case $1 in
    all-in-one) echo "$work/mandate" ;;
    baseline) echo "$work/baseline/mandate-$2" ;;
    *) echo "$work/mandate-$2" ;;
  esac
}

# measure starts every service of set $1 ("all-in-one", "baseline" or
# "per-service"), waits until each is healthy, lets them idle and prints a
# row per service.
measure() {
  local set=$1 s i bin pid
  local -A started=()
  shift
  for s in "$@"; do
    i=$(index_of "$s")
    bin=("$(binary_of "$set" "$s")")
    if [ "$set" = all-in-one ]; then bin+=("$s"); fi
    # The services load no manifest unless named: the sample, by name. A
    # baseline built before --manifest=sample existed fell back to it.
    local manifest=()
    if [ "$set" != baseline ]; then
      case $s in catalog | confirm | executor | mcpbridge) manifest=(--manifest=sample) ;; esac
    fi
    # shellcheck disable=SC2046 # args_of prints words
    "${bin[@]}" $(args_of "$s") "${manifest[@]}" >"$work/$set-$s.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    started[$s]=$pid
  done
  for s in "$@"; do
    i=$(index_of "$s")
    for _ in $(seq 200); do
      "$work/mandate" healthcheck --url "http://$(http_addr "$i")/healthz" --timeout 1s >/dev/null 2>&1 && continue 2
      kill -0 "${started[$s]}" 2>/dev/null || { echo "$set $s exited:" >&2; cat "$work/$set-$s.log" >&2; exit 1; }
      sleep 0.1
    done
    echo "$set $s never became healthy" >&2
    cat "$work/$set-$s.log" >&2
    exit 1
  done
  sleep "$SETTLE"
  for s in "$@"; do
    pid=${started[$s]}
    bin=$(binary_of "$set" "$s")
    printf '%-10s %-12s %8s %8s %8s %9s\n' "$s" "$set" "$(mib "$(kib VmRSS "$pid")")" \
      "$(mib "$(kib RssAnon "$pid")")" "$(mib "$(kib RssFile "$pid")")" "$(mib $(($(stat -c %s "$bin") / 1024)))"
  done
  for s in "$@"; do kill "${started[$s]}"; done
  for s in "$@"; do wait "${started[$s]}" 2>/dev/null || true; done
  pids=()
}

printf '%-10s %-12s %8s %8s %8s %9s\n' service binary "VmRSS" "RssAnon" "RssFile" "size"
printf '%-10s %-12s %8s %8s %8s %9s\n' "" "" MiB MiB MiB MiB
measure all-in-one "${services[@]}"
if [ ${#baseline[@]} -gt 0 ]; then
  measure baseline "${baseline[@]}"
fi
if [ ${#per_service[@]} -gt 0 ]; then
  measure per-service "${per_service[@]}"
fi
