"""Live decoding without the network: a session's policy driven by the stream decoder
(CTranslate2 and the fused decoder), the previous hypothesis as a draft, forced prefixes,
and word-timed commits."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from audiofast.asr.options import TranscribeOptions
from audiofast.audio import load_audio
from audiofast.eval.wer import normalize, wer, word_pairs
from audiofast.stream.agreement import skip_committed
from audiofast.stream.decoder import DecodeRequest, Hypothesis, StreamDecoder
from audiofast.stream.replay import replay
from audiofast.stream.session import StreamOptions, StreamSession
from audiofast.stream.vad import SpeechDetector


def run_session(decoder: StreamDecoder, audio: np.ndarray, **options
                ) -> tuple[list[dict], list[list[int]]]:
    """A session's final events and every hypothesis it decoded, replayed on ``audio``."""
    result = replay(decoder, audio, StreamOptions(**options))
    return result.finals, result.hypotheses


@pytest.mark.parametrize("engine", ["ct2", "fast", "int8-head4-kv8"])
def test_session_finals_match_offline_transcript(engine, base, live, clips):
    """Policy alone (no network), on CTranslate2, on the fused decoder and on it with the
    gated int4 head and int8 K/V (``serve --precision``): finals equal the offline transcript
    within 2 WER points, each word committed once, in time order.

    Only clone-test: beckett's 1-2 s lines are issue #19's open short-utterance gap
    (streamed 0-17 % WER vs 0 % offline depending on the pad and on last-bit numerics,
    measured 2026-12-02), and the longer clips differ from offline by a word or two either
    way; scripts/bench_stream.py reports every clip."""
    if engine == "int8-head4-kv8":
        from audiofast.asr.fast_runtime import FastWhisper

        decoder = StreamDecoder(FastWhisper(threads=2, precision=engine, ct2=base))
        assert decoder.fast.engine.backend.kv_bits == 8
    else:
        decoder = StreamDecoder(base if engine == "ct2" else live)
    assert decoder.engine == ("fast" if engine == "int8-head4-kv8" else engine)
    for name in ("clone-test",):
        finals, _ = run_session(decoder, load_audio(clips[name].audio))
        text = " ".join(e["text"] for e in finals)
        offline = base.transcribe(clips[name].audio).text
        reference = clips[name].reference
        assert wer(reference, text) - wer(reference, offline) <= 0.02, (text, offline)
        assert len(text.split()) == len(offline.split())  # nothing committed twice
        starts = [e["start"] for e in finals]
        assert starts == sorted(starts)
        for e in finals:  # timed words spell the final, inside its span, in order
            assert "".join(w["w"] for w in e["words"]) == "".join(e["text"].split())
            assert all(e["start"] <= w["start"] <= w["end"] <= e["end"] for w in e["words"])
            assert [w["start"] for w in e["words"]] == sorted(w["start"] for w in e["words"])
            assert all(0 <= w["p"] <= 1 for w in e["words"])


def test_stream_word_times_follow_the_offline_words(live, clips):
    """The words of a stream's finals (aligned on each live buffer) start within 0.3 s of
    the same words timed offline on 30 s windows, for >= 85% of them."""
    audio = load_audio(clips["beckett"].audio)
    finals, _ = run_session(StreamDecoder(live), audio)
    streamed = [w for e in finals for w in e["words"]]
    offline = [w for s in live.transcribe(
        audio, TranscribeOptions(language="en", word_timestamps=True)).segments for w in s.words]
    pairs = [(streamed[i], offline[j])
             for i, j in word_pairs([w["w"] for w in streamed], [w.word for w in offline])]
    assert len(pairs) >= 0.9 * len(offline)
    close = sum(abs(s["start"] - o.start) <= 0.3 for s, o in pairs)
    assert close >= 0.85 * len(pairs), [(s["w"], s["start"], o.start) for s, o in pairs]


@pytest.mark.parametrize(("name", "starts_min", "ends_min"),
                         [("endgame_nagg_nell", 0.85, 0.95), ("beckett", 0.8, 0.8)])
def test_stream_word_bounds_follow_a_forced_alignment_of_the_reference(live, clips, name,
                                                                       starts_min, ends_min):
    """Streamed final words (each line timed on its live buffer) start and end within 0.2 s
    of the reference text force-aligned on the whole clip. A word ends where its speech does,
    not where the pause its "," or "." spans does (offline's and faster-whisper's way), and
    what is longer than the speaker's rate allows is trimmed: measured starts / ends endgame
    96 / 99 %, beckett 92 / 100 %. Before, a one-word final was its own yardstick (endgame
    ends 93 %) and a line's last word stopped at its buffer's end, 0.2 s after VAD's (beckett
    ends 45 %: its slow reading's pauses stay inside its words)."""
    from audiofast.asr.word_timing import force_align

    clip = clips[name]
    audio = load_audio(clip.audio)
    finals, _ = run_session(StreamDecoder(live), audio)
    streamed = [w for e in finals for w in e["words"]]
    aligned = force_align(live.ct2, audio, clip.reference)
    pairs = [(streamed[i], aligned[j])
             for i, j in word_pairs([w["w"] for w in streamed], [w.word for w in aligned])]
    assert len(pairs) >= 0.9 * len(aligned)
    starts = sum(abs(s["start"] - a.start) <= 0.2 for s, a in pairs)
    ends = sum(abs(s["end"] - a.end) <= 0.2 for s, a in pairs)
    assert starts >= starts_min * len(pairs) and ends >= ends_min * len(pairs), \
        (starts, ends, len(pairs))
    with pytest.raises(ValueError, match="at most 30 s"):
        force_align(live.ct2, np.zeros(31 * 16000, np.float32), "too long")


def test_closing_utterance_keeps_words_the_last_hypothesis_reheard(live, clips):
    """Endgame repeats a line ("Laugh less heartily so we have still that resource") in the
    next utterance; with the first one in the prompt, Whisper's last decode of the second
    drops the words already committed from it. The committed text's end time (word timing)
    still places the rest, where counting committed words skipped 4 of them."""
    audio = load_audio(clips["endgame_nagg_nell"].audio)
    timed, _ = run_session(StreamDecoder(live), audio)
    counted, _ = run_session(StreamDecoder(live, word_timing=False), audio)
    text = lambda finals: " ".join(e["text"] for e in finals)  # noqa: E731
    reference = clips["endgame_nagg_nell"].reference
    assert normalize(text(timed)).count("have still that resource") == 2, text(timed)
    assert wer(reference, text(timed)) < wer(reference, text(counted))


def test_previous_hypothesis_draft_is_lossless_and_saves_calls(live, clips):
    """Every update of a live session decodes exactly the tokens plain greedy decodes, with
    the last hypothesis verified as the draft; the drafts are accepted, so each decoder call
    yields well over one token."""
    audio = load_audio(clips["clone-test"].audio)
    plain, drafted = StreamDecoder(live, draft=False), StreamDecoder(live)
    _, plain_hyps = run_session(plain, audio)
    _, drafted_hyps = run_session(drafted, audio)
    assert drafted_hyps == plain_hyps
    assert plain.stats["drafted"] == 0 and plain.stats["decoder_calls"] == plain.stats["tokens"]
    stats = drafted.stats
    assert stats["tokens"] == plain.stats["tokens"] and stats["accepted"] > 0
    assert stats["tokens"] / stats["decoder_calls"] > 1.5, stats


def test_sessions_decoded_in_one_batch_hear_what_they_hear_alone(live, clips):
    """Due sessions of different buffer lengths (other encoder windows) are decoded in one
    batch of fused calls: each gets the hypothesis it gets decoded alone, and the batch makes
    fewer decoder calls than the sessions one after the other."""
    requests = [DecodeRequest(load_audio(clips[name].audio)[: 16000 * seconds], [], "en",
                              "transcribe")
                for name, seconds in [("beckett", 1), ("clone-test", 5), ("two_cities", 14)]]
    decoder = StreamDecoder(live, draft=False)
    alone = [decoder.decode([request])[0] for request in requests]
    calls_alone = decoder.stats["batched_calls"]
    assert len({decoder.window_frames(r) for r in requests}) == 3
    together = decoder.decode(requests)
    assert [h.tokens for h in together] == [h.tokens for h in alone]
    assert [h.text_times for h in together] == [h.text_times for h in alone]
    assert decoder.stats["batched_calls"] - calls_alone < calls_alone


def test_forced_prefix_is_read_in_one_call_with_the_same_result(live, clips):
    """greedy_decode's ``forced`` tokens (a stream's committed segments) are read with the
    prompt in one call and seen by the timestamp rules as output: forcing the first segment
    of plain greedy's output gives back plain greedy's output."""
    decoder = StreamDecoder(live, draft=False)
    tok = decoder.tokenizer
    audio = load_audio(clips["beckett"].audio)[: 16000 * 8]
    plain = decoder.decode([DecodeRequest(audio, [], "en", "transcribe")])[0].tokens
    ends = [i for i in range(1, len(plain)) if plain[i] >= tok.timestamp_begin
            and plain[i - 1] < tok.timestamp_begin]
    assert ends, plain
    prefix = plain[: ends[0] + 1]  # the first whole segment, closing timestamp included
    calls = decoder.stats["decoder_calls"]
    forced = decoder.decode([DecodeRequest(audio, [], "en", "transcribe", prefix)])[0].tokens
    assert forced == plain
    assert decoder.stats["decoder_calls"] - calls == len(plain) - len(prefix) + 1


def test_hypothesis_drafter_follows_and_realigns():
    from audiofast.asr.drafters.hypothesis import HypothesisDrafter

    prompt = [1, 2, 3]
    drafter = HypothesisDrafter(len(prompt), [10, 11, 12, 13, 14, 15], max_draft=3)
    assert drafter.propose(prompt + [10]) == [11, 12, 13]  # on track: what it said next
    drafter.feedback(3, 1)  # one of three accepted: draft little more than that
    assert drafter.propose(prompt + [10, 11]) == [12, 13]
    assert drafter.propose(prompt + [10, 99, 13, 14]) == [15]  # departed, then back on track
    assert drafter.propose(prompt + [10, 99, 98]) == []  # departed: nothing to follow


def test_forced_prefix_comes_back_once_from_ctranslate2(base, clips):
    """CT2 returns the forced prefix itself, then the new tokens: the hypothesis holds the
    committed words exactly once, even where the audio goes on to repeat them."""
    tok = base.tokenizer
    ts = tok.timestamp_begin
    audio = load_audio(clips["beckett"].audio)[: 16000 * 6]  # "Ever tried. Ever failed. No..."
    prefix = [ts, *tok.encode(" Ever tried."), ts + 75]
    hyp = StreamDecoder(base).decode([DecodeRequest(audio, [], "en", "transcribe", prefix)])[0]
    assert hyp.tokens[: len(prefix)] == prefix
    text = tok.decode([t for t in hyp.tokens if t < tok.eot]).lower()
    assert text.count("tried") == 1 and "matter" in text, text


class _PromptlessModel:
    """A CTranslate2 stand-in that returns only new tokens (a changed CT2 contract), and they
    begin with the words forced as the prefix (the speaker said them again)."""

    def __init__(self, new: list[int]):
        self.new = new

    def encode(self, features):
        return features

    def generate(self, features, prompts, **kwargs):
        return [SimpleNamespace(sequences_ids=[list(self.new)], scores=[-0.2],
                                no_speech_prob=0.01) for _ in prompts]


def test_output_without_the_forced_prefix_is_an_error_not_patched(base):
    """Prepending the prefix only "when missing" guessed at CT2's contract; a hypothesis
    that does not start with the prefix is now a decode failure (the server fails only that
    session), not silently patched."""
    tok = base.tokenizer
    ts = tok.timestamp_begin
    prefix = [ts, *tok.encode(" No, no."), ts + 50]
    runtime = SimpleNamespace(tokenizer=tok, default_suppress_ids=base.default_suppress_ids,
                              n_mels=base.n_mels, model=_PromptlessModel(tok.encode(" Never.")),
                              encode_batch=lambda mels: mels,
                              resolved=SimpleNamespace(spec="stand-in"))
    request = DecodeRequest(np.zeros(32000, np.float32), [], "en", "transcribe", prefix)
    with pytest.raises(RuntimeError, match="forced prefix"):
        StreamDecoder(runtime).decode([request])  # type: ignore[arg-type]


def test_an_utterance_without_text_yet_is_re_decoded_sooner(base):
    """The first decode comes ``first_chunk_s`` after the onset, and so does each next one
    while the hypotheses hold no text; once text appears, every ``min_chunk_s``."""

    tok = base.tokenizer
    chunks = iter(range(10**6))
    detector = SpeechDetector(model=lambda chunk: float(next(chunks) >= 10))  # speech from
    onset = 10 * 512  # the 11th 32 ms chunk on
    session = StreamSession(tok, StreamOptions(first_chunk_s=0.25, min_chunk_s=0.5), detector)
    ends, texts = [], [[], [], [tok.timestamp_begin, *tok.encode(" Hello")], []]
    for _ in range(40):  # 4 s in 0.1 s frames
        session.feed(np.zeros(1600, np.float32))
        if session.next_request() is not None:
            ends.append(session.received)
            tokens = texts[min(len(ends), len(texts)) - 1]
            session.apply(Hypothesis(tokens, 0.01, -0.1, False))
    steps = np.diff([onset, *ends[:4]]) / 16000
    assert list(steps.round(1)) == [0.3, 0.3, 0.3, 0.5], ends  # 0.25/0.5 s, 0.1 s frames


def test_requests_users_wait_on_are_marked_urgent(base):
    """An utterance's decodes are urgent until its hypotheses hold text, then not; its
    closing decode (done ahead when the silence begins, and the close) is urgent again.
    Only the decodes looking for the first words are probes, on a shorter window."""

    tok = base.tokenizer
    chunks = iter(range(10**6))
    # Speech from the 11th to the 80th 32 ms chunk (0.32-2.56 s), then silence.
    detector = SpeechDetector(model=lambda chunk: float(10 <= next(chunks) < 80))
    session = StreamSession(tok, StreamOptions(first_chunk_s=0.25, min_chunk_s=0.5), detector)
    flags, text = [], [tok.timestamp_begin, *tok.encode(" Hello there"), tok.timestamp_begin + 50]
    probes, windows, decoder = [], [], StreamDecoder(base, pad_s=10.0, probe_pad_s=4.0)
    for _ in range(60):  # 6 s in 0.1 s frames
        session.feed(np.zeros(1600, np.float32))
        request = session.next_request()
        if request is not None:
            flags.append(request.urgent)
            probes.append(request.probe)
            windows.append(decoder.window_frames(request) / 100 - len(request.audio) / 16000)
            tokens = text if len(flags) > 2 else []
            session.apply(request.ready or Hypothesis(tokens, 0.01, -0.1, False))
    # Three decodes before the text (the third brings it), updates, then the close decoded
    # ahead and the close itself (answered by it).
    assert len(flags) > 5 and flags[:3] == [True] * 3 and flags[-2:] == [True, True], flags
    assert not any(flags[3:-2]), flags
    assert probes == [True] * 3 + [False] * (len(probes) - 3), probes
    pads = np.array(windows)  # seconds of silence each window adds, up to a 2 s bucket
    assert (pads[:3] >= 4).all() and (pads[:3] < 6).all() and (pads[3:] >= 10).all(), pads


def test_a_blip_heard_as_thank_you_is_dropped_real_words_are_kept(base):
    """An utterance VAD found in a breath, decoded as "Thank you." that the model doubts
    (no-speech probability over the threshold) with words unlike speech (unsure, squeezed
    into milliseconds) makes no final; the same text with confident timing, or without the
    no-speech doubt, does."""

    tok = base.tokenizer
    text = tok.encode(" Thank you.")
    tokens = [tok.timestamp_begin, *text, tok.timestamp_begin + 25]

    def finals(no_speech: float, probs: list[float], times: list[float]) -> list[str]:
        chunks = iter(range(10**6))
        # Speech from the 11th to the 25th 32 ms chunk (0.32-0.8 s), then silence.
        detector = SpeechDetector(model=lambda chunk: float(10 <= next(chunks) < 25))
        session = StreamSession(tok, StreamOptions(), detector)
        out = []
        for _ in range(30):  # 3 s in 0.1 s frames
            session.feed(np.zeros(1600, np.float32))
            while (request := session.next_request()) is not None:
                hyp = request.ready or Hypothesis(tokens, no_speech, -0.8, False, times, probs)
                out += [e["text"] for e in session.apply(hyp) if e["type"] == "final"]
        return out

    n = len(text)
    squeezed = [0.1] * n + [0.15]  # every token starts at 0.1 s, the last ends at 0.15
    spread = [0.1 + 0.2 * i for i in range(n + 1)]
    assert finals(0.77, [0.01] + [0.8] * (n - 1), squeezed) == []
    assert finals(0.01, [0.01] + [0.8] * (n - 1), squeezed) == ["Thank you."]
    assert finals(0.77, [0.9] * n, spread) == ["Thank you."]


def test_a_close_heard_as_silence_keeps_the_words_committed_before(base):
    """An utterance whose updates committed words, closed by a hypothesis the model takes
    for silence (no text kept): the session ends the utterance with the words it had, and
    no error (the word search over an empty hypothesis once raised)."""

    tok = base.tokenizer
    chunks = iter(range(10**6))
    # Speech from the 11th to the 120th 32 ms chunk (0.32-3.84 s), then silence.
    detector = SpeechDetector(model=lambda chunk: float(10 <= next(chunks) < 120))
    session = StreamSession(tok, StreamOptions(early_close=False), detector)
    text = [tok.timestamp_begin, *tok.encode(" Fail again. Fail better."),
            tok.timestamp_begin + 50]
    finals, closes = [], 0
    for _ in range(60):  # 6 s in 0.1 s frames
        session.feed(np.zeros(1600, np.float32))
        while session.next_request() is not None:
            closing = session.utterances[0].end is not None
            closes += closing
            hyp = Hypothesis([], 0.9, -1.5, False) if closing else \
                Hypothesis(text, 0.01, -0.1, False)
            finals += [e["text"] for e in session.apply(hyp) if e["type"] == "final"]
    assert closes == 1 and not session.utterances
    assert " ".join(finals).startswith("Fail again."), finals


def test_live_windows_are_encoded_on_the_servers_encoder(base, kernel, clips):
    """``serve --encoder`` reaches the live windows: on the fused encoder a window's encoder
    output is the fused encoder's (the same model, another int8 rounding), not CTranslate2's
    (live windows once went to CTranslate2 whatever the flag said)."""
    from audiofast.asr.ct2_runtime import CT2Whisper

    fused = CT2Whisper("whisper-base", threads=2, encoder="fused")
    request = DecodeRequest(load_audio(clips["beckett"].audio)[: 16000 * 3], [], "en")
    ours, theirs = StreamDecoder(fused).encode(request), StreamDecoder(base).encode(request)
    frames = StreamDecoder(base).window_frames(request)
    assert ours.shape == theirs.shape == (1, frames // 2, 512)
    error = np.abs(ours - theirs).mean() / np.abs(theirs).mean()
    assert 0 < error < 0.2, error


def test_the_pad_is_for_short_buffers(base):
    """A buffer gets 10 s of pad up to the 14 s window a 4 s buffer gets; longer buffers get
    that window, then their length + 2 s; probes keep their 4 s pad; 30 s of pad stays Whisper's
    full window. Windows come in 2 s buckets."""
    def window(seconds: float, probe: bool = False, pad: float = 10.0) -> float:
        request = DecodeRequest(np.zeros(int(seconds * 16000), np.float32), [], "en",
                                probe=probe)
        return StreamDecoder(base, pad_s=pad).window_frames(request) / 100

    assert [window(s) for s in (1.0, 3.5, 4.0, 8.0, 12.0, 13.0, 20.0)] \
        == [12, 14, 14, 14, 14, 16, 22]
    assert window(8.0, probe=True) == 12
    assert window(8.0, pad=30.0) == 30


def test_a_hypothesis_after_a_commit_of_timestamps_only_keeps_its_first_word(base):
    """Two hypotheses that agree only on their opening timestamp commit no text; a later one
    that opens on another timestamp still has every word new (the committed-words search once
    took its first word for the committed text and dropped it)."""
    tok = base.tokenizer
    hyp = [tok.timestamp_begin + 2, *tok.encode(" Everyone is here")]
    assert skip_committed([tok.timestamp_begin], 0.0, hyp, tok, False) == 1
    assert skip_committed([tok.timestamp_begin], 0.0, hyp, tok, True) == 1

