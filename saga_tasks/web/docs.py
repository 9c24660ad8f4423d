"""``/docs``: Swagger UI from the installed ``swagger-ui-bundle-v2`` package, never a CDN.

A script from another origin runs with this origin's rights and could read the token a
person types into the page; the assets are files of a pinned package, served from here,
and the page's CSP lets nothing else run: scripts from this origin plus the one inline
start-up script, by its hash.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException

ASSETS = Path(str(swagger_ui_bundle.swagger_ui_path))
SERVED = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")
"""The files the page loads; nothing else of the bundle (its demo page fetches a remote
spec) is served."""

_INLINE = re.compile(r"<script>(.*?)</script>", re.S)


def mount_docs(web: FastAPI) -> None:
    """``/docs`` and its assets under ``/docs/assets``; build the app with ``docs_url=None``."""
    html = get_swagger_ui_html(
        openapi_url=web.openapi_url or "/openapi.json",
        title=f"{web.title} API",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon-32x32.png",
        # No validator badge: it is an image from a third-party host.
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
    ).body
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in _INLINE.findall(bytes(html).decode())
    )
    headers = {
        "Content-Security-Policy": (
            f"default-src 'none'; script-src 'self' {hashes}; style-src 'self'; "
            "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
            "base-uri 'none'; form-action 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    }

    @web.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(html, headers=headers)

    @web.get("/docs/assets/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        if name not in SERVED:
            raise HTTPException(404, "Not Found")
        return FileResponse(ASSETS / name, headers={"X-Content-Type-Options": "nosniff"})
