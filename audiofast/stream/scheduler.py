"""The live server's sessions and its decode scheduler.

Every way a session can end goes through :meth:`LiveSession.fail` or
:meth:`LiveSession.finish`, which wake its connection handler to close it: a failed decode
or a crashed scheduler can never leave a client waiting forever or hold its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection

from audiofast.stream.decoder import DecodeRequest, Hypothesis, StreamDecoder
from audiofast.stream.protocol import AudioDecoder, StartConfig, WhisperLiveView, error_event
from audiofast.stream.session import StreamSession

log = logging.getLogger("audiofast.serve")

# Why a session was ended: the message clients get (never exception text) and the close code.
FAILURES: dict[str, tuple[str, int]] = {
    "internal": ("internal server error; closing", 1011),
    "unavailable": ("the decoder is not running; try again later", 1011),
    "slow_reader": ("client does not read its events; closing", 1008),
    "idle_timeout": ("no message for too long; closing", 1008),
    "overloaded": ("too much audio waiting to be decoded; closing", 1013),
}

# When users expect what they wait on, from the moment the speech began (first words) or
# ended (a close; VAD confirms the end 0.5 s after): urgent work goes earliest deadline first.
FIRST_WORDS_S, FINAL_S = 0.5, 1.0


class LiveSession:
    """One connection: its stream policy, audio format, outbox, and how it ended."""

    ids = itertools.count(1)

    def __init__(self, ws: ServerConnection, config: StartConfig, stream: StreamSession,
                 max_outbox: int, failures: Counter[str]):
        self.id = next(self.ids)
        self.ws = ws
        self.config = config
        self.stream = stream
        self.audio = AudioDecoder(config)
        # Held (on the loop) while a worker thread runs VAD on ``stream``; an asyncio lock, so
        # the scheduler waits for it without blocking the event loop.
        self.lock = asyncio.Lock()
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(max_outbox)
        self.over = asyncio.Event()  # set once the session has ended: its handler closes it
        self.view = WhisperLiveView(config.uid or "") if config.dialect == "whisperlive" else None
        self.failed: str | None = None
        self.close_code = 1000
        self._failures = failures

    def emit(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            if self.over.is_set():
                return
            try:
                self.outbox.put_nowait(event)
            except asyncio.QueueFull:
                self.fail("slow_reader")
                return

    def fail(self, code: str, message: str | None = None) -> None:
        """End the session with an ``error`` event (best effort: a slow reader's outbox is
        full) and the close code for ``code``; the first reason wins."""
        if self.over.is_set():
            return
        self.failed = code
        self._failures[code] += 1
        text, self.close_code = FAILURES[code]
        with contextlib.suppress(asyncio.QueueFull):
            self.outbox.put_nowait(self.failure_event(code, message or text))
        self.over.set()

    def failure_event(self, code: str, message: str) -> dict[str, Any]:
        """The event that tells the client why its session ended (a dialect may reshape it)."""
        return error_event(code, message)

    def finish(self) -> None:
        """All audio is decoded after the client's end message."""
        self.emit([{"type": "closed", "reason": "end of audio"}])
        self.over.set()

    def wire(self, event: dict[str, Any]) -> list[str]:
        """The WebSocket messages ``event`` becomes in this session's dialect."""
        messages = self.view.translate(event) if self.view else [event]
        return [json.dumps(message) for message in messages]


class DecodeScheduler:
    """One task batches the due decodes of all sessions; a supervisor restarts it if it
    crashes, and if the supervisor itself ends every session is failed loudly."""

    def __init__(self, decoder: StreamDecoder, sessions: dict[int, LiveSession],
                 batch_window_s: float, max_batch: int):
        self.decoder = decoder
        self.sessions = sessions
        self.batch_window_s, self.max_batch = batch_window_s, max_batch
        self.wake = asyncio.Event()
        self.stats = {"batches": 0, "decoded": 0, "max_batch": 0, "urgent_first": 0,
                      "closed_ahead": 0, "urgent_between": 0, "urgent_beside": 0,
                      "decode_failures": 0,
                      "scheduler_restarts": 0, "http_requests": 0, "http_decode_s": 0.0}
        self.stopping = False  # set on shutdown: ending is expected then
        self._round: list[LiveSession] = []  # sessions of the round in progress
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise())
        self._task.add_done_callback(self._ended)

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _supervise(self) -> None:
        """Run the scheduler; when it crashes, fail the sessions of the round it was in (their
        state is unknown), log it and start it again, so decoding never stops silently."""
        crashes, batches = 0, -1
        while True:
            try:
                await self._schedule()
            except Exception:
                crashes = 1 if self.stats["batches"] != batches else crashes + 1
                batches = self.stats["batches"]
                self.stats["scheduler_restarts"] += 1
                log.exception("decode scheduler crashed; restarting it")
                for session in self._round:
                    session.fail("internal")
                self._round = []
                await asyncio.sleep(min(5.0, 0.05 * 2 ** min(crashes, 7)))  # back off a loop
                self.wake.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        if self.stopping:
            return
        log.error("decode scheduler stopped; failing all %d sessions", len(self.sessions))
        for session in list(self.sessions.values()):
            session.fail("internal")

    async def _schedule(self) -> None:
        rotation = 0
        while True:
            await self.wake.wait()
            self.wake.clear()
            await asyncio.sleep(self.batch_window_s)
            rotation += 1
            batch = self._collect(rotation)
            # What users wait on first (first words, closes): those sessions get their events
            # without waiting for the updates of utterances already under way.
            urgent = [(s, r) for s, r in batch if r.urgent]
            rest = [(s, r) for s, r in batch if not r.urgent]
            if urgent and rest:
                self.stats["urgent_first"] += 1
            for i, part in enumerate((urgent, rest)):
                if part:
                    # A crash fails the sessions not served yet (their requests are in flight).
                    self._round = [s for s, _ in (batch if i == 0 else rest)]
                    await (self._run_batch(part, updates=True) if i
                           else self._serve_urgent([], 0, set(), None, due=part))
            if batch:
                self.wake.set()  # results may make more decodes due
            self._round = []

    def _collect(self, rotation: int, urgent_only: bool = False
                 ) -> list[tuple[LiveSession, DecodeRequest]]:
        """The requests of sessions with a decode due, rotated for fairness (``urgent_only``:
        those a user waits on). A session whose VAD is running waits for the next round (its
        feed wakes the scheduler)."""
        live = [s for s in self.sessions.values() if not s.over.is_set()]
        if live:
            live = live[rotation % len(live):] + live[:rotation % len(live)]
        batch: list[tuple[LiveSession, DecodeRequest]] = []
        for session in live:
            if session.lock.locked():
                continue
            if len(batch) == self.max_batch:
                self.wake.set()  # the rest go next round
                break
            try:
                request = session.stream.next_request(urgent_only)
            except Exception:
                log.exception("session %d: preparing a decode failed", session.id)
                session.fail("internal")
                continue
            if request is not None:
                batch.append((session, request))
            elif session.stream.finished:
                session.finish()
        if not urgent_only:
            self._round = [s for s, _ in batch]
        return batch

    def close_ahead(self, session: LiveSession) -> None:
        """Apply a close whose hypothesis was decoded ahead (it needs no decoder) now, called
        right after the session's VAD: its final then goes out when VAD confirms the end, not
        after the other sessions' updates of the round in progress."""
        try:
            events = session.stream.close_ahead()
        except Exception:
            log.exception("session %d: closing an utterance failed", session.id)
            session.fail("internal")
            return
        if events is None:
            return
        self.stats["closed_ahead"] += 1
        session.emit(events)
        if session.stream.finished:
            session.finish()

    async def _run_batch(self, batch: list[tuple[LiveSession, DecodeRequest]],
                         updates: bool = False) -> None:
        """Decode ``batch`` and apply the hypotheses; ``updates``: the round's updates, which
        let what users wait on go first between their encoder calls (:meth:`_decode_updates`)."""
        hyps = await (self._decode_updates(batch) if updates else self._decode(batch))
        decoded = sum(h is not None for h in hyps)
        self.stats["batches"] += 1
        self.stats["decoded"] += decoded
        self.stats["max_batch"] = max(self.stats["max_batch"], decoded)
        for (session, _), hyp in zip(batch, hyps, strict=True):
            if hyp is None:
                continue
            async with session.lock:  # waits out a VAD call without blocking the loop
                if session.over.is_set():
                    continue
                try:
                    events = session.stream.apply(hyp)
                except Exception:
                    log.exception("session %d: applying a hypothesis failed", session.id)
                    session.fail("internal")
                    continue
            session.emit(events)
            if session.stream.finished:
                session.finish()

    async def _decode_updates(self, batch: list[tuple[LiveSession, DecodeRequest]]
                              ) -> list[Hypothesis | None]:
        """The updates of utterances under way, their windows encoded one call at a time (the
        encoder costs the same batched or not) and decoded together. Before and during each
        encoder call, what users wait on that came due meanwhile is decoded in a batch of its
        own: other sessions' first words and closes, and the close of a session whose update
        is not decoded yet, encoded or not (it replaces that update, whose hypothesis is then
        None: not applied). An encoded update is dropped too: its close would otherwise wait
        for the rest of the round's encoder calls and its decode (~1 s at 4 sessions), and
        the close's buffer holds the update's audio and more."""
        encoded: list[np.ndarray | None] = []
        superseded: set[int] = set()
        try:
            for k, (_, request) in enumerate(batch):
                await self._serve_urgent(batch, 0, superseded)
                encoded.append(None if k in superseded or request.ready is not None
                               else await self._beside_urgent(
                                   batch, 0, superseded, self.decoder.encode, request))
            keep = [k for k in range(len(batch)) if k not in superseded]
            hyps = await self._beside_urgent(
                batch, len(batch), superseded, self.decoder.decode,
                [batch[k][1] for k in keep], [encoded[k] for k in keep]) if keep else []
        except Exception:
            log.warning("a batch of %d updates failed to decode; retrying one at a time",
                        len(batch))
            keep = [k for k in range(len(batch)) if k not in superseded]
            hyps = await self._decode([batch[k] for k in keep])
        out: list[Hypothesis | None] = [None] * len(batch)
        for k, hyp in zip(keep, hyps, strict=True):
            out[k] = hyp
        return out

    async def _beside_urgent(self, batch: list[tuple[LiveSession, DecodeRequest]], first: int,
                             superseded: set[int], work: Callable[..., Any], *args: Any
                             ) -> Any:
        """``work(*args)`` (an update's encoder call, or the round's decode) in a worker thread;
        what users wait on that comes due meanwhile is decoded beside it, in a thread of its
        own, instead of after it: an update's window took ~0.3 s to encode at 4 sessions, and
        first words or a close waited for it. On a runtime with two CTranslate2 replicas
        (``serve``'s) the two encoder calls run at once; the fused decoder's loops take turns.
        Each session's text is what it was: only when each decode runs changes."""
        running = asyncio.ensure_future(asyncio.to_thread(work, *args))
        try:
            while True:
                self.wake.clear()  # the main loop re-collects after the round in any case
                woken = asyncio.ensure_future(self.wake.wait())
                await asyncio.wait({running, woken}, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                if running.done():
                    return running.result()
                await self._serve_urgent(batch, first, superseded, "urgent_beside")
        finally:  # left early by an error: the thread's outcome is still collected
            running.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _serve_urgent(self, batch: list[tuple[LiveSession, DecodeRequest]], first: int,
                            superseded: set[int], counter: str | None = "urgent_between",
                            due: list[tuple[LiveSession, DecodeRequest]] | None = None) -> None:
        """Decode and apply what users wait on (``due``, and what comes due meanwhile) one
        request at a time: closes decoded ahead first (they cost nothing), then earliest
        deadline first. In a burst (several sessions' closes and first words at once) each goes
        out when its own encoder call and decode are done, not when a whole batch's are (the
        encoder costs the same batched or not; the decoder's steps are a few ms). After each,
        what came due while it ran is collected, including the close of a session whose update
        in the round's ``batch`` (from index ``first`` on: not decoded yet) it replaces; the
        wake-up such an arrival sent would otherwise be lost. ``counter``: the /health count
        it adds to, once per call that serves anything."""
        queue: list[tuple[tuple[bool, float], LiveSession, DecodeRequest]] = []
        round_sessions = self._round
        counted = counter is None
        while True:
            now = time.monotonic()
            for session, request in (due or []) + self._came_due(batch, first, superseded):
                target = FIRST_WORDS_S if request.probe else FINAL_S
                queue.append(((request.ready is None, now + target - request.waited_s),
                              session, request))
            due = None
            if not queue:
                break
            if not counted:
                self.stats[counter] += 1
                counted = True
            queue.sort(key=lambda item: item[0])
            _, session, request = queue.pop(0)
            self._round = round_sessions + [session] + [s for _, s, _ in queue]
            await self._run_batch([(session, request)])
        self._round = round_sessions

    def _came_due(self, batch: list[tuple[LiveSession, DecodeRequest]], first: int,
                  superseded: set[int]) -> list[tuple[LiveSession, DecodeRequest]]:
        """What users wait on that is due now: sessions' first words and closes, and the
        closes that replace updates of ``batch`` (from index ``first`` on)."""
        urgent = []
        for k in range(first, len(batch)):
            session = batch[k][0]
            if k in superseded or session.lock.locked() or session.over.is_set():
                continue
            request = session.stream.supersede()
            if request is not None:
                superseded.add(k)
                urgent.append((session, request))
        return urgent + self._collect(0, urgent_only=True)

    async def _decode(self, batch: list[tuple[LiveSession, DecodeRequest]]
                      ) -> list[Hypothesis | None]:
        """Decode in a worker thread. If the batch fails, decode its members one at a time,
        so a request that breaks the decoder fails only its own session (None)."""
        try:
            return list(await asyncio.to_thread(self.decoder.decode, [r for _, r in batch]))
        except Exception:
            if len(batch) == 1:
                self._decode_failed(batch[0][0])
                return [None]
            log.warning("a batch of %d failed to decode; retrying one at a time", len(batch))
        hyps: list[Hypothesis | None] = []
        for session, request in batch:
            try:
                hyps += await asyncio.to_thread(self.decoder.decode, [request])
            except Exception:
                self._decode_failed(session)
                hyps.append(None)
        return hyps

    def _decode_failed(self, session: LiveSession) -> None:
        log.exception("session %d: decoding failed", session.id)  # the detail stays here
        self.stats["decode_failures"] += 1
        session.fail("internal")
