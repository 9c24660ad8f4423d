"""Group commit of a participant's commands (``Participant(batch=)``) through real
workers: the commands a participant's worker holds run in one transaction of its own
database, a refusal among them runs alone, and a kill while a batch is open loses and
doubles nothing.

Commands pile up first (their participant's worker is not running), so it starts with a
queue of them. Ledger rows one transaction wrote share its ``xmin``.
"""

from __future__ import annotations

import signal

import pytest
from sqlalchemy import text

from saga_tasks.testing import wait_for
from tests.helpers import (
    ORDER,
    assert_each_effect_once,
    participant_db,
    pile_up,
    scalar,
    statuses,
    wait_for_lock_waiter,
)

COMMITS = "SELECT count(DISTINCT xmin::text) FROM {schema}.command_ledger WHERE step = :step"
LARGEST = (
    "SELECT max(n) FROM (SELECT count(*) AS n FROM {schema}.command_ledger "
    "WHERE step = :step GROUP BY xmin::text) AS batches"
)
OTHERS = {
    "orders": ["orders.commands"],
    "inventory": ["inventory.commands"],
    "payments": ["payments.commands"],
}


def _start(workers, *names: str):
    return [workers.start(name, OTHERS[name]) for name in names]


def _all_ended(order_app, expected: dict[str, int]) -> None:
    wait_for(
        lambda: statuses(order_app) == expected,
        timeout=120,
        describe=lambda: f"sagas {expected} (now {statuses(order_app)})",
    )


@pytest.mark.timeout(180)
def test_commands_held_together_commit_together(order_app, workers):
    sagas = 24
    pile_up(order_app, "orders.commands", [ORDER] * sagas)

    workers.orchestrator()
    _start(workers, "orders", "inventory", "payments")
    _all_ended(order_app, {"COMPLETED": sagas})

    assert_each_effect_once(order_app, sagas)
    orders = participant_db(order_app, "orders")
    commits = scalar(orders, COMMITS.format(schema="orders"), step="create_order")
    assert commits < sagas / 2, f"{sagas} waiting commands ran in {commits} transactions"
    largest = scalar(orders, LARGEST.format(schema="orders"), step="create_order")
    assert largest > 4, f"no batch larger than the prefetch of 4 asked for ({largest})"


@pytest.mark.timeout(180)
def test_a_refusal_in_a_batch_runs_alone_and_its_neighbours_commit(order_app, workers):
    """An unknown SKU among held reservations: the batch rolls back, each command runs
    alone, the refused saga compensates and the rest complete, each effect once."""
    sagas = 16
    refused = {**ORDER, "items": [{"sku": "sku-nowhere", "qty": 1}]}
    workers.orchestrator()
    _start(workers, "orders", "payments")
    payloads = [ORDER] * (sagas // 2) + [refused] + [ORDER] * (sagas // 2 - 1)
    pile_up(order_app, "inventory.commands", payloads)

    (inventory,) = _start(workers, "inventory")
    _all_ended(order_app, {"COMPLETED": sagas - 1, "COMPENSATED": 1})

    stock = participant_db(order_app, "inventory")
    assert scalar(stock, "SELECT count(*) FROM inventory.reservation") == sagas - 1
    assert scalar(stock, "SELECT reserved FROM inventory.stock WHERE sku = 'sku-1'") == 2 * (
        sagas - 1
    )
    refusals = "SELECT count(*) FROM inventory.command_ledger WHERE outcome = 'failure'"
    assert scalar(stock, refusals) == 1
    assert "rolled back (BusinessRejection" in inventory.log_text()


@pytest.mark.timeout(180)
def test_participant_killed_while_a_batch_waits_mid_transaction(order_app, workers):
    """SIGKILL while the batch's transaction is open (it waits for the stock row the test
    holds): nothing of it committed; every command comes again and takes effect once."""
    sagas = 16
    workers.orchestrator()
    _start(workers, "orders", "payments")
    pile_up(order_app, "inventory.commands", [ORDER] * sagas)
    stock = participant_db(order_app, "inventory")

    with stock.connect() as blocker:
        blocker.execute(text("SELECT 1 FROM inventory.stock WHERE sku = 'sku-1' FOR UPDATE"))
        (inventory,) = _start(workers, "inventory")
        wait_for_lock_waiter(stock, "a batch waiting for the stock row the test holds")
        inventory.kill(signal.SIGKILL)
        blocker.rollback()

    _start(workers, "inventory")
    _all_ended(order_app, {"COMPLETED": sagas})
    assert_each_effect_once(order_app, sagas)
