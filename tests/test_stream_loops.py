"""Loops in live hypotheses: what counts as one, and how it is decoded again."""

from __future__ import annotations

import pytest

from audiofast.asr.longform import compression_ratio
from audiofast.audio import load_audio
from audiofast.stream.agreement import repeated_run
from audiofast.stream.decoder import MAX_REPEATS, DecodeRequest, Hypothesis, StreamDecoder


def test_a_looped_hypothesis_is_retried_without_the_prompt_first(live, clips):
    """A hypothesis that repeats itself (short buffers copy their prompt) is decoded again
    without the prompt on the same window; only if that loops too at 30 s."""
    decoder = StreamDecoder(live)
    tok = decoder.tokenizer
    audio = load_audio(clips["beckett"].audio)[:16000 * 2]
    request = DecodeRequest(audio, tok.encode(" It was the best of times."), "en", "transcribe")
    looped = Hypothesis([tok.timestamp_begin, *tok.encode(" Ever tried." * 8)], 0.01, -0.2,
                        False)
    hyp = decoder._unloop(request, looped)
    assert decoder.stats["prompt_retry"] == 1 and decoder.stats["full_window"] == 0
    assert not hyp.full_window and "tried" in tok.decode(hyp.tokens).lower()
    assert tok.decode(hyp.tokens).lower().count("tried") == 1
    # A request that asks for no 30 s retry (a line behind a lead-in) gets the prompt-free
    # retry, and if that loops too, the loop back, marked.
    request = DecodeRequest(audio, [], "en", "transcribe", full_window_retry=False)
    marked = decoder._unloop(request, looped)
    assert marked.looped and marked.tokens == looped.tokens and decoder.stats["full_window"] == 0
    with pytest.raises(ValueError, match="loop_retry"):
        StreamDecoder(live, loop_retry="beam")


def test_a_short_loop_zlib_cannot_see_is_a_loop(live, clips):
    """A short hypothesis that says one word over and over ("Humpty, humpty, humpty, humpty,
    humpty." for "Humpty Dumpty was pushed.") compresses too little to pass the compression
    test, but a phrase said MAX_REPEATS times back to back is a loop: it is decoded again."""
    assert repeated_run("Humpty, humpty, humpty, humpty, humpty.") == 5
    assert repeated_run("I think I think I think I think so.") == 4
    assert repeated_run("No, no, no. It was the best of times, it was the worst of times.") == 3
    assert repeated_run("") == 1
    decoder = StreamDecoder(live)
    tok = decoder.tokenizer
    text = " Ever, ever, ever, ever, ever."
    assert compression_ratio(text) < 2.4 and repeated_run(text) >= MAX_REPEATS
    audio = load_audio(clips["beckett"].audio)[:16000 * 2]
    request = DecodeRequest(audio, [], "en", "transcribe", full_window_retry=False)
    looped = Hypothesis([tok.timestamp_begin, *tok.encode(text)], 0.01, -0.2, False)
    marked = decoder._unloop(request, looped)
    assert marked.looped, tok.decode(marked.tokens)
    fine = Hypothesis([tok.timestamp_begin, *tok.encode(" Ever tried.")], 0.01, -0.2, False)
    assert decoder._unloop(request, fine) is fine
