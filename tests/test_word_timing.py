"""Word timestamps: words timed by cross-attention, on both decoders, in every output."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from audiofast.asr.options import TranscribeOptions
from audiofast.asr.types import Segment, Transcription, Word
from audiofast.asr.word_timing import force_align, keep_within_segment, trim_pauses
from audiofast.asr.writers import to_json, to_srt, to_vtt
from audiofast.audio import SAMPLE_RATE, load_audio
from audiofast.eval.tts import synthesize
from audiofast.eval.wer import word_pairs

WORDS = TranscribeOptions(language="en", word_timestamps=True)


def norm(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum())


@pytest.mark.parametrize("engine", ["ct2", "fast"])
def test_words_agree_with_a_forced_alignment_of_the_reference(engine, base, live, clips):
    """On the real recordings that fit one window (a reference is aligned on one), >= 90% of
    the words a transcription times start and end within 0.2 s of the same words in a
    forced alignment of the reference text."""
    runtime = base if engine == "ct2" else live.runtime_for(WORDS)
    assert hasattr(runtime, "engine") == (engine == "fast")
    matched = close = 0
    for name in ("beckett", "clone-test", "endgame_nagg_nell"):
        result = runtime.transcribe(clips[name].audio, WORDS)
        words = [w for s in result.segments for w in s.words]
        for segment in result.segments:  # the words spell the segment, inside its bounds
            assert "".join(w.word for w in segment.words).strip() == segment.text.strip()
            assert all(segment.start <= w.start <= w.end <= segment.end for w in segment.words)
            assert all(0 <= w.probability <= 1 for w in segment.words)
        starts = [w.start for w in words]
        assert starts == sorted(starts) and words[-1].end <= result.duration
        reference = force_align(base, load_audio(clips[name].audio), clips[name].reference)
        pairs = [(words[i], reference[j]) for i, j in word_pairs([w.word for w in words],
                                                                 [w.word for w in reference])]
        assert len(pairs) >= 0.9 * len(reference), (words, reference)
        matched += len(pairs)
        close += sum(abs(a.start - b.start) <= 0.2 and abs(a.end - b.end) <= 0.2
                     for a, b in pairs)
    assert close >= 0.9 * matched, (close, matched)


def speech_end(audio: np.ndarray, floor: float = 0.015) -> float:
    """The end of the last 100 ms frame louder than ``floor`` RMS."""
    frames = audio[: len(audio) // 1600 * 1600].reshape(-1, 1600)
    loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > floor)
    return (loud[-1] + 1) / 10


@pytest.mark.parametrize("engine", ["ct2", "fast"])
def test_a_slow_last_word_ends_with_the_speech(engine, base, live, clips):
    """beckett ends "Fail better." at ~8.8 s and 1.2 s of room tone follow: DTW hands the
    full stop everything up to end-of-text; "better." ends where "better" does (it ended at
    9.4-9.9 s while the stop's time was the word's), within 0.3 s of the audio's energy."""
    runtime = base if engine == "ct2" else live.runtime_for(WORDS)
    audio = load_audio(clips["beckett"].audio)
    result = runtime.transcribe(audio, WORDS)
    last = result.segments[-1].words[-1]
    assert norm(last.word) == "better"
    assert abs(last.end - speech_end(audio)) <= 0.3, (last, speech_end(audio))
    assert result.segments[-1].end == last.end


def test_keep_within_segment_cuts_only_words_past_the_timestamps():
    words = [Word(3.0, 5.0, " So", 0.9), Word(5.0, 5.3, " it", 0.9),
             Word(5.3, 9.0, " goes.", 0.9)]
    assert keep_within_segment(words, 4.0, 7.0, 0.4) == [
        Word(4.0, 5.0, " So", 0.9), words[1], Word(5.3, 7.0, " goes.", 0.9)]
    assert keep_within_segment(words, 3.3, 8.6, 0.4) == words  # within 0.5 s: kept
    # a cut word keeps at least the median word length
    assert keep_within_segment(words[2:], 4.0, 5.4, 0.4) == [Word(5.3, 5.7, " goes.", 0.9)]


def test_words_around_an_inserted_silence_stay_on_their_side(live):
    """Two spoken phrases with 2 s of silence between them: the words before the gap end
    before it, the words after start after it (within 0.3 s): timing that follows the audio,
    not the text's length."""
    first = load_audio(synthesize("The river was cold and very wide.", "piper"))
    second = load_audio(synthesize("Nobody wanted to swim across it.", "piper"))
    gap = np.zeros(2 * SAMPLE_RATE, np.float32)
    gap_start = len(first) / SAMPLE_RATE
    gap_end = gap_start + 2.0
    audio = np.concatenate([first, gap, second])
    result = live.transcribe(audio, WORDS)
    words = [w for s in result.segments for w in s.words]
    texts = [norm(w.word) for w in words]
    assert "wide" in texts and "nobody" in texts, texts
    before, after = words[: texts.index("wide") + 1], words[texts.index("nobody"):]
    assert max(w.end for w in before) <= gap_start + 0.3, before
    assert min(w.start for w in after) >= gap_end - 0.3, after


def test_word_outputs_json_srt_vtt():
    words = [Word(0.5, 0.9, " Ever", 0.91), Word(0.9, 1.4, " tried.", 0.8)]
    segment = Segment(0, 0, 0.5, 1.4, " Ever tried.", [1, 2], -0.2, 1.1, 0.01, 0.0, words)
    plain = replace(segment, words=None)
    result = Transcription([segment], "en", 1.0, 2.0)
    data = json.loads(to_json(result))
    assert data["segments"][0]["words"][1] == {"start": 0.9, "end": 1.4, "word": " tried.",
                                               "probability": 0.8}
    srt = to_srt(result)
    assert "1\n00:00:00,500 --> 00:00:00,900\nEver\n" in srt
    assert "2\n00:00:00,900 --> 00:00:01,400\ntried.\n" in srt
    assert "00:00.900 --> 00:01.400\ntried.\n" in to_vtt(result)
    assert to_srt(Transcription([plain], "en", 1.0, 2.0)).count("-->") == 1  # per segment


def test_cli_word_timestamps_json(clips, capsys):
    from audiofast import cli

    assert cli.main(["transcribe", str(clips["clone-test"].audio), "--language", "en",
                     "--word-timestamps", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    words = [w for s in data["segments"] for w in s["words"]]
    assert len(words) == len(data["text"].split())
    assert all(w["end"] >= w["start"] for w in words)


def test_word_timestamps_refuse_batched_chunks(base, clips):
    with pytest.raises(ValueError, match="sequential loop"):
        base.transcribe(clips["clone-test"].audio, replace(WORDS, batch_size=4))


def _segment(start: float, end: float, words: list[tuple[float, float, str, float]]) -> Segment:
    timed = [Word(*w) for w in words]
    text = "".join(w.word for w in timed)
    return Segment(0, 0, start, end, text, [], -0.5, 1.2, 0.1, 0.0, timed)


def test_pause_trimming_takes_the_speaking_rate_from_words_heard_before():
    """A final of one sentence-ending word stretched over the pause after it: its own
    median is itself, so alone it keeps the pause; with the speaker's earlier words (0.25 s
    each) it ends twice their median after its start, as offline trimming would."""
    stretched = [Word(7.25, 8.27, " resource.", 0.9)]
    assert trim_pauses(stretched) == stretched
    assert trim_pauses(stretched, [0.25] * 20) == [Word(7.25, 7.75, " resource.", 0.9)]
    opening = [Word(14.0, 15.0, " That's", 0.9), Word(15.0, 15.2, " good.", 0.9)]
    assert trim_pauses(opening, [0.25] * 20)[0] == Word(14.5, 15.0, " That's", 0.9)
    # ... unless the words go on a sentence an earlier final began
    assert trim_pauses(opening, [0.25] * 20, opens_sentence=False)[0] == opening[0]
    inside = [Word(2.8, 3.0, " He", 0.9), Word(3.0, 4.0, " paused", 0.9),
              Word(4.0, 4.2, " here.", 0.9)]  # a long word inside a sentence is kept
    assert trim_pauses(inside, [0.25] * 20) == inside


def test_hallucination_rule_needs_odd_words_and_a_long_silence():
    from audiofast.asr.hallucination import Skip, find_hallucination, is_anomalous

    speech = _segment(0.0, 2.0, [(0.0, 0.5, " Ever", 0.9), (0.5, 1.0, " tried.", 0.8)])
    odd = _segment(9.0, 12.0, [(9.0, 9.02, " Thank", 0.05), (9.02, 12.0, " you.", 0.1)])
    assert not is_anomalous(speech) and is_anomalous(odd)
    # 7 s of silence before, 18 s after: dropped, decoding resumes at its start
    assert find_hallucination([speech, odd], 0.0, 30.0, 2.0, 0.0, 60.0) == Skip(1, 9.0)
    assert find_hallucination([speech, odd], 0.0, 30.0, 20.0, 0.0, 60.0) is None
    # near the end of the audio: nothing left worth decoding after it
    assert find_hallucination([speech, odd], 0.0, 13.0, 2.0, 0.0, 13.0) == Skip(1, 13.0)
    late_speech = _segment(2.5, 4.0, [(2.5, 3.0, " No", 0.9), (3.0, 4.0, " matter.", 0.9)])
    close_odd = _segment(4.1, 5.0, [(4.1, 4.11, " uh", 0.05)])
    after = _segment(6.0, 7.0, [(6.0, 6.5, " Fail", 0.9), (6.5, 7.0, " again.", 0.9)])
    assert find_hallucination([speech, late_speech, close_odd, after], 0.0, 30.0, 2.0, 0.0,
                              60.0) is None  # speech on both sides, close by
    # a window opening on odd words after a long silence: decoded again from their start
    assert find_hallucination([odd, speech], 3.0, 33.0, 2.0, 0.0, 60.0) == Skip(0, 9.0)


def test_hallucination_threshold_keeps_the_speech_on_a_file_with_gaps(live):
    """The gappy file (real clips between silence, noise and music): with the threshold, no
    word a listener heard is lost, and no more words are invented than without it."""
    import jiwer

    from audiofast.eval.gappy import gappy_file
    from audiofast.eval.wer import normalize

    audio, reference = gappy_file()
    counts = {}
    for threshold in (None, 2.0):
        options = replace(TranscribeOptions(language="en", window_pad=None),
                          hallucination_silence_threshold=threshold)
        result = live.transcribe(audio, options)
        assert all(s.words is not None for s in result.segments) or threshold is None
        counts[threshold] = jiwer.process_words(normalize(reference), normalize(result.text))
    assert counts[2.0].insertions <= counts[None].insertions
    assert counts[2.0].wer <= counts[None].wer + 0.005, (counts[2.0].wer, counts[None].wer)
