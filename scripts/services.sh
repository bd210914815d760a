#!/usr/bin/env bash
# PostgreSQL and Redis on loopback, for Feast's production-like configuration
# (SQL registry on PostgreSQL, Redis online store; tests/test_feast_prod.py).
#
#   scripts/services.sh start    install what is missing, start, wait until both answer
#   scripts/services.sh stop     stop what `start` started; leave the rest running
#   scripts/services.sh status
#
# A server already answering on its port is used as it is and never stopped.
# Otherwise this starts its own: a Redis with no persistence, and a PostgreSQL
# cluster of its own (initdb, user `root`, trust on loopback) so that the
# machine's cluster and its authentication stay untouched. Their files live in
# $GEM_SERVICES_DIR (default /tmp/gem-services).
set -euo pipefail

REDIS_PORT=${GEM_REDIS_PORT:-6379}
PG_PORT=${GEM_PG_PORT:-5432}
PG_USER=root
STATE=${GEM_SERVICES_DIR:-/tmp/gem-services}

apt_install() {
  # One `apt-get update` per machine: a fresh one has empty package lists.
  if [ ! -e "$STATE/.apt-updated" ]; then
    apt-get update -qq
    mkdir -p "$STATE" && touch "$STATE/.apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

redis_up() { command -v redis-cli >/dev/null && redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; }
pg_up() { command -v pg_isready >/dev/null && pg_isready -h 127.0.0.1 -p "$PG_PORT" -q 2>/dev/null; }

pg_bindir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$dir" ] && echo "$dir"
}

start_redis() {
  if redis_up; then
    echo "redis: already answering on 127.0.0.1:$REDIS_PORT; using it"
    return
  fi
  command -v redis-server >/dev/null || apt_install redis-server redis-tools
  # The package may have started its own server on the default port.
  if redis_up; then
    echo "redis: answering on 127.0.0.1:$REDIS_PORT once installed; using it"
    return
  fi
  mkdir -p "$STATE/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" \
    --save "" --appendonly no --dir "$STATE/redis" \
    --pidfile "$STATE/redis/redis.pid" --logfile "$STATE/redis/redis.log"
  touch "$STATE/redis/started-here"
  echo "redis: started on 127.0.0.1:$REDIS_PORT (log: $STATE/redis/redis.log)"
}

start_postgres() {
  if pg_up; then
    echo "postgres: already answering on 127.0.0.1:$PG_PORT; using it"
    return
  fi
  local bin
  bin=$(pg_bindir) || { apt_install postgresql; bin=$(pg_bindir); }
  local data="$STATE/postgres/data"
  mkdir -p "$STATE/postgres"
  # PostgreSQL refuses to run as root: its own cluster belongs to `postgres`.
  local as=()
  if [ "$(id -u)" = 0 ]; then
    as=(runuser -u postgres --)
    chown postgres: "$STATE/postgres"
  fi
  if [ ! -s "$data/PG_VERSION" ]; then
    "${as[@]}" "$bin/initdb" -D "$data" -U "$PG_USER" --auth=trust \
      --encoding=UTF8 --locale=C.UTF-8 >"$STATE/postgres/initdb.log"
  fi
  "${as[@]}" "$bin/pg_ctl" -D "$data" -l "$STATE/postgres/postgres.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $PG_PORT -k $STATE/postgres -c fsync=off" start >/dev/null
  touch "$STATE/postgres/started-here"
  # Feast's default registry URL names the database after the user.
  "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -tAq \
    -c "SELECT 1 FROM pg_database WHERE datname = '$PG_USER'" | grep -q 1 \
    || "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" "$PG_USER"
  echo "postgres: started on 127.0.0.1:$PG_PORT (log: $STATE/postgres/postgres.log)"
}

wait_until_up() {
  for _ in $(seq 100); do
    if redis_up && pg_up; then
      return
    fi
    sleep 0.2
  done
  redis_up || echo "redis: not answering on 127.0.0.1:$REDIS_PORT" >&2
  pg_up || echo "postgres: not answering on 127.0.0.1:$PG_PORT" >&2
  exit 1
}

stop_services() {
  if [ -e "$STATE/redis/started-here" ]; then
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -f "$STATE/redis/started-here"
    echo "redis: stopped"
  fi
  if [ -e "$STATE/postgres/started-here" ]; then
    local as=()
    [ "$(id -u)" = 0 ] && as=(runuser -u postgres --)
    "${as[@]}" "$(pg_bindir)/pg_ctl" -D "$STATE/postgres/data" -m fast -w stop \
      >/dev/null || true
    rm -f "$STATE/postgres/started-here"
    echo "postgres: stopped"
  fi
}

case "${1:-start}" in
  start) start_redis; start_postgres; wait_until_up ;;
  stop) stop_services ;;
  status)
    redis_up && echo "redis: up on 127.0.0.1:$REDIS_PORT" || echo "redis: down"
    pg_up && echo "postgres: up on 127.0.0.1:$PG_PORT" || echo "postgres: down"
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
