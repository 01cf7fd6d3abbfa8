"""HAProxy's agent check for a ``serve`` replica (``serve --agent-port``).

HAProxy balances live sessions across replicas with ``leastconn``; what it cannot see is that a
replica is full (``--max-sessions`` open) and would refuse the next session with "busy". Every
``agent-inter`` it opens a TCP connection to this port and reads one line, which here says:

- ``drain``: full, send no new sessions (the open ones go on); ``ready`` once a slot frees;
- ``down#<why>``: the decode scheduler stopped; ``up`` again when it runs;
- ``maxconn:<N>``: this replica's own capacity, so HAProxy queues rather than over-fills it
  while the next check is pending.

See configs/haproxy/audiofast.cfg and docs/scale-out.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Replica(Protocol):
    """What the agent reads of a TranscriptionServer."""

    def load(self) -> tuple[int, int, bool]:
        """(sessions open or opening, max sessions, decode scheduler running)."""
        ...


def agent_reply(sessions: int, max_sessions: int, running: bool) -> str:
    """The line HAProxy reads (its agent-check grammar: words separated by spaces)."""
    capacity = f"maxconn:{max_sessions}"
    if not running:
        return f"down#decode-scheduler-stopped {capacity}\n"
    if sessions >= max_sessions:
        return f"up drain {capacity}\n"
    return f"up ready {capacity}\n"


async def start_agent(replica: Replica, host: str, port: int) -> asyncio.Server:
    """Answer HAProxy's agent check on ``host:port`` (0: a free port) in this event loop."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(agent_reply(*replica.load()).encode())
            await writer.drain()
        except (ConnectionError, OSError) as err:  # HAProxy gave up first: nothing to do
            log.debug("agent check: %s", err)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    return await asyncio.start_server(answer, host, port)
