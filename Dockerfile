# One image for every saga_tasks process: migrate, orchestrator, participants, beat, Flower.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY saga_tasks ./saga_tasks
COPY participants ./participants
COPY migrations ./migrations
RUN pip install . && useradd --system --home /app saga
USER saga
CMD ["saga-tasks", "--help"]
