"""Overload, briefly (scripts/soak_stream.py runs it for minutes): more real-time sessions
than two cores can decode. Nothing crashes and nothing is dropped silently: every session
ends with all its finals or with an explicit ``overloaded`` error, and the server serves on."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np

from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.stream.client import stream_audio
from audiofast.stream.server import ServerOptions, ServerThread
from audiofast.stream.session import StreamOptions

CLIENTS = 16


def test_overload_fails_sessions_explicitly_and_the_server_serves_on(live, clips):
    audio = np.concatenate([load_audio(c.audio) for c in clips.values()])
    # A small pending-audio limit, so that overload shows within seconds, not a minute.
    options = ServerOptions(port=0, max_sessions=CLIENTS, stream=StreamOptions(max_pending_s=4))
    thread = ServerThread(live, options)
    with thread as url:
        async def run_all():
            return await asyncio.gather(*(
                stream_audio(url, np.roll(audio, -i * 3 * SAMPLE_RATE)[: 12 * SAMPLE_RATE],
                             1.0, timeout=300, until_closed=True) for i in range(CLIENTS)))

        results = asyncio.run(run_all())
        health = json.loads(urllib.request.urlopen(thread.http_url + "health").read())
    outcomes = []
    for result in results:
        codes = [e["code"] for e in result.errors]
        if result.closed:
            assert not codes, codes
            outcomes.append("complete")
        else:
            assert codes == ["overloaded"], (codes, result.events[-3:])
            outcomes.append("overloaded")
    assert "overloaded" in outcomes, "16 sessions on 2 cores should have overloaded"
    assert health["ok"] and health["sessions"] == 0
    assert health["failures"].get("overloaded", 0) == outcomes.count("overloaded")
