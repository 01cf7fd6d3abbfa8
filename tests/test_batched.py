"""Batched long-form transcription: chunks cut at pauses, decoded together, in file time."""

from dataclasses import replace

import numpy as np
import pytest

from audiofast.asr.batched import chunk_bounds
from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.eval.wer import wer

BATCHED = TranscribeOptions(language="en", batch_size=8, chunk_length=15, window_pad=5)


def test_chunks_cover_the_audio_and_cut_in_pauses():
    loud = np.full((80, 4000), 1.0, np.float32)
    pauses = [900, 1150, 2300, 3400]  # 200 ms dips in the loudness
    for pause in pauses:
        loud[:, pause : pause + 20] = -1.0
    bounds = chunk_bounds(loud, max_frames=1500, search_frames=500)
    assert bounds[0][0] == 0 and bounds[-1][1] == 4000
    ends, starts = [end for _, end in bounds[:-1]], [start for start, _ in bounds[1:]]
    assert ends == starts
    assert all(0 < end - start <= 1500 for start, end in bounds)
    # each cut lands inside the last pause before the chunk would run too long
    cuts = [end for _, end in bounds[:-1]]
    assert [next(p for p in pauses if p <= cut < p + 20) for cut in cuts] == [1150, 2300, 3400]


def test_short_audio_is_one_chunk():
    assert chunk_bounds(np.zeros((80, 700), np.float32), max_frames=1500) == [(0, 700)]
    assert chunk_bounds(np.zeros((80, 0), np.float32), max_frames=1500) == [(0, 0)]


@pytest.fixture(params=["ct2", "fused"])
def runtime(request, base, live):
    """CTranslate2's batched generate, or the fused decoder's batched calls."""
    return base if request.param == "ct2" else live.runtime_for(TranscribeOptions())


def test_batched_transcript_matches_the_reference(runtime, clips):
    clip = clips["two_cities"]  # 44 s: three or four chunks of at most 15 s
    result = runtime.transcribe(clip.audio, BATCHED)
    assert result.stats["windows"] >= result.stats["chunks"] >= 3
    assert wer(clip.reference, result.text) <= 0.05, result.text
    starts = [s.start for s in result.segments]
    assert starts == sorted(starts)
    assert all(s.start < s.end <= result.duration + 1e-6 for s in result.segments)
    assert result.segments[-1].end > 40.0
    assert [s.id for s in result.segments] == list(range(len(result.segments)))
    text = result.text.lower()  # nothing lost or repeated where chunks meet
    assert text.count("going direct to heaven") == 1
    assert text.count("it was the age of wisdom") == 1


def test_chunks_with_different_histories_share_a_batch(runtime, clips):
    """72 s in chunks of up to 30 s: chunks need second windows whose previous-text prompts
    differ in length, which one CTranslate2 batch cannot hold as they are."""
    parts = [clips["two_cities"], clips["endgame_nagg_nell"]]
    audio = np.concatenate([load_audio(c.audio) for c in parts])
    result = runtime.transcribe(audio, replace(BATCHED, chunk_length=30, window_pad=2))
    assert result.stats["windows"] > result.stats["chunks"] >= 3
    assert wer(" ".join(c.reference for c in parts), result.text) <= 0.05, result.text


def test_a_window_failing_the_checks_is_redone_on_a_full_window(base, clips):
    """With an impossible log-prob threshold every shortened window 'fails': each is decoded
    again alone on a standard 30 s window, and the words survive the detour."""
    clip = clips["endgame_nagg_nell"]
    options = replace(BATCHED, log_prob_threshold=0.0, no_speech_threshold=None,
                      temperatures=(0.0,))
    result = base.transcribe(clip.audio, options)
    assert result.stats["full_window_retries"] == result.stats["windows"] >= 2
    assert wer(clip.reference, result.text) <= 0.1, result.text
    assert all(s.start < s.end <= result.duration + 1e-6 for s in result.segments)
    assert result.segments[-1].end > 25.0


def test_silence_gives_no_segments(base):
    rng = np.random.default_rng(0)
    hiss = (1e-4 * rng.standard_normal(40 * 16000)).astype(np.float32)
    result = base.transcribe(hiss, BATCHED)
    assert result.text == ""
    assert result.duration == pytest.approx(40.0)


def test_chunk_length_must_leave_room(base, clips):
    for bad in (0, 31):
        with pytest.raises(ValueError, match="chunk_length"):
            base.transcribe(clips["beckett"].audio,
                            TranscribeOptions(batch_size=4, chunk_length=bad))
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        base.transcribe(clips["beckett"].audio, TranscribeOptions(batch_size=-2))


def test_fused_batch_gives_each_window_what_it_gets_alone(live, clips):
    """Windows of several chunks decoded in one batch of fused calls (greedy, n-gram drafts
    on) get exactly the tokens and scores each gets decoded alone, in fewer calls."""
    from audiofast.asr.features import log_mel_spectrogram, pad_or_trim

    fused = live.runtime_for(TranscribeOptions())
    fused.drafter_name = "ngram"
    try:
        mels = [pad_or_trim(log_mel_spectrogram(load_audio(clips[name].audio), fused.n_mels)
                            [:, :1000], 1000)
                for name in ["two_cities", "endgame_nagg_nell", "beckett", "clone-test"]]
        encoded = fused.encode_batch(np.stack(mels))
        prompt = fused.tokenizer.prompt([], "en", "transcribe", timestamps=True)
        options = TranscribeOptions(language="en")
        alone = [fused.decode(encoded[i : i + 1], prompt, options, 0.0) for i in range(4)]
        calls = fused.stats["engine_calls"]
        batched_before = fused.stats["batched_calls"]
        together = fused.decode_batch(encoded, [prompt] * 4, options)
    finally:
        fused.drafter_name = "none"
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert [r.avg_logprob for r in together] == [r.avg_logprob for r in alone]
    assert [r.no_speech_prob for r in together] == [r.no_speech_prob for r in alone]
    assert all(len(r.tokens) > 10 for r in alone)
    batched_calls = fused.stats["batched_calls"] - batched_before
    assert batched_calls < fused.stats["engine_calls"] - calls
