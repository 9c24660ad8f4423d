"""The trust matrix for HTTP: the web app serves exactly the routes of
``saga_tasks.ops.trust.ROUTES``, and each answers a caller with no token and with a token
of each scope as the table says, against real PostgreSQL. A route added without a row
here, or guarded by another scope than its row says, fails this test."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Route as StarletteRoute

from saga_tasks.ops.trust import ROUTES, SCOPES, Route, routes_markdown
from tests.docs import page
from tests.helpers import ORDER, WebClients

TOKENS = {scope: f"token-of-{scope}-only-0123456789" for scope in SCOPES}


def served(web: Any) -> set[tuple[str, str]]:
    """(method, path) of every route the app serves, static files and docs assets aside.
    A FastAPI that includes routers lazily keeps them as one entry each, holding the
    router it includes (``original_router``; none of ours has a prefix)."""
    found = set()

    def walk(routes: Any) -> None:
        for route in routes:
            included = getattr(route, "original_router", None)
            if included is not None:
                walk(included.routes)
                continue
            if not isinstance(route, APIRoute | StarletteRoute) or route.path.startswith("/docs/"):
                continue
            for method in route.methods or ():
                if method != "HEAD":
                    found.add((method, route.path))

    walk(web.routes)
    return found


@pytest.fixture
def web(order_app, settings):
    """A web app with one token per scope; a saga to read and act on."""
    entries = ",".join(f"{scope}-actor:{token}:{scope}" for scope, token in TOKENS.items())
    build = WebClients(order_app, settings, entries)
    yield build
    build.close()


def call(client: TestClient, route: Route, saga_id: str, token: str | None) -> Any:
    """The route sent as a well-formed request would be: real ids, bodies it accepts."""
    values = {
        "saga_id": saga_id,
        "saga_type": "order",
        "action": "compensate",
        "step": "approve",
        "held_id": "1",
        "verb": "discard",
    }
    path = route.path.format(**values)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body: dict[str, Any] | None = None
    if route.method == "POST":
        body = {"reason": "trust routes", "to_version": 1, "data": {}}
        if route.path == "/sagas/{saga_type}":
            body = {"business_key": f"trust-{token}", "payload": ORDER}
            headers["Idempotency-Key"] = f"trust-{token}"
    return client.request(route.method, path, json=body, headers=headers)


def test_the_app_serves_exactly_the_routes_of_the_table(web):
    assert served(web().app) == {(r.method, r.path) for r in ROUTES}
    guide = page("guides/observing.md").read_text()
    assert routes_markdown() in guide, (
        "the observing guide's route table differs from ops.trust.ROUTES"
    )


@pytest.mark.parametrize("public_read", [False, True])
def test_every_route_answers_each_caller_as_the_table_says(web, order_app, public_read):
    saga_id = order_app.start_saga("order", business_key="trust-routes", payload=ORDER)
    client = web(api_public_read=public_read)
    callers: list[tuple[str | None, frozenset[str] | None]] = [(None, None)]
    callers += [(TOKENS[s], frozenset({s})) for s in SCOPES]
    for route in ROUTES:
        for token, scopes in callers:
            expected = route.answer(scopes, public_read=public_read)
            answer = call(client, route, saga_id, token)
            who = f"{route.method} {route.path} with {sorted(scopes) if scopes else 'no token'}"
            if expected == "allowed":
                assert answer.status_code not in (401, 403), (who, answer.text[:300])
            else:
                assert answer.status_code == int(expected), (who, answer.text[:300])
                if expected == "403" and answer.headers["content-type"].startswith("application"):
                    assert answer.json()["missing_scope"] == route.scope, who
