"""``saga-tasks init participant``: a participant's Alembic chain, ready to migrate.

Every participant keeps its command ledger, outbox and redelivery counts in its own schema,
created by its own chain (its version table in that schema, apart from every other chain).
The chain's environment and first revision are the same for every participant but for the
schema's name and where its tables are declared; this writes them so a user adds only their
own tables.
"""

from __future__ import annotations

from pathlib import Path

from saga_tasks.errors import InputError
from saga_tasks.persistence.migrate import migrations_dir

ENV = '''"""Alembic environment of the {name} participant: its own chain, its version table in
the schema {schema}. ``saga-tasks db upgrade`` runs it in the database the participant uses."""

from __future__ import annotations

from saga_tasks.persistence.schema import run_migrations
{metadata_import}
run_migrations(
    version_table_schema="{schema}",
    schemas={{"{schema}"}},
    target_metadata={metadata},
)
'''

FIRST = '''"""The {name} participant's schema: the ledger, outbox and redelivery counts every
participant keeps. Declare the participant's own tables on its metadata, then
``saga-tasks db revision {name} -m "..."`` writes the next revision with them."""

from __future__ import annotations

from alembic import op

from saga_tasks.persistence.schema import create_participant_tables, create_redelivery_table

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_participant_tables(op, "{schema}")
    create_redelivery_table(op, "{schema}")


def downgrade() -> None:
    raise NotImplementedError("a participant's ledger is not dropped by a migration")
'''


def participant_chain(
    name: str, to: Path, *, schema: str | None = None, module: str | None = None
) -> list[Path]:
    """Write the chain of participant ``name`` into the directory ``to`` (which must be
    missing or empty); ``module`` (``package.module:attribute``) names the ``Participant``
    whose metadata autogenerate compares. The files written."""
    if not name.isidentifier():
        raise InputError(f"participant name {name!r} must be an identifier")
    schema = schema or name
    if not schema.isidentifier():
        raise InputError(f"schema {schema!r} must be an identifier")
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise InputError(f"{to} exists and is not an empty directory: nothing written")
    if module is not None:
        where, _, attribute = module.partition(":")
        if not where or not attribute or not all(p.isidentifier() for p in where.split(".")):
            raise InputError(f"--module {module!r}: give package.module:attribute")
        metadata_import = f"from {where} import {attribute}\n"
        metadata = f"{attribute}.metadata"
    else:
        metadata_import, metadata = "", "None"
    template = migrations_dir() / "script.py.mako"
    versions = to / "versions"
    versions.mkdir(parents=True, exist_ok=True)
    files = {
        to / "env.py": ENV.format(
            name=name, schema=schema, metadata_import=metadata_import, metadata=metadata
        ),
        to / "script.py.mako": template.read_text(),
        versions / f"0001_{name}_schema.py": FIRST.format(name=name, schema=schema),
    }
    for path, content in files.items():
        path.write_text(content)
    return list(files)
