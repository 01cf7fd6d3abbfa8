"""The live decode scheduler's ordering, on stand-in sessions and a stand-in decoder (the
real server and decoder are tested in test_stream.py; here only *when* each decode runs)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from audiofast.stream.scheduler import DecodeScheduler


class _Stream:
    """A session's policy that hands out the requests it is given, one at a time: none while
    one is in flight (handed out, not applied), as session.py's."""

    def __init__(self) -> None:
        self.requests: list[SimpleNamespace] = []
        self.applied: list[str] = []
        self.finished = False
        self.in_flight = False

    def next_request(self, urgent_only: bool = False) -> SimpleNamespace | None:
        if not self.in_flight and self.requests and (self.requests[0].urgent
                                                     or not urgent_only):
            self.in_flight = True
            return self.requests.pop(0)
        return None

    def supersede(self) -> SimpleNamespace | None:
        """The close that came due replaces the update in flight (session.py's rule)."""
        return self.requests.pop(0) if self.in_flight and self.requests \
            and self.requests[0].urgent else None

    def apply(self, hyp: str) -> list[dict]:
        self.applied.append(hyp)
        self.in_flight = False
        return []


def _session(number: int) -> SimpleNamespace:
    return SimpleNamespace(id=number, stream=_Stream(), over=asyncio.Event(),
                           lock=asyncio.Lock(), emit=lambda events: None,
                           finish=lambda: None, fail=lambda code: None)


class _Decoder:
    """A stand-in decoder that logs its calls; encoding ``blocking`` waits (in its worker
    thread) until a decode of urgent requests (``released_by``: of that one) has run, and times
    out if that never comes."""

    def __init__(self, blocking: str, released_by: str | None = None):
        self.blocking, self.released_by, self.log = blocking, released_by, []
        self.encoding, self.urgent_done = threading.Event(), threading.Event()

    def encode(self, request):
        self.log.append(("encode", request.name))
        if request.name == self.blocking:
            self.encoding.set()
            if not self.urgent_done.wait(10):
                raise TimeoutError("the urgent decode waited for the encoder call")
        return f"window of {request.name}"

    def decode(self, requests, encoded=None):
        self.log.append(("decode", [r.name for r in requests], encoded))
        if any(r.urgent and self.released_by in (None, r.name) for r in requests):
            self.urgent_done.set()
        return [f"text of {r.name}" for r in requests]


async def _arrives_during_encode(decoder: _Decoder, scheduler: DecodeScheduler,
                                 session: SimpleNamespace, name: str) -> None:
    """An urgent request comes due for ``session`` while the blocking window encodes, and
    wakes the scheduler as a VAD feed does."""
    await asyncio.to_thread(decoder.encoding.wait, 10)
    session.stream.requests.append(_request(name, urgent=True))
    scheduler.wake.set()


async def _round_while_arriving(decoder: _Decoder, scheduler: DecodeScheduler,
                                updating: list[SimpleNamespace], arriving: SimpleNamespace,
                                name: str) -> None:
    """A round of updates of ``updating``; ``name`` comes due for ``arriving`` while the
    blocking window encodes."""
    arrival = asyncio.ensure_future(_arrives_during_encode(decoder, scheduler, arriving, name))
    await scheduler._run_batch(_updates(*updating), updates=True)
    await arrival


def _updates(*sessions: SimpleNamespace) -> list[tuple[SimpleNamespace, SimpleNamespace]]:
    """A round of updates, one per session, handed out by the round's collect."""
    for session in sessions:
        session.stream.in_flight = True
    return [(session, _request(f"update {session.id}", urgent=False)) for session in sessions]


def _request(name: str, urgent: bool, probe: bool = False, waited_s: float = 0.0,
             ready: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, urgent=urgent, probe=probe, waited_s=waited_s,
                           ready=ready)


def test_first_words_come_due_during_an_update_encode_and_are_decoded_beside_it():
    """A request a user waits on that comes due while an update's window is encoding is
    decoded beside that encoder call, not after it: the stand-in encoder call only returns
    once the urgent decode has run (it would otherwise time out), and the update is still
    decoded and applied afterwards."""
    decoder = _Decoder(blocking="update 1")

    async def run() -> DecodeScheduler:
        updating, waiting = _session(1), _session(2)
        scheduler = DecodeScheduler(decoder, {1: updating, 2: waiting}, 0.0, 8)
        await _round_while_arriving(decoder, scheduler, [updating], waiting, "first words")
        assert updating.stream.applied == ["text of update 1"]
        assert waiting.stream.applied == ["text of first words"]
        return scheduler

    scheduler = asyncio.run(run())
    assert decoder.log == [("encode", "update 1"), ("decode", ["first words"], None),
                           ("decode", ["update 1"], ["window of update 1"])], decoder.log
    assert scheduler.stats["urgent_beside"] == 1 and scheduler.stats["decode_failures"] == 0


def test_a_close_replaces_its_sessions_encoded_update_while_the_round_still_encodes():
    """Session 1's update is encoded; while session 2's window encodes, session 1's close
    comes due. The close is decoded beside that encoder call (it would otherwise wait for
    the round's last encoder call and its decode), and session 1's encoded update is dropped
    from the round's decode, never applied; session 2's update is decoded as before."""
    decoder = _Decoder(blocking="update 2")

    async def run() -> DecodeScheduler:
        one, two = _session(1), _session(2)
        scheduler = DecodeScheduler(decoder, {1: one, 2: two}, 0.0, 8)
        await _round_while_arriving(decoder, scheduler, [one, two], one, "close 1")
        assert one.stream.applied == ["text of close 1"]
        assert two.stream.applied == ["text of update 2"]
        return scheduler

    scheduler = asyncio.run(run())
    assert decoder.log == [("encode", "update 1"), ("encode", "update 2"),
                           ("decode", ["close 1"], None),
                           ("decode", ["update 2"], ["window of update 2"])], decoder.log
    assert scheduler.stats["urgent_beside"] == 1


def test_what_users_wait_on_goes_one_at_a_time_nearest_deadline_first():
    """Three sessions' urgent requests come due in one round: a close decoded ahead (no
    work), a close whose speech ended 0.2 s ago (0.8 s left) and first words whose speech
    began 0.3 s ago (0.2 s left). Each is decoded on its own, the free one first, then
    earliest deadline first, so each goes out when its own decode is done."""
    decoder = _Decoder(blocking="")

    async def run() -> None:
        sessions = {k: _session(k) for k in (1, 2, 3)}
        sessions[1].stream.requests.append(_request("close 1", True, waited_s=0.2))
        sessions[2].stream.requests.append(_request("first words 2", True, probe=True,
                                                    waited_s=0.3))
        sessions[3].stream.requests.append(_request("close 3", True, ready="ahead"))
        scheduler = DecodeScheduler(decoder, sessions, 0.0, 8)
        scheduler.start()
        scheduler.wake.set()
        for _ in range(200):
            if all(s.stream.applied for s in sessions.values()):
                break
            await asyncio.sleep(0.01)
        scheduler.stopping = True
        scheduler._task.cancel()

    asyncio.run(run())
    assert [entry[1] for entry in decoder.log] == [
        ["close 3"], ["first words 2"], ["close 1"]], decoder.log


def test_a_close_that_comes_due_while_urgent_work_runs_replaces_its_update_at_once():
    """Session 1's update is encoding; session 2's first words are decoded beside it, and
    while they are, session 1's close comes due (its feed wakes the scheduler). The close is
    decoded right after the first words, replacing the update, not after the update's encoder
    call returns (that wake-up used to be lost: the stand-in encoder call only returns once
    the close has been decoded, and times out otherwise)."""
    decoder = _Decoder(blocking="update 1", released_by="close 1")

    async def run() -> DecodeScheduler:
        one, two = _session(1), _session(2)
        scheduler = DecodeScheduler(decoder, {1: one, 2: two}, 0.0, 8)
        decode = decoder.decode

        def first_words_then_close(requests, encoded=None):
            if [r.name for r in requests] == ["first words 2"]:
                one.stream.requests.append(_request("close 1", urgent=True))
                scheduler.wake.set()
            return decode(requests, encoded)

        decoder.decode = first_words_then_close
        await _round_while_arriving(decoder, scheduler, [one], two, "first words 2")
        assert one.stream.applied == ["text of close 1"]
        assert two.stream.applied == ["text of first words 2"]
        return scheduler

    asyncio.run(run())
    assert decoder.log == [("encode", "update 1"), ("decode", ["first words 2"], None),
                           ("decode", ["close 1"], None)], decoder.log
