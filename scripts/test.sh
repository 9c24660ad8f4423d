#!/usr/bin/env bash
# The whole test suite: services up, a venv with the dev extras, lint, types, docs, tests.
# Each test gets its own RabbitMQ vhost and PostgreSQL database; all are removed after.
#
#   ./scripts/test.sh                 everything: the tests two at a time (SAGA_TEST_WORKERS),
#                                     then alone the one that restarts RabbitMQ and PostgreSQL
#   ./scripts/test.sh tests/unit -x   pytest arguments are passed on (lint and types still run)
set -euo pipefail
source "$(dirname "$0")/services.sh"
cd "$ROOT"

trap stop_started_services EXIT
ensure_services
ensure_chromium
ensure_venv dev
export SAGA_TEST_ADMIN_URL="${SAGA_TEST_ADMIN_URL:-postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/postgres}"

say "ruff"
ruff check .
ruff format --check .
say "mypy"
mypy
say "docs"   # the site builds with no warning: every link, anchor and included file resolves
site=$(mktemp -d)
# (not --quiet: it hides the warnings from --strict too, and a broken link passes)
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --site-dir "$site"
rm -rf "$site"
say "pytest"
if [ "$#" -gt 0 ]; then
  python -m pytest "$@"
else
  # Each test has a vhost and databases of its own, so two run side by side (one per
  # core); a test file stays on one worker. The chaos run restarts the services: alone.
  python -m pytest -n "${SAGA_TEST_WORKERS:-2}" --dist loadfile -m "not exclusive"
  python -m pytest -m exclusive
fi
