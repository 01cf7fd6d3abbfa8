"""A live session replayed from a recording, without a network or a clock.

The recording is fed in short frames and every decode the session asks for is run at once,
so the result is the live policy's (VAD utterances, agreement commits, buffer cuts, the
closing decode done ahead) with no queueing: what one session on an infinitely fast server
would stream. Tests use it to check the policy; ``evals/stream_quality.py`` to compare
settings on WER and decode work.

``latency``: a loaded server answers later, so each hypothesis is applied only after a random
delay (stream seconds, uniform in the range, seeded) while audio goes on arriving - the
session then asks for its next decode on a longer buffer, as it does live. Whisper's text
depends on where buffers end, so a policy that streams well only without delays streams
well by luck: compare settings over several seeds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from audiofast.stream.decoder import Hypothesis, StreamDecoder
from audiofast.stream.protocol import join_finals
from audiofast.stream.session import StreamOptions, StreamSession
from audiofast.stream.vad import SAMPLE_RATE


@dataclass
class Replay:
    finals: list[dict] = field(default_factory=list)  # the session's ``final`` events
    hypotheses: list[list[int]] = field(default_factory=list)  # every decoded hypothesis
    decodes: int = 0  # requests the session made
    ready: int = 0  # ... that its closing decode done ahead answered

    @property
    def text(self) -> str:
        return join_finals(e["text"] for e in self.finals)


def replay(decoder: StreamDecoder, audio: np.ndarray, options: StreamOptions | None = None,
           frame_s: float = 0.1, latency: tuple[float, float] | None = None,
           seed: int = 0) -> Replay:
    """Feed ``audio`` (16 kHz mono) in ``frame_s`` frames, decoding what is due after each;
    with ``latency`` (min, max seconds) each decoded hypothesis lands that much later."""
    session = StreamSession(decoder.tokenizer, options or StreamOptions())
    out = Replay()
    rng = random.Random(seed)
    landing: tuple[float, Hypothesis] | None = None  # (stream time it is applied, hypothesis)

    def decode_due(now: float) -> None:
        nonlocal landing
        while True:
            if landing is not None:
                if landing[0] > now:
                    return
                out.finals.extend(e for e in session.apply(landing[1]) if e["type"] == "final")
                landing = None
            if (request := session.next_request()) is None:
                return
            out.decodes += 1
            out.ready += request.ready is not None
            hyp = decoder.decode([request])[0]
            if request.ready is None:
                out.hypotheses.append(hyp.tokens)
            delay = rng.uniform(*latency) if latency and request.ready is None else 0.0
            landing = (now + delay, hyp)

    step = int(frame_s * SAMPLE_RATE)
    for start in range(0, len(audio), step):
        session.feed(audio[start:start + step])
        decode_due((start + step) / SAMPLE_RATE)
    session.end_of_audio()
    now = len(audio) / SAMPLE_RATE
    decode_due(now)
    while landing is not None:
        now += frame_s
        decode_due(now)
    if not session.finished:
        raise RuntimeError("the session did not finish after its last decode")
    return out
