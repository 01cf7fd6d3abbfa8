"""Live scale-out: the agent check's answers, and two real ``serve`` replicas behind the real
HAProxy with the shipped config, one killed mid-session (scripts/bench_haproxy.py's round)."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
from pathlib import Path

import pytest

from audiofast.stream.haproxy_agent import agent_reply, start_agent

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_haproxy.py"


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


@pytest.fixture(scope="module")
def fleet_round(clips):
    spec = importlib.util.spec_from_file_location("bench_haproxy", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.run_round("whisper-tiny.en", clips)


def test_sessions_split_and_a_full_replica_drains(fleet_round):
    assert fleet_round["open_sessions"] == {"r1": 2, "r2": 3}
    assert sorted(fleet_round["landed"]) == ["r1", "r1", "r2", "r2", "r2"]
    assert fleet_round["landed"][4] == "r2"  # the fifth, opened once r1 was full
    assert fleet_round["r1_status_when_full"].startswith("DRAIN")
    for session in fleet_round["first_sessions"]:
        if session["replica"] == "r1":  # finished before the kill, transcribed whole
            assert session["dropped"] is None and session["closed"]
            assert session["wer"] <= 0.1, session["text"]


def test_a_killed_replica_drops_nothing_silently(fleet_round):
    on_r2 = [s for s in fleet_round["first_sessions"] if s["replica"] == "r2"]
    assert len(on_r2) == 3
    for session in on_r2:  # each client saw its connection go, none was left waiting
        assert session["dropped"] == "ConnectionClosedError" and not session["closed"]
    fresh = fleet_round["new_sessions"]
    assert [s["error"] for s in fresh] == [None] * 4, fresh
    assert [s["replica"] for s in fresh] == ["r1"] * 4
    for session in fresh:
        assert session["closed"] and session["wer"] <= 0.1, session["text"]
    assert fleet_round["r2_down_after_s"] < 10
    assert fleet_round["full_fleet_handshake_status"] == 503
