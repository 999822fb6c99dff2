"""`kubectl agentrun transcript|trace` for a run in the PostgreSQL transcript store (status.transcript.kind
postgres): its rows, read with the DSN the user gives, since the kubeconfig does not reach the database.

asyncpg is imported only when such a run is read: every other command of the plugin starts without it.
"""

from __future__ import annotations

import os

from agentrun.api.transcripts import Transcript, decode_chunks
from agentrun.cli.plugin_session import PluginError

ENV = "AGENTRUN_DATABASE_URL"


async def read_rows_transcript(uid: str, database_url: str | None) -> Transcript:
    dsn = database_url or os.environ.get(ENV)
    if not dsn:
        raise PluginError(
            "this run's transcript is in the PostgreSQL transcript store: give the database's DSN with "
            f"--database-url or {ENV} (postgresql://user:password@host:5432/db)"
        )
    import asyncpg  # the module docstring says why here

    from agentrun.stores.postgres import UNAVAILABLE, TranscriptDatabase

    try:
        database = await TranscriptDatabase.connect(dsn, max_size=1)
    except (ValueError, asyncpg.ClientConfigurationError) as exc:
        raise PluginError(f"the database URL is not a PostgreSQL DSN: {type(exc).__name__}") from exc
    try:
        return decode_chunks(await database.read_chunks(uid))
    except UNAVAILABLE as exc:
        raise PluginError(f"cannot reach the transcript database: {type(exc).__name__}: {exc}") from exc
    except asyncpg.PostgresError as exc:
        raise PluginError(f"the transcript database refused: {type(exc).__name__}: {exc}") from exc
    finally:
        await database.close()
