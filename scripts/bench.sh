#!/usr/bin/env bash
# Runs benchmarks/bench.py against real services: `make bench` calls this; arguments go to it
# (e.g. --smoke, --large, --only a,d). Unless OUTBOX_BENCH_DATABASE_URL / OUTBOX_BENCH_AMQP_URL
# are set, starts a throwaway PostgreSQL 15 with its DEFAULT durability (fsync, synchronous
# commit and full-page writes on: the figures are about durable commits) on a real disk, and
# a RabbitMQ, on free loopback ports, and stops them again on exit, failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/services.sh
. scripts/services.sh

PYTHON=${VENV:-.venv}/bin/python
[ -x "$PYTHON" ] || { echo "bench.sh: $PYTHON not found: run \`make install\` first" >&2; exit 2; }

tmp= pg_dir= rmq_dir= pg_job=
cleanup() {
  local rc=$?
  set +e
  trap - INT TERM
  [ -z "$pg_job" ] || wait "$pg_job" 2>/dev/null
  [ -z "$rmq_dir" ] || rmq_down "$rmq_dir"
  [ -z "$pg_dir" ] || pg_down "$pg_dir"
  [ -z "$tmp" ] || rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Not /dev/shm: on tmpfs an fsync costs nothing and durable commits would be flattered.
# OUTBOX_BENCH_TMPDIR overrides; keep it short (PostgreSQL's socket path < 107 bytes).
parent=${OUTBOX_BENCH_TMPDIR:-/tmp}
# Timing WAL syncs only adds clock reads; it lets the report say how much fsync costs.
pg_opts="-c track_wal_io_timing=on ${OUTBOX_BENCH_PG_OPTS:-}"

need=()
[ -n "${OUTBOX_BENCH_DATABASE_URL:-}" ] || need+=(pg)
[ -n "${OUTBOX_BENCH_AMQP_URL:-}" ] || need+=(rmq)
args=()
if [ ${#need[@]} -gt 0 ]; then
  ensure_server_packages "${need[@]}"
  tmp=$(mktemp -d "$parent/obxb.XXXX")
  chmod 711 "$tmp"  # as root, PostgreSQL runs as `postgres` and must reach $tmp/pg
  if [ -z "${OUTBOX_BENCH_DATABASE_URL:-}" ]; then
    pg_dir=$tmp/pg pg_port=$(free_port 15000 5000)
    pg_pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
    pg_up_durable "$pg_dir" "$pg_port" outbox_bench bench "$pg_pass" "$pg_opts" >"$tmp/pg.url" &
    pg_job=$!
  fi
  if [ -z "${OUTBOX_BENCH_AMQP_URL:-}" ]; then
    rmq_dir=$tmp/rmq
    rmq_port=$(free_port 10000 2768 20000)
    OUTBOX_BENCH_AMQP_URL=$(rmq_up "$rmq_dir" "$rmq_port")
    if rmq_pid=$(_rmq_pid "$rmq_dir"); then args+=(--broker-pid "$rmq_pid"); fi
  fi
  if [ -n "$pg_job" ]; then
    wait "$pg_job" || { pg_job=; echo "bench.sh: PostgreSQL did not start" >&2; exit 1; }
    pg_job=
    OUTBOX_BENCH_DATABASE_URL=$(cat "$tmp/pg.url")
    # CHECKPOINT before each run, so every run starts from the same WAL state.
    pg_admin "$pg_dir" "$pg_port" "GRANT pg_checkpoint TO bench" >/dev/null
  fi
  echo "bench.sh: PostgreSQL 127.0.0.1:${pg_port:-?} ($pg_dir), RabbitMQ 127.0.0.1:${rmq_port:-?}" >&2
fi
export OUTBOX_BENCH_DATABASE_URL OUTBOX_BENCH_AMQP_URL

set +e
"$PYTHON" -m benchmarks.bench "${args[@]}" "$@"
exit $?
