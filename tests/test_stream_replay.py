"""The replay (stream/replay.py): a live session driven from a recording without a network,
optionally with each hypothesis landing late, as on a loaded server."""

from __future__ import annotations

from audiofast.audio import load_audio
from audiofast.eval.wer import wer
from audiofast.stream.decoder import StreamDecoder
from audiofast.stream.replay import replay


def test_replay_with_latency_applies_hypotheses_late_and_loses_no_words(live, clips):
    """A replay whose hypotheses land 0.6-1.2 s late (a loaded server, evals/stream_quality.py
    --latency): the session asks for fewer, longer decodes (one in flight at a time), every
    word is still committed once and the text stays within a word of offline's; the same seed
    replays the same text."""
    audio = load_audio(clips["clone-test"].audio)
    prompt = replay(StreamDecoder(live), audio)
    late = replay(StreamDecoder(live), audio, latency=(0.6, 1.2), seed=3)
    again = replay(StreamDecoder(live), audio, latency=(0.6, 1.2), seed=3)
    assert late.decodes < 0.8 * prompt.decodes, (late.decodes, prompt.decodes)
    assert again.text == late.text and again.decodes == late.decodes
    offline = live.transcribe(clips["clone-test"].audio).text
    assert abs(len(late.text.split()) - len(offline.split())) <= 1, (late.text, offline)
    reference = clips["clone-test"].reference
    assert wer(reference, late.text) <= wer(reference, offline) + 0.1, late.text
