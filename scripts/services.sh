# shellcheck shell=bash
# Throwaway PostgreSQL 15 and RabbitMQ servers on loopback, for tests and CI.
#
# Source this file, then:
#   ensure_server_packages [pg] [rmq]        install missing server packages (root + apt) or fail
#   pg_up DIR PORT DB USER PASS              start a cluster in DIR, print its SQLAlchemy URL
#   pg_up_durable DIR PORT DB USER PASS [OPTS]
#                                            the same with PostgreSQL's default durability
#                                            (fsync on; for benchmarks), plus server OPTS
#                                            such as "-c shared_buffers=256MB"
#   pg_down DIR                              stop the cluster in DIR
#   pg_admin DIR PORT SQL                    run SQL as the superuser over DIR's socket
#   rmq_up BASE PORT                         start a broker in BASE (Erlang distribution on
#                                            PORT+20000), print its AMQP URL
#   rmq_down BASE                            stop the broker in BASE (and epmd if it started it)
#   free_port LOW COUNT [GAP]                a free loopback port in LOW..LOW+COUNT-1 (and
#                                            PORT+GAP free too)
# Every function is idempotent for its DIR/BASE, works under `set -euo pipefail`, binds only to
# 127.0.0.1 and writes nothing outside DIR/BASE. pg_up's clusters run with fsync off: throwaway
# only.
# As root, PostgreSQL runs as the `postgres` user, so DIR and all its parents must be traversable
# by it (use /tmp, not a checkout under /root). Keep DIR short: its socket path must stay under
# 107 bytes.

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
RMQBIN=${RMQBIN:-/usr/lib/rabbitmq/bin}
# A broker's Erlang distribution listens on its AMQP port + 20000, so that port must leave
# room for it under 65536.
RMQ_DIST_OFFSET=20000
RMQ_MAX_PORT=$((65535 - RMQ_DIST_OFFSET))

_svc_die() { echo "services.sh: $*" >&2; return 1; }

_port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Callers pick ports below the kernel's ephemeral range (32768+), so no outgoing connection
# takes them between the check and the bind.
free_port() {  # LOW COUNT [GAP]: a free loopback port in LOW..LOW+COUNT-1 whose PORT+GAP is free too
  local low=$1 count=$2 gap=${3:-0} port i
  for i in $(seq 200); do
    port=$((low + (RANDOM * 32768 + RANDOM) % count))
    _port_open "$port" || { [ "$gap" != 0 ] && _port_open $((port + gap)); } || {
      echo "$port"; return 0; }
  done
  _svc_die "no free port in $low..$((low + count - 1))"
}

# postgres and initdb refuse to run as root.
_as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

_pg_installed() { [ -x "$PGBIN/initdb" ] && [ -x "$PGBIN/pg_ctl" ] && [ -x "$PGBIN/pg_isready" ]; }
_rmq_installed() { [ -x "$RMQBIN/rabbitmq-server" ]; }

ensure_server_packages() {  # [pg] [rmq]: which servers are needed (default: both)
  local want=("$@") missing=() w created_policy=0 rc=0
  [ ${#want[@]} -gt 0 ] || want=(pg rmq)
  for w in "${want[@]}"; do
    case $w in
      pg) _pg_installed || missing+=(postgresql-15) ;;
      rmq) _rmq_installed || missing+=(rabbitmq-server) ;;
      *) _svc_die "ensure_server_packages: unknown server '$w' (use pg or rmq)"; return 1 ;;
    esac
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    _svc_die "missing ${missing[*]} ($PGBIN, $RMQBIN): install them (apt-get install" \
      "postgresql-15 rabbitmq-server) or set OUTBOX_TEST_PG_URL / OUTBOX_TEST_AMQP_URL"
    return 1
  fi
  echo "services.sh: installing ${missing[*]} with apt-get" >&2
  # Keep the packages' post-install scripts from starting a cluster or a broker on 0.0.0.0.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
    created_policy=1
  fi
  { DEBIAN_FRONTEND=noninteractive apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } >&2 || rc=$?
  if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
  [ "$rc" = 0 ] || { _svc_die "apt-get install ${missing[*]} failed (exit $rc)"; return 1; }
  for w in "${want[@]}"; do
    case $w in
      pg) _pg_installed || { _svc_die "postgresql-15 installed, but $PGBIN/initdb is missing"; return 1; } ;;
      rmq) _rmq_installed || { _svc_die "rabbitmq-server installed, but $RMQBIN is missing"; return 1; } ;;
    esac
  done
}

PG_THROWAWAY_OPTS="-c fsync=off -c synchronous_commit=off -c full_page_writes=off"

pg_up() {  # DIR PORT DB USER PASS -> prints the SQLAlchemy URL; USER gets LOGIN CREATEDB
  _pg_start "$PG_THROWAWAY_OPTS" "$@"
}

pg_up_durable() {  # DIR PORT DB USER PASS [OPTS] -> as pg_up, fsync and friends left on
  _pg_start "${6:-}" "$1" "$2" "$3" "$4" "$5"
}

_pg_start() {  # SERVER_OPTS DIR PORT DB USER PASS
  local opts=$1 dir=$2 port=$3 db=$4 user=$5 pass=$6 out i
  _pg_installed || { _svc_die "PostgreSQL 15 binaries not found in $PGBIN"; return 1; }
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    _svc_die "running as root but there is no 'postgres' user to run the server as"; return 1
  fi
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$dir"; fi
  chmod 700 "$dir"
  if [ ! -s "$dir/PG_VERSION" ]; then
    out=$(_as_pg "$PGBIN/initdb" -D "$dir" -U postgres -E UTF8 --locale=C.UTF-8 --no-sync \
      --auth-local=trust --auth-host=scram-sha-256 2>&1) || { echo "$out" >&2; return 1; }
  fi
  if ! _as_pg "$PGBIN/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    _port_open "$port" && { _svc_die "port $port is already in use"; return 1; }
    _as_pg "$PGBIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 start -o "-p $port -k $dir \
      -c listen_addresses=127.0.0.1 $opts" >/dev/null || { tail -n 20 "$dir/server.log" >&2; return 1; }
  fi
  for i in $(seq 300); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$port" && break; sleep 0.1; done
  local psql=("$PGBIN/psql" -h "$dir" -p "$port" -U postgres -d postgres -qAtX -v ON_ERROR_STOP=1)
  # CREATEDB: the test suite creates (and drops) one database per test.
  _as_pg "${psql[@]}" -c "DO \$\$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname='$user')
    THEN CREATE ROLE \"$user\" LOGIN; END IF; END\$\$" \
    -c "ALTER ROLE \"$user\" LOGIN CREATEDB PASSWORD '$pass'" >/dev/null || return 1
  if [ -z "$(_as_pg "${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname='$db'")" ]; then
    # CREATE DATABASE cannot run inside a transaction block: it gets its own -c.
    _as_pg "${psql[@]}" -c "CREATE DATABASE \"$db\" OWNER \"$user\"" >/dev/null || return 1
  fi
  echo "postgresql+asyncpg://$user:$pass@127.0.0.1:$port/$db"
}

pg_admin() {  # DIR PORT SQL: one statement as the `postgres` superuser, output unaligned
  _as_pg "$PGBIN/psql" -h "$1" -p "$2" -U postgres -d postgres -qAtX -v ON_ERROR_STOP=1 -c "$3"
}

pg_down() {  # DIR
  [ -s "$1/postmaster.pid" ] || return 0
  _as_pg "$PGBIN/pg_ctl" -D "$1" status >/dev/null 2>&1 || return 0
  _as_pg "$PGBIN/pg_ctl" -D "$1" -m fast -w -t 60 stop >/dev/null
}

# Overrides HOME (where Erlang keeps its cookie): only call inside a ( subshell ).
_rmq_env() {  # BASE PORT
  export HOME=$1 RABBITMQ_NODENAME=rabbit-$2@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$2 RABBITMQ_DIST_PORT=$(($2 + RMQ_DIST_OFFSET)) RABBITMQ_MNESIA_BASE=$1/mnesia \
    RABBITMQ_LOG_BASE=$1/log RABBITMQ_PID_FILE=$1/rabbit.pid \
    RABBITMQ_ENABLED_PLUGINS_FILE=$1/enabled_plugins ERL_CRASH_DUMP=$1/erl_crash.dump \
    ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

_alive() {  # PID: running and not a zombie (an init that reaps slowly keeps zombies around)
  [ -r "/proc/$1/stat" ] && ! grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2>/dev/null
}

_rmq_pid() {  # BASE -> pid of the broker started in BASE, if it is alive
  local pid
  pid=$(cat "$1/rabbit.pid" 2>/dev/null) || pid=
  # The pid file appears only part-way through boot: fall back to the beam whose command
  # line names this BASE as its HOME (a unique directory, so this cannot match another broker).
  [ -n "$pid" ] || pid=$(pgrep -f -- "beam.* -home $1 " 2>/dev/null | head -n 1) || pid=
  [ -n "$pid" ] && _alive "$pid" && echo "$pid"
}

rmq_up() {  # BASE PORT -> prints the AMQP URL; idempotent for BASE
  local base=$1 port=$2 i logs
  case $port in
    '' | *[!0-9]*) _svc_die "rmq_up: PORT must be a number, got '$port'"; return 1 ;;
  esac
  if [ "$port" -lt 1 ] || [ "$port" -gt "$RMQ_MAX_PORT" ]; then
    _svc_die "rmq_up: PORT $port is out of range: the broker also listens on PORT+$RMQ_DIST_OFFSET" \
      "(Erlang distribution), which must stay under 65536; use a port from 1 to $RMQ_MAX_PORT"
    return 1
  fi
  _rmq_installed || { _svc_die "RabbitMQ not found in $RMQBIN"; return 1; }
  if ! { _rmq_pid "$base" >/dev/null && _port_open "$port"; }; then
    _rmq_pid "$base" >/dev/null && { _svc_die "a broker in $base is running but not on $port"; return 1; }
    _port_open "$port" && { _svc_die "port $port is already in use"; return 1; }
    _port_open $((port + RMQ_DIST_OFFSET)) && {
      _svc_die "port $((port + RMQ_DIST_OFFSET)) (PORT+$RMQ_DIST_OFFSET, Erlang distribution) is already in use"
      return 1
    }
    mkdir -p "$base/mnesia" "$base/log"
    [ -f "$base/enabled_plugins" ] || echo '[].' >"$base/enabled_plugins"
    # epmd (port 4369) outlives the broker: remember whether this broker is the one starting it.
    _port_open 4369 || : >"$base/epmd.ours"
    ( _rmq_env "$base" "$port"; cd "$base"; "$RMQBIN/rabbitmq-server" -detached ) >/dev/null
    # -detached returns before anything listens; the AMQP listener opens last in boot.
    for i in $(seq 900); do _port_open "$port" && break; sleep 0.1; done
    if ! _port_open "$port"; then
      logs=$(ls "$base"/log/*.log 2>/dev/null || true)
      if [ -n "$logs" ]; then
        # shellcheck disable=SC2086 # one path a line, none with spaces (under BASE/log)
        tail -n 30 $logs >&2
        _svc_die "the broker in $base did not open port $port within 90 s (its log is above)"
      else
        _svc_die "the broker in $base did not open port $port within 90 s and wrote no log in $base/log"
      fi
      return 1
    fi
  fi
  echo "amqp://guest:guest@127.0.0.1:$port/"
}

rmq_ctl() { local b=$1 p=$2; shift 2; ( _rmq_env "$b" "$p"; "$RMQBIN/rabbitmqctl" "$@" ); }

rmq_down() {  # BASE: SIGTERM is a graceful shutdown of the beam; KILL after 30 s
  local base=$1 pid i
  if pid=$(_rmq_pid "$base"); then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 300); do _alive "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$base/rabbit.pid"
  # Stop epmd only if this broker started it and no other Erlang node still uses it.
  if [ -e "$base/epmd.ours" ] && command -v epmd >/dev/null 2>&1; then
    if ! ERL_EPMD_ADDRESS=127.0.0.1 epmd -names 2>/dev/null | grep -q '^name '; then
      epmd -kill >/dev/null 2>&1 || true
    fi
    rm -f "$base/epmd.ours"
  fi
  return 0
}
