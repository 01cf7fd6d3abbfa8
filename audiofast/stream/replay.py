"""A live session replayed from a recording, without a network or a clock.

The recording is fed in short frames and every decode the session asks for is run at once,
so the result is the live policy's (VAD utterances, agreement commits, buffer cuts, the
closing decode done ahead) with no queueing: what one session on an infinitely fast server
would stream. Tests use it to check the policy; ``evals/stream_quality.py`` to compare
settings on WER and decode work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from audiofast.stream.decoder import StreamDecoder
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
        return " ".join(e["text"] for e in self.finals)


def replay(decoder: StreamDecoder, audio: np.ndarray, options: StreamOptions | None = None,
           frame_s: float = 0.1) -> Replay:
    """Feed ``audio`` (16 kHz mono) in ``frame_s`` frames, decoding what is due after each."""
    session = StreamSession(decoder.tokenizer, options or StreamOptions())
    out = Replay()

    def decode_due() -> None:
        while (request := session.next_request()) is not None:
            out.decodes += 1
            out.ready += request.ready is not None
            hyp = decoder.decode([request])[0]
            if request.ready is None:
                out.hypotheses.append(hyp.tokens)
            out.finals.extend(e for e in session.apply(hyp) if e["type"] == "final")

    step = int(frame_s * SAMPLE_RATE)
    for start in range(0, len(audio), step):
        session.feed(audio[start:start + step])
        decode_due()
    session.end_of_audio()
    decode_due()
    if not session.finished:
        raise RuntimeError("the session did not finish after its last decode")
    return out
