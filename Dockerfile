# One image for every saga_tasks process: migrate, orchestrator, participants, beat, Flower.
FROM python:3.11-slim
# The wheel is the library alone; the example (participants/, migrations/) is imported from /app.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PYTHONPATH=/app
WORKDIR /app
COPY pyproject.toml README.md ./
COPY constraints ./constraints
COPY saga_tasks ./saga_tasks
COPY participants ./participants
COPY migrations ./migrations
# /run/saga: the broker users' env files (a volume the migrate step writes, owned by saga).
# The web extra (the API and dashboard) and Flower for the processes that serve them; the
# versions CI ran (the lock).
RUN pip install -c constraints/lock.txt ".[web,flower]" && useradd --system --home /app saga && mkdir -p /run/saga && chown saga /run/saga
USER saga
CMD ["saga-tasks", "--help"]
