# shellcheck shell=bash
# Sourced by demo.sh and test.sh: PostgreSQL, RabbitMQ and Redis up on 127.0.0.1, a venv.
#
# For each service: use it if it already answers; else start it with docker compose
# where a Docker engine runs; else install Debian's package if missing and start it.
# Services this script starts are listed in .demo/started-services, so the demo can
# stop them again and leave the machine as it found it.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.demo"
mkdir -p "$STATE"

say() { printf '==> %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

apt_ready=0
apt_install() {
  command -v apt-get >/dev/null || die "cannot install $*: apt-get not found (install them by hand)"
  if [ "$apt_ready" = 0 ]; then
    say "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    apt_ready=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

have_docker_engine() {
  command -v docker >/dev/null && docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && exec 3>&- ; }

wait_port() {
  local port=$1 name=$2
  for _ in $(seq 1 120); do port_open "$port" && return 0; sleep 0.5; done
  die "$name did not open port $port"
}

started() { echo "$1" >> "$STATE/started-services"; }

compose_up() {
  say "starting $2 with docker compose"
  docker compose -f "$ROOT/compose.yml" up -d "$1" >/dev/null
  started "docker:$1"
}

ensure_base_tools() {
  local missing=()
  command -v python3 >/dev/null || missing+=(python3)
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  command -v curl >/dev/null || missing+=(curl ca-certificates)
  [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
  python3 - <<'PY' || die "Python 3.11 or newer is needed (found $(python3 --version))"
import sys
sys.exit(0 if sys.version_info >= (3, 11) else 1)
PY
}

ensure_postgres() {
  if ! port_open 5432; then
    if have_docker_engine; then
      compose_up postgres PostgreSQL
    else
      command -v pg_ctlcluster >/dev/null || apt_install postgresql postgresql-client
      local version
      version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
      # Installing the package may have started the cluster already (a VM with systemd).
      if ! pg_ctlcluster "$version" main status >/dev/null 2>&1; then
        say "starting PostgreSQL $version"
        pg_ctlcluster --skip-systemctl-redirect "$version" main start
      fi
      started "pg:$version"
    fi
    wait_port 5432 PostgreSQL
  fi
  command -v psql >/dev/null || apt_install postgresql-client
  # The role the project connects as; on a stock Debian cluster only peer auth works
  # for postgres, so create it through the local socket as the postgres user.
  if ! PGPASSWORD=saga_tasks psql -h 127.0.0.1 -U saga_tasks -d postgres -Atc 'SELECT 1' >/dev/null 2>&1; then
    say "creating PostgreSQL role saga_tasks"
    local sql="DO \$\$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'saga_tasks') THEN CREATE ROLE saga_tasks LOGIN CREATEDB PASSWORD 'saga_tasks'; ELSE ALTER ROLE saga_tasks LOGIN CREATEDB PASSWORD 'saga_tasks'; END IF; END \$\$;"
    if id postgres >/dev/null 2>&1 && (cd / && runuser -u postgres -- psql -Atc 'SELECT 1') >/dev/null 2>&1; then
      (cd / && runuser -u postgres -- psql -q -c "$sql")
    else
      psql -h 127.0.0.1 -U postgres -d postgres -q -c "$sql"
    fi
    PGPASSWORD=saga_tasks psql -h 127.0.0.1 -U saga_tasks -d postgres -Atc 'SELECT 1' >/dev/null \
      || die "role saga_tasks cannot log in over TCP: allow md5/scram or trust for 127.0.0.1 in pg_hba.conf"
  fi
}

ensure_rabbitmq() {
  if ! port_open 5672; then
    if have_docker_engine; then
      compose_up rabbitmq RabbitMQ
    else
      command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
      say "starting RabbitMQ"
      rabbitmq-server -detached >/dev/null 2>&1 || true
      rabbitmqctl await_startup >/dev/null 2>&1 || true
      started "rabbitmq"
    fi
    wait_port 5672 RabbitMQ
  fi
  if command -v rabbitmq-plugins >/dev/null && ! port_open 15672; then
    say "enabling the RabbitMQ management plugin (Flower's broker tab, test vhosts)"
    rabbitmq-plugins enable rabbitmq_management >/dev/null
    wait_port 15672 "RabbitMQ management"
  fi
}

ensure_redis() {
  if ! port_open 6379; then
    if have_docker_engine; then
      compose_up redis Redis
    else
      command -v redis-server >/dev/null || apt_install redis-server
      say "starting Redis"
      mkdir -p /var/lib/redis /var/log/redis
      redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/saga-tasks.log
      started "redis"
    fi
    wait_port 6379 Redis
  fi
}

ensure_services() {
  ensure_base_tools
  ensure_postgres
  ensure_rabbitmq
  ensure_redis
}

stop_started_services() {
  [ -f "$STATE/started-services" ] || return 0
  # The list is read on fd 3: tools such as rabbitmqctl read stdin and would eat it.
  while read -r service <&3; do
    case "$service" in
      docker:*) docker compose -f "$ROOT/compose.yml" stop "${service#docker:}" </dev/null >/dev/null 2>&1 || true ;;
      pg:*) pg_ctlcluster --skip-systemctl-redirect "${service#pg:}" main stop </dev/null || true ;;
      rabbitmq)
        rabbitmqctl stop </dev/null >/dev/null 2>&1 || true
        epmd -kill </dev/null >/dev/null 2>&1 || true ;;
      redis) redis-cli -p 6379 shutdown nosave </dev/null >/dev/null 2>&1 || true ;;
    esac
    say "stopped $service"
  done 3< "$STATE/started-services"
  rm -f "$STATE/started-services"
}

ensure_vhost() {
  local vhost=$1
  if port_open 15672; then
    curl -fsS -u guest:guest -X PUT "http://127.0.0.1:15672/api/vhosts/$vhost" >/dev/null
    curl -fsS -u guest:guest -X PUT -H 'content-type: application/json' \
      -d '{"configure":".*","write":".*","read":".*"}' \
      "http://127.0.0.1:15672/api/permissions/$vhost/guest" >/dev/null
  else
    rabbitmqctl add_vhost "$vhost" >/dev/null 2>&1 || true
    rabbitmqctl set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null
  fi
}

ensure_chromium() {
  # The dashboard tests drive Debian's Chromium with Playwright (no browser download).
  [ -x /usr/bin/chromium ] || apt_install chromium
}

ensure_venv() {
  local extras=${1:-}
  local venv="$ROOT/.venv"
  if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv"
    python3 -m venv "$venv"
  fi
  local stamp="$venv/.installed-${extras:-base}"
  if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] \
      || [ "$ROOT/tools/pyproject.toml" -nt "$stamp" ] || [ "$ROOT/constraints/lock.txt" -nt "$stamp" ]; then
    say "installing saga_tasks${extras:+[$extras]} and its tools into the venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    # The lock: the exact versions CI and the demo run (pyproject.toml declares the ranges).
    "$venv/bin/python" -m pip install -q -c "$ROOT/constraints/lock.txt" -e "$ROOT${extras:+[$extras]}"
    # The tools (bench, chaos, demo: commands of saga-tasks) are a distribution of their own.
    "$venv/bin/python" -m pip install -q -c "$ROOT/constraints/lock.txt" -e "$ROOT/tools"
    touch "$stamp"
  fi
  export PATH="$venv/bin:$PATH"
}
