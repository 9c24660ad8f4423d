"""The example deployment: the order and returns sagas and their four participants.

export SAGA_PARTICIPANT_DATABASE_URL='postgresql+psycopg2://...@127.0.0.1:5432/{participant}'
saga-tasks --app participants.app:saga_app db upgrade     # saga database, then each participant's
python -m participants.seed                               # stock and customers
celery -A participants.app worker -Q saga.replies,saga.maintenance -n orchestrator@%h
celery -A participants.app worker -Q inventory.commands -n inventory@%h
celery -A participants.app beat
"""

from __future__ import annotations

from participants import inventory, orders, payments, returns
from participants.faults import DemoFaults
from participants.order_saga import ORDER_SAGA
from participants.return_saga import RETURN_SAGA
from saga_tasks import SagaApp

saga_app = SagaApp(
    sagas=[ORDER_SAGA, RETURN_SAGA],
    participants=[
        orders.participant,
        inventory.participant,
        payments.participant,
        returns.participant,
    ],
    name="participants",
    hooks=DemoFaults.from_env(),  # SAGA_TASKS_DEMO_FAULTS=1 lets payloads ask for faults
)
app = saga_app.celery
