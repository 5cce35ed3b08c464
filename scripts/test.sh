#!/usr/bin/env bash
# Runs the test suite against real services: `make test` calls this; arguments go to pytest.
# Unless OUTBOX_TEST_PG_URL / OUTBOX_TEST_AMQP_URL are set, starts a throwaway PostgreSQL and/or
# RabbitMQ on loopback under /dev/shm (or /tmp) and stops them again on exit, failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/services.sh
. scripts/services.sh

PYTHON=${VENV:-.venv}/bin/python
[ -x "$PYTHON" ] || { echo "test.sh: $PYTHON not found: run \`make install\` first" >&2; exit 2; }

tmp= pg_dir= rmq_dir= pg_job=
cleanup() {
  local rc=$?
  set +e
  trap - INT TERM
  [ -z "$pg_job" ] || wait "$pg_job" 2>/dev/null  # let a half-started cluster finish booting
  [ -z "$rmq_dir" ] || rmq_down "$rmq_dir"
  [ -z "$pg_dir" ] || pg_down "$pg_dir"
  [ -z "$tmp" ] || rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# free_port (services.sh): PostgreSQL and RabbitMQ (+20000 for Erlang distribution) get
# disjoint ranges below the kernel's ephemeral ports.

# Every PostgreSQL test creates a database, much faster on tmpfs than on disk (decision 0034),
# so the servers live in /dev/shm when it is tmpfs with room to spare (Docker's default
# /dev/shm is 64 MB: too small). OUTBOX_TEST_TMPDIR overrides; paths stay short because
# PostgreSQL's socket path must stay under 107 bytes.
tmp_parent() {
  local free_kb
  if [ -n "${OUTBOX_TEST_TMPDIR:-}" ]; then echo "$OUTBOX_TEST_TMPDIR"; return; fi
  free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }') || free_kb=0
  if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] && [ -w /dev/shm ] &&
    [ "${free_kb:-0}" -ge 1048576 ]; then echo /dev/shm; else echo /tmp; fi
}

need=()
[ -n "${OUTBOX_TEST_PG_URL:-}" ] || need+=(pg)
[ -n "${OUTBOX_TEST_AMQP_URL:-}" ] || need+=(rmq)
started=()
if [ ${#need[@]} -gt 0 ]; then
  ensure_server_packages "${need[@]}"
  tmp=$(mktemp -d "$(tmp_parent)/obx.XXXX")
  chmod 711 "$tmp"  # as root, PostgreSQL runs as `postgres` and must reach $tmp/pg
  t0=$EPOCHREALTIME
  if [ -z "${OUTBOX_TEST_PG_URL:-}" ]; then
    pg_dir=$tmp/pg pg_port=$(free_port 15000 5000)
    pg_pass=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
    # PostgreSQL boots in the background while RabbitMQ (the slower one) boots here.
    pg_up "$pg_dir" "$pg_port" outbox_test outbox "$pg_pass" >"$tmp/pg.url" &
    pg_job=$!
  fi
  if [ -z "${OUTBOX_TEST_AMQP_URL:-}" ]; then
    rmq_dir=$tmp/rmq
    rmq_port=$(free_port 10000 2768 20000)
    OUTBOX_TEST_AMQP_URL=$(rmq_up "$rmq_dir" "$rmq_port")
    export OUTBOX_TEST_AMQP_URL
    # rabbitmqctl for this broker: the relay's outage tests stop_app/start_app through it.
    printf '#!/usr/bin/env bash\n. %q\nrmq_ctl %q %q "$@"\n' \
      "$PWD/scripts/services.sh" "$rmq_dir" "$rmq_port" >"$tmp/rmqctl"
    chmod 700 "$tmp/rmqctl"
    export OUTBOX_TEST_RMQCTL=$tmp/rmqctl
    started+=("RabbitMQ amqp://guest:***@127.0.0.1:$rmq_port/ ($rmq_dir)")
  fi
  if [ -n "$pg_job" ]; then
    wait "$pg_job" || { pg_job=; echo "test.sh: PostgreSQL did not start" >&2; exit 1; }
    pg_job=
    OUTBOX_TEST_PG_URL=$(cat "$tmp/pg.url")
    export OUTBOX_TEST_PG_URL
    started=("PostgreSQL postgresql+asyncpg://outbox:***@127.0.0.1:$pg_port/outbox_test ($pg_dir)"
      "${started[@]}")
  fi
  msg=$(printf '%s, ' "${started[@]}")
  secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  echo "test.sh: started ${msg%, } in $secs s"
else
  echo "test.sh: using the services from OUTBOX_TEST_PG_URL and OUTBOX_TEST_AMQP_URL"
fi

set +e
if [ $# -gt 0 ]; then  # a chosen selection (make test PYTEST_ARGS=...): one plain run
  "$PYTHON" -m pytest "$@"
  exit $?
fi
# The whole suite: everything that shares the services peacefully on two workers, then the
# tests marked serial (they stop the broker, restart a database or measure timing) alone.
"$PYTHON" -m pytest -n 2 -m "not serial"
parallel=$?
"$PYTHON" -m pytest -m serial
serial=$?
[ "$serial" = 5 ] && serial=0  # 5: no test is marked serial
echo "test.sh: parallel part exit $parallel, serial part exit $serial"
[ "$parallel" = 0 ] && [ "$serial" = 0 ]
