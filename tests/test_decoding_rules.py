"""Whisper's logit rules on the owned engine, against openai-whisper's ``ApplyTimestampRules``."""

from __future__ import annotations

import numpy as np
import pytest

from audiofast.asr.decoding import LogitRules
from audiofast.asr.tokenizer import WhisperTokenizer
from audiofast.eval.roundtrip import CachedASR, decoding_code_version
from audiofast.models import resolve_model


@pytest.fixture(scope="module")
def tokenizer() -> WhisperTokenizer:
    resolved = resolve_model("whisper-base")
    return WhisperTokenizer.from_dir(resolved.ct2_dir, multilingual=True)


@pytest.mark.parametrize("generated", ["start", "pair", "text"])
def test_no_timestamps_token_is_suppressed_with_timestamps_on(tokenizer, generated) -> None:
    """openai-whisper's ApplyTimestampRules starts by masking <|notimestamps|>: with timestamps
    on, the model must never switch them off mid-sequence, however likely it finds that."""
    ts = tokenizer.timestamp_begin
    word = tokenizer.encode(" hello")[0]
    generated = {"start": [], "pair": [ts, word, ts + 10], "text": [ts, word]}[generated]
    logits = np.zeros(tokenizer.timestamp_begin + 1501, np.float32)
    logits[tokenizer.no_timestamps] = 50.0  # by far the most likely token
    on = LogitRules(tokenizer, [], [], timestamps=True).apply(logits, list(generated))
    assert on[tokenizer.no_timestamps] == -np.inf
    assert int(on.argmax()) != tokenizer.no_timestamps
    off = LogitRules(tokenizer, [], [], timestamps=False).apply(logits, list(generated))
    assert int(off.argmax()) == tokenizer.no_timestamps  # without timestamps it stays allowed


def test_text_that_cannot_fit_its_window_is_dropped(tokenizer) -> None:
    """A window holding 0.23 s of audio cannot say a 13-word sentence: its segments are dropped
    (the window consumed as silence); the same tokens over 5 s of audio are kept."""
    from audiofast.asr.longform import WindowResult, accept_window
    from audiofast.asr.options import TranscribeOptions

    ts = tokenizer.timestamp_begin
    text = tokenizer.encode(" It was the epoch of belief, it was the epoch of truth.")
    tokens = [ts, *text, ts + 250]
    for frames, kept in ((23, 0), (500, 1)):
        result = WindowResult(list(tokens), avg_logprob=-0.87, no_speech_prob=0.1)
        segments, history = [], []
        consumed = accept_window(result, tokenizer, 1280, frames, 60.0, TranscribeOptions(),
                                 history, segments)
        assert len(segments) == kept and consumed == frames
        assert history == (tokens if kept else [])


def test_transcript_cache_is_keyed_by_the_decoding_code(monkeypatch) -> None:
    import ctranslate2

    version = decoding_code_version()
    assert f"ct2-{ctranslate2.__version__}" in version and ":src-" in version
    assert version.rsplit(":", 1)[1] in ("avx512_vnni", "avx512f", "avx2", "sse", "unknown")
    first = CachedASR("whisper-tiny.en").cache
    monkeypatch.setattr("audiofast.eval.roundtrip.decoding_code_version",
                        lambda: version.replace(":src-", ":src-changed"))
    assert CachedASR("whisper-tiny.en").cache != first  # other code: other cache
