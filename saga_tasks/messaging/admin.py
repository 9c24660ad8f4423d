"""The broker itself: vhosts, users and their permissions, and what a queue holds or who
consumes it."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kombu import Connection

from saga_tasks.errors import ConfigurationError, ServiceUnavailable


@dataclass
class RabbitAdmin:
    """Vhosts and queue counts, through the management API or, without it, ``rabbitmqctl``;
    users and permissions through the management API only (``rabbitmqctl`` would take a
    password on its command line, where ``ps`` shows it)."""

    api: str = "http://127.0.0.1:15672/api"
    user: str = "guest"
    password: str = "guest"  # noqa: S105 - RabbitMQ's local default account

    @classmethod
    def for_broker(cls, url: str) -> RabbitAdmin:
        """The admin of the broker at ``url`` (its first, for a failover list): its
        management API on the default port, as the user and password the URL gives
        (``guest``/``guest`` when it gives none, as RabbitMQ does)."""
        from saga_tasks.messaging.users import credentials, management_api

        first = url.split(";", maxsplit=1)[0]
        user, password = credentials(first)
        return cls(api=management_api(first), user=user or "guest", password=password or "guest")

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method)  # noqa: S310
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                payload = response.read()
        except urllib.error.HTTPError as exc:
            exc.close()  # its body is the open response: the socket would be left behind
            raise
        return json.loads(payload) if payload else None

    def available(self) -> bool:
        try:
            self._request("GET", "/overview")
        except (urllib.error.URLError, OSError):
            return False
        return True

    def create_vhost(self, name: str) -> None:
        """Create vhost ``name`` and give this user all rights on it: through the
        management API, or ``rabbitmqctl`` where there is none. A refusal, or neither
        way there, is a ``ConfigurationError`` saying what it needs."""
        try:
            self._request("PUT", f"/vhosts/{quote(name, safe='')}")
            self._request(
                "PUT",
                f"/permissions/{quote(name, safe='')}/{quote(self.user, safe='')}",
                {"configure": ".*", "write": ".*", "read": ".*"},
            )
            return
        except urllib.error.HTTPError as exc:
            raise ConfigurationError(
                f"RabbitMQ's management API at {self.api} refused {self.user!r} creating "
                f"vhost {name!r} (HTTP {exc.code}): that needs a user with the "
                f"administrator tag (rabbitmqctl set_user_tags {self.user} administrator)"
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            if shutil.which("rabbitmqctl") is None:
                raise ConfigurationError(
                    f"cannot create vhost {name!r}: no RabbitMQ management API answers at "
                    f"{self.api} ({exc}) and rabbitmqctl is not on PATH; enable the API "
                    f"(rabbitmq-plugins enable rabbitmq_management) or create the vhost"
                ) from exc
        self._ctl("add_vhost", name)
        self._ctl("set_permissions", "-p", name, self.user, ".*", ".*", ".*")

    def _ctl(self, *args: str) -> None:
        done = subprocess.run(["rabbitmqctl", *args], check=False, capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise ConfigurationError(
                f"rabbitmqctl {args[0]} failed: {said[-1] if said else done.returncode}"
            )

    def delete_vhost(self, name: str) -> None:
        if self.available():
            with contextlib.suppress(urllib.error.HTTPError):
                self._request("DELETE", f"/vhosts/{quote(name, safe='')}")
            return
        subprocess.run(["rabbitmqctl", "delete_vhost", name], check=False, capture_output=True)

    # -- users: the management API only ---------------------------------------------------

    def _managed(self, method: str, path: str, body: Any = None) -> Any:
        """A management API call; its absence or a refusal is ``ServiceUnavailable``."""
        try:
            return self._request(method, path, body)
        except urllib.error.HTTPError as exc:
            raise ServiceUnavailable(
                "RabbitMQ management API", self.api, OSError(f"{method} {path}: HTTP {exc.code}")
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServiceUnavailable("RabbitMQ management API", self.api, exc) from exc

    def user_exists(self, name: str) -> bool:
        try:
            self._request("GET", f"/users/{quote(name, safe='')}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise ServiceUnavailable(
                "RabbitMQ management API", self.api, OSError(f"HTTP {exc.code}")
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ServiceUnavailable("RabbitMQ management API", self.api, exc) from exc
        return True

    def put_user(self, name: str, password: str) -> None:
        """Create the user, or set its password; no tags (no management access)."""
        self._managed("PUT", f"/users/{quote(name, safe='')}", {"password": password, "tags": ""})

    def delete_user(self, name: str) -> None:
        with contextlib.suppress(urllib.error.HTTPError):
            self._request("DELETE", f"/users/{quote(name, safe='')}")

    def users(self, prefix: str) -> list[str]:
        return [u["name"] for u in self._managed("GET", "/users") if u["name"].startswith(prefix)]

    def set_permissions(
        self, vhost: str, user: str, *, configure: str, write: str, read: str
    ) -> None:
        self._managed(
            "PUT",
            f"/permissions/{quote(vhost, safe='')}/{quote(user, safe='')}",
            {"configure": configure, "write": write, "read": read},
        )

    def set_topic_permissions(
        self, vhost: str, user: str, *, exchange: str, write: str, read: str
    ) -> None:
        self._managed(
            "PUT",
            f"/topic-permissions/{quote(vhost, safe='')}/{quote(user, safe='')}",
            {"exchange": exchange, "write": write, "read": read},
        )

    def permissions(self, vhost: str, user: str) -> dict[str, Any] | None:
        """The user's permissions on ``vhost`` (configure, write, read), None if none."""
        try:
            found = self._request(
                "GET", f"/permissions/{quote(vhost, safe='')}/{quote(user, safe='')}"
            )
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise ServiceUnavailable(
                "RabbitMQ management API", self.api, OSError(f"HTTP {exc.code}")
            ) from exc
        return {k: found[k] for k in ("configure", "write", "read")}

    def vhosts(self, prefix: str) -> list[str]:
        if self.available():
            return [
                v["name"] for v in self._request("GET", "/vhosts") if v["name"].startswith(prefix)
            ]
        out = subprocess.run(
            ["rabbitmqctl", "list_vhosts", "-q"], check=True, capture_output=True, text=True
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip().startswith(prefix)]


def queue_depths(broker_url: str, queues: Sequence[str]) -> dict[str, int]:
    """Ready messages per queue, read with passive declares over AMQP."""
    depths: dict[str, int] = {}
    with Connection(broker_url) as conn:
        for name in queues:
            channel: Any = conn.channel()
            try:
                _, count, _ = channel.queue_declare(queue=name, passive=True)
                depths[name] = int(count)
            finally:
                channel.close()
    return depths


def consumed(broker_url: str, queues: Sequence[str]) -> bool:
    """True when every queue exists and has at least one consumer."""
    with Connection(broker_url, connect_timeout=3) as conn:
        for name in queues:
            channel: Any = conn.channel()
            try:
                _, _, consumers = channel.queue_declare(queue=name, passive=True)
            except Exception:  # noqa: BLE001 - not declared yet: not consumed
                return False
            finally:
                channel.close()
            if not consumers:
                return False
    return True


def check_broker(url: str) -> None:
    """Raise ``ServiceUnavailable`` unless RabbitMQ accepts a connection at ``url``."""
    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    except Exception as exc:
        raise ServiceUnavailable("RabbitMQ", url, exc) from exc


def vhost_missing(url: str) -> bool:
    """True when RabbitMQ answers at ``url`` but has no vhost of the name it gives (the
    broker refuses the connection with 530 NOT_ALLOWED). Any other failure raises
    ``ServiceUnavailable``."""
    from amqp.exceptions import NotAllowed

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.connect()
    except NotAllowed as exc:
        if "vhost" in str(exc):
            return True
        raise ServiceUnavailable("RabbitMQ", url, exc) from exc
    except Exception as exc:
        raise ServiceUnavailable("RabbitMQ", url, exc) from exc
    return False
