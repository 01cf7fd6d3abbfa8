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


def test_first_words_come_due_during_an_update_encode_and_are_decoded_beside_it():
    """A request a user waits on that comes due while an update's window is encoding is
    decoded beside that encoder call, not after it: the stand-in encoder call only returns
    once the urgent decode has run (it would otherwise time out), and the update is still
    decoded and applied afterwards."""
    encoding, urgent_done, log = threading.Event(), threading.Event(), []

    class Decoder:
        def encode(self, request):
            encoding.set()
            log.append("encode")
            if not urgent_done.wait(10):
                raise TimeoutError("the urgent decode waited for the encoder call")
            return f"window of {request.name}"

        def decode(self, requests, encoded=None):
            log.append(("decode", [r.name for r in requests], encoded))
            if any(r.urgent for r in requests):
                urgent_done.set()
            return [f"text of {r.name}" for r in requests]

    async def run() -> DecodeScheduler:
        updating, waiting = _session(1), _session(2)
        scheduler = DecodeScheduler(Decoder(), {1: updating, 2: waiting}, 0.0, 8)
        update = SimpleNamespace(name="update", urgent=False, ready=None)
        updating.stream.in_flight = True  # handed out by the round's collect

        async def first_words_arrive() -> None:
            await asyncio.to_thread(encoding.wait, 10)
            waiting.stream.requests.append(SimpleNamespace(name="first words", urgent=True,
                                                           ready=None))
            scheduler.wake.set()  # as a VAD feed does

        arrival = asyncio.ensure_future(first_words_arrive())
        await scheduler._run_batch([(updating, update)], updates=True)
        await arrival
        assert updating.stream.applied == ["text of update"]
        assert waiting.stream.applied == ["text of first words"]
        return scheduler

    scheduler = asyncio.run(run())
    assert log == ["encode", ("decode", ["first words"], None),
                   ("decode", ["update"], ["window of update"])], log
    assert scheduler.stats["urgent_beside"] == 1 and scheduler.stats["decode_failures"] == 0


def test_a_close_replaces_its_sessions_encoded_update_while_the_round_still_encodes():
    """Session 1's update is encoded; while session 2's window encodes, session 1's close
    comes due. The close is decoded beside that encoder call (it would otherwise wait for
    the round's last encoder call and its decode), and session 1's encoded update is dropped
    from the round's decode, never applied; session 2's update is decoded as before."""
    second_encoding, close_done, log = threading.Event(), threading.Event(), []

    class Decoder:
        def encode(self, request):
            log.append(("encode", request.name))
            if request.name == "update 2":
                second_encoding.set()
                if not close_done.wait(10):
                    raise TimeoutError("the close waited for the round")
            return f"window of {request.name}"

        def decode(self, requests, encoded=None):
            log.append(("decode", [r.name for r in requests]))
            if any(r.urgent for r in requests):
                close_done.set()
            return [f"text of {r.name}" for r in requests]

    async def run() -> DecodeScheduler:
        one, two = _session(1), _session(2)
        scheduler = DecodeScheduler(Decoder(), {1: one, 2: two}, 0.0, 8)
        updates = [(one, SimpleNamespace(name="update 1", urgent=False, ready=None)),
                   (two, SimpleNamespace(name="update 2", urgent=False, ready=None))]
        one.stream.in_flight = two.stream.in_flight = True  # handed out by the round's collect

        async def close_comes_due() -> None:
            await asyncio.to_thread(second_encoding.wait, 10)
            one.stream.requests.append(SimpleNamespace(name="close 1", urgent=True,
                                                       ready=None))
            scheduler.wake.set()

        arrival = asyncio.ensure_future(close_comes_due())
        await scheduler._run_batch(updates, updates=True)
        await arrival
        assert one.stream.applied == ["text of close 1"]
        assert two.stream.applied == ["text of update 2"]
        return scheduler

    scheduler = asyncio.run(run())
    assert log == [("encode", "update 1"), ("encode", "update 2"), ("decode", ["close 1"]),
                   ("decode", ["update 2"])], log
    assert scheduler.stats["urgent_beside"] == 1
