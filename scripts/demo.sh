#!/usr/bin/env bash
# The demo: services up, migrations, orchestrator, one worker per participant queue,
# beat and Flower, a stream of order sagas through every path, and a summary.
#
#   ./scripts/demo.sh            run; stay up for Flower until Ctrl-C when run in a terminal
#   ./scripts/demo.sh --exit     run, print the summary, stop everything
#   ./scripts/demo.sh --stop     stop a demo left running (and services it started)
#   ./scripts/demo.sh --sagas 500 --rate 40   (any option of python -m tools.demo)
set -euo pipefail
source "$(dirname "$0")/services.sh"
cd "$ROOT"

export SAGA_DATABASE_URL="${SAGA_DATABASE_URL:-postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/saga_demo}"
# Each participant is a service with a database of its own: saga_demo_orders, ...
export SAGA_PARTICIPANT_DATABASE_URL="${SAGA_PARTICIPANT_DATABASE_URL:-postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/saga_demo_{participant}}"
export SAGA_BROKER_URL="${SAGA_BROKER_URL:-amqp://guest:guest@127.0.0.1:5672/saga_demo}"
export SAGA_RESULT_BACKEND="${SAGA_RESULT_BACKEND:-redis://127.0.0.1:6379/1}"
export SAGA_TASKS_APP="${SAGA_TASKS_APP:-participants.app:saga_app}"

if [ "${1:-}" = "--stop" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then
    "$ROOT/.venv/bin/python" -m tools.demo --stop || true
  fi
  stop_started_services
  exit 0
fi

# Whatever happens from here (Ctrl-C, a failure), the services this run started stop.
trap stop_started_services EXIT
ensure_services
ensure_venv web,flower
ensure_vhost saga_demo
say "migrating the orchestrator's database and each participant's"
saga-tasks db upgrade
saga-tasks broker declare >/dev/null   # as the administrator: the only step that configures
# A broker user per service (saga-demo-orchestrator, saga-demo-orders, ...), least privilege;
# their env files (mode 0600) in .demo/broker. No worker runs as guest.
export SAGA_BROKER_USER_PREFIX="${SAGA_BROKER_USER_PREFIX:-saga-demo-}"
saga-tasks broker users --env-dir "$ROOT/.demo/broker" >/dev/null
say "running the demo"
python -m tools.demo --users "$ROOT/.demo/broker" "$@"
