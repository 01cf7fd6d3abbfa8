"""A Python client for ``audiofast serve``: stream audio in real time (or faster), collect
the events with the time each arrived."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from audiofast.audio import SAMPLE_RATE, AudioSource, load_audio
from audiofast.stream.protocol import join_finals


@dataclass
class StreamResult:
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (seconds, event)

    @property
    def finals(self) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e["type"] == "final"]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e["type"] == "error"]

    @property
    def text(self) -> str:
        return join_finals(e["text"] for e in self.finals)

    @property
    def closed(self) -> bool:
        return any(e["type"] == "closed" for _, e in self.events)


class StreamClient:
    """One session: ``async with StreamClient(url) as c: await c.send(pcm); await c.end()``."""

    def __init__(self, url: str, token: str | None = None, language: str | None = "en",
                 sample_rate: int = SAMPLE_RATE, task: str = "transcribe",
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        self.url, self.token = url, token
        self.start = {"type": "start", "sample_rate": sample_rate, "encoding": "pcm_s16le",
                      "channels": 1, "language": language, "task": task}
        self.on_event = on_event
        self.result = StreamResult()
        self.t0 = 0.0

    async def __aenter__(self) -> StreamClient:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        self.ws = await connect(self.url, additional_headers=headers, max_size=2**20)
        self.t0 = time.perf_counter()
        await self.ws.send(json.dumps(self.start))
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()
        self._reader.cancel()

    async def _read(self) -> None:
        async for message in self.ws:
            event = json.loads(message)
            self.result.events.append((time.perf_counter() - self.t0, event))
            if self.on_event:
                self.on_event(event)

    async def send(self, audio: np.ndarray) -> None:
        """Send float audio in [-1, 1] as int16 PCM."""
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        await self.ws.send(pcm)

    async def end(self, timeout: float = 60.0) -> StreamResult:
        """Say the audio is over and wait for the remaining finals and ``closed``."""
        await self.ws.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        return self.result


async def stream_audio(url: str, audio: np.ndarray, speed: float = 1.0, chunk_s: float = 0.1,
                       token: str | None = None, language: str | None = "en",
                       on_event: Callable[[dict[str, Any]], None] | None = None,
                       timeout: float = 120.0, until_closed: bool = False) -> StreamResult:
    """Send 16 kHz audio in ``chunk_s`` frames paced at ``speed`` x real time.
    ``until_closed``: if the server ends the session early (``overloaded``, ``busy``...),
    stop sending and return what arrived instead of raising."""
    chunk = int(chunk_s * SAMPLE_RATE)
    async with StreamClient(url, token, language, on_event=on_event) as client:
        try:
            for i, start in enumerate(range(0, len(audio), chunk)):
                await client.send(audio[start:start + chunk])
                if speed > 0:
                    due = client.t0 + (i + 1) * chunk_s / speed
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
            return await client.end(timeout)
        except ConnectionClosed:
            if not until_closed:
                raise
            with contextlib.suppress(TimeoutError, ConnectionClosed):
                await asyncio.wait_for(asyncio.shield(client._reader), 5)
            return client.result


def stream_file(path: AudioSource, url: str, speed: float = 1.0, **kwargs: Any) -> StreamResult:
    return asyncio.run(stream_audio(url, load_audio(path), speed, **kwargs))
