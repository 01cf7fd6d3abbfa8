"""HAProxy's agent check on a replica: its one-line answers follow the live scheduler's
capacity, on a port served next to the WebSocket and closed with it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from audiofast.stream.haproxy_agent import agent_reply, start_agent


def test_agent_reply_follows_capacity_and_scheduler():
    assert agent_reply(0, 4, True) == "up ready maxconn:4\n"
    assert agent_reply(3, 4, True) == "up ready maxconn:4\n"
    assert agent_reply(4, 4, True) == "up drain maxconn:4\n"
    assert agent_reply(5, 4, True) == "up drain maxconn:4\n"  # opening + open past the cap
    assert agent_reply(0, 4, False) == "down#decode-scheduler-stopped maxconn:4\n"


def test_agent_port_answers_one_line_per_connection():
    class Replica:
        sessions = 0

        def load(self):
            return self.sessions, 2, True

    async def ask(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        line = await reader.read()  # the agent closes after its line
        writer.close()
        return line

    async def scenario() -> list[bytes]:
        replica = Replica()
        server = await start_agent(replica, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        answers = [await ask(port)]
        replica.sessions = 2
        answers.append(await ask(port))
        server.close()
        await server.wait_closed()
        with pytest.raises(OSError):
            await ask(port)
        return answers

    assert asyncio.run(scenario()) == [b"up ready maxconn:2\n", b"up drain maxconn:2\n"]


def test_agent_port_is_served_next_to_the_websocket(tiny):
    from audiofast.stream.server import ServerOptions, ServerThread

    thread = ServerThread(tiny, ServerOptions(port=0, max_sessions=3, agent_port=0))
    with thread, socket.create_connection(("127.0.0.1", thread.server.agent_port),
                                          timeout=5) as sock:
        assert sock.makefile().readline() == "up ready maxconn:3\n"
    with pytest.raises(OSError):  # closed with the server
        socket.create_connection(("127.0.0.1", thread.server.agent_port), timeout=5)
