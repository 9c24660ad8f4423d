"""``saga-tasks web``: the command lives with the edge it serves, so the CLI (``ops``)
never imports the web stack; the CLI finds it by name (``ops.cli.plugins.EDGES``)."""

from __future__ import annotations

import click

from saga_tasks.ops.cli.base import EXIT_CONFIG, Context, errors, fail


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.pass_obj
def web(obj: Context, host: str, port: int) -> None:
    """Serve the HTTP API, /metrics and the dashboard (the ``web`` extra)."""
    try:
        import uvicorn

        from saga_tasks.web import create_web_app
    except ImportError as exc:  # a participant's install has no web stack
        fail(
            f"saga-tasks web needs the web extra ({exc.name or exc} is not installed): "
            "pip install 'saga_tasks[web]'",
            EXIT_CONFIG,
        )
    from saga_tasks.observability.logs import configure_logging

    app = obj.app()
    configure_logging(app.settings)  # SAGA_LOG_FORMAT and SAGA_LOG_LEVEL, as workers do
    with errors():
        web_app = create_web_app(app)
    click.echo(f"saga_tasks web on http://{host}:{port} (API docs at /docs)")
    uvicorn.run(web_app, host=host, port=port, log_level="info", access_log=False)
