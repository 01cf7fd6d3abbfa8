"""Lead-in (stream/lead_in.py): a line decoded with the speech before it, the lead's words cut
off by their aligned times, the prompt stopping where the lead's audio begins."""

from __future__ import annotations

import numpy as np

from audiofast.audio import load_audio
from audiofast.stream import lead_in
from audiofast.stream.decoder import Hypothesis, StreamDecoder
from audiofast.stream.lead_in import (
    EARLY_S,
    MAX_LEAD_BUFFER_S,
    MIN_RETRY_LEAD_S,
    LeadIn,
    drop_lead,
    lead_split,
    retry_lead,
    unheard_tail,
)
from audiofast.stream.replay import replay
from audiofast.stream.session import StreamOptions, StreamSession
from audiofast.stream.vad import SpeechDetector


def timed(tok, pieces: list[tuple[str, float, float]]) -> tuple[list[int], list]:
    """Tokens and spans of text pieces (each piece one token, checked) or timestamps (``<t>``)."""
    tokens, spans = [], []
    for text, start, end in pieces:
        if text == "<t>":
            tokens.append(tok.timestamp_begin + round(start / 0.02))
        else:
            ids = tok.encode(text)
            assert len(ids) == 1, (text, ids)
            tokens.append(ids[0])
        spans.append((start, end))
    return tokens, spans


def test_a_line_starts_at_its_first_word_spoken_past_the_lead(base):
    """Alignment stretches a line's first word back over the pause before it (its middle in
    the lead) and the lead's last punctuation over the pause after it: the split follows
    where the spoken part of each word ends, and keeps a segment's opening timestamp."""
    tok = base.tokenizer
    tokens, spans = timed(tok, [("<t>", 0.0, 0.0), (" Ever", 0.0, 0.4), (" said", 0.4, 0.9),
                                (".", 0.9, 2.1), (" What", 0.9, 2.4), (" now", 2.4, 2.7),
                                ("?", 2.7, 2.8)])
    assert lead_split(tokens, spans, 2.0, tok) == 4  # "What": middle 1.65 s, ends 2.4 s
    assert lead_split(tokens, spans, 2.5, tok) == 5  # "What" ends before 2.5 + 0.1 s
    assert lead_split(tokens, spans, 3.0, tok) == len(tokens)  # nothing of the line heard
    # ... unless earlier finals said the lead's words: the line starts after them.
    assert lead_split(tokens, spans, 2.5, tok, ["No.", "Ever", "said."]) == 4
    assert lead_split(tokens, spans, 3.0, tok, ["Ever", "said."]) == 4
    # A line that repeats the lead's words: the lead's are the first ones.
    again, again_spans = timed(tok, [(" Ever", 0.0, 0.4), (" said", 0.4, 0.9), (".", 0.9, 2.0),
                                     (" Ever", 2.2, 2.6), (" said", 2.6, 3.0)])
    assert lead_split(again, again_spans, 2.0, tok, ["Ever", "said."]) == 3
    # A hypothesis that skipped the line, its lead's words aligned over the line's audio.
    skipped, skipped_spans = timed(tok, [(" Ever", 0.0, 1.2), (" said", 1.2, 3.0)])
    assert lead_split(skipped, skipped_spans, 2.0, tok, ["Ever", "said."]) == 2
    with_segment, seg_spans = timed(tok, [("<t>", 0.0, 0.0), (" Ever", 0.0, 0.4),
                                          ("<t>", 0.9, 0.9), ("<t>", 2.1, 2.1),
                                          (" What", 2.1, 2.4)])
    assert lead_split(with_segment, seg_spans, 2.0, tok) == 3  # from <|2.10|>


def test_drop_lead_gives_the_line_in_its_own_buffers_time(base):
    tok = base.tokenizer
    tokens, spans = timed(tok, [("<t>", 0.0, 0.0), (" Ever", 0.0, 0.4), (".", 0.4, 1.0),
                                (" What", 1.9, 2.4), (" now", 2.4, 2.7), ("<t>", 2.8, 2.8)])
    probs = [None, 0.9, 0.8, 0.7, 0.6, None]
    own, own_spans, own_probs, lead = drop_lead(tokens, spans, probs, 2.0, tok)
    assert lead == tokens[:3]
    assert tok.decode([t for t in own if t < tok.eot]) == " What now"
    # The cut fell inside a segment: <|0.00|> opens the line; the closing timestamp moved.
    assert own[0] == tok.timestamp_begin and own[-1] == tok.timestamp_begin + 40
    assert np.allclose(own_spans[1:3], [(0.0, 0.4), (0.4, 0.7)])
    assert own_probs == [None, 0.7, 0.6, None]


def test_the_prompt_stops_where_the_leads_audio_begins():
    lead_in = LeadIn(3.0)
    for before, end in [(0, 16000), (5, 48000), (9, 80000)]:  # three lines' text, audio ends
        lead_in.retire(before, end)
    context = list(range(14))
    assert lead_in.prompt(context, 60000) == context[:9]  # the lead holds the third line
    assert lead_in.prompt(context, 30000) == context[:5]  # ... the second and third
    assert lead_in.prompt(context, 90000) == context  # all of it is before the lead


def kind(request) -> str:
    """A request's kind: a first-words probe, an update or a close."""
    return "probe" if request.probe else "close" if request.urgent else "update"


def two_lines(tok, stops_early: bool = False, second_s: float = 1.92, loops: bool = False,
              hold_s: float = 0.0, finals_by: list | None = None,
              first_probs: list[float] | None = None) -> tuple[list[tuple], list[str]]:
    """Two lines (speech at 0.32-2.24 s and from 3.52 s for ``second_s``) through a session
    with a 3 s lead-in, each decode answered with a made-up hypothesis: the first line's
    text, and for the second the lead's words then its own (``stops_early``: a lead decode's
    close says only the lead's; ``loops``: a lead decode's hypothesis comes back marked
    ``looped``, as the decoder returns one that repeats itself). Each sample's value is its
    index, so a request's audio tells where it starts. Returns (utterance, the request's lead
    in samples, its kind - probe, update or close -, context, prefix, answered by the close
    decoded ahead, audio samples) per request, and the finals (each also appended to
    ``finals_by`` as (utterance, the kind of request whose hypothesis made it, text)).
    ``hold_s``: ``StreamOptions.first_commit_s``; ``first_probs``: the first line's text
    tokens' probabilities (as the alignment gives them), and ``commit_min_prob`` 0.5."""
    chunks = iter(range(10**6))
    detector = SpeechDetector(model=lambda chunk: float(
        10 <= (i := next(chunks)) < 70 or 110 <= i < 110 + second_s / 0.032))  # 32 ms chunks
    session = StreamSession(tok, StreamOptions(lead_in_s=3.0, first_commit_s=hold_s,
                                               commit_min_prob=0.5), detector)
    ts = tok.timestamp_begin
    seen, finals = [], []
    for frame in range(int(10 * (5 + second_s))):  # in 0.1 s frames
        session.feed((np.arange(frame * 1600, (frame + 1) * 1600) * 1e-6).astype(np.float32))
        request = session.next_request()
        if request is None:
            continue
        utt = session.utterances[0]
        lead_samples = utt.start - round(request.audio[0] * 1e6)  # where its audio starts
        seen.append((utt.index, lead_samples, kind(request), request.context, request.prefix,
                     request.ready is not None, len(request.audio)))
        lead = round(lead_samples / 16000 / 0.02)
        if utt.index == 1 or not lead:  # a line alone
            text = " Ever tried." if utt.index == 1 else " Ever failed."
            tokens = [ts, *tok.encode(text), ts + 90]
        elif stops_early and len(request.audio) > 2.1 * 16000 + utt.lead:  # the closes
            tokens = [ts, *tok.encode(" Ever tried."), ts + lead - 25]
        else:
            tokens = [ts, *tok.encode(" Ever tried."), ts + lead - 25, ts + lead + 15,
                      *tok.encode(" Ever failed."), ts + lead + 110]
        probs = first_probs if utt.index == 1 else None
        made = [e["text"] for e in session.apply(request.ready or Hypothesis(
            tokens, 0.01, -0.1, False, text_probs=probs, looped=loops and lead > 0))
            if e["type"] == "final"]
        finals += made
        if finals_by is not None:
            finals_by += [(utt.index, kind(request), text) for text in made]
    return seen, finals


def test_a_lines_close_is_decoded_with_the_audio_before_it_and_no_prompt_of_it(base):
    """With ``lead_in_s``, the second utterance's closing decodes hold the audio from up to
    that much earlier (whole 20 ms steps), the prompt leaves out the text of the first (its
    audio is in the lead), nothing is forced, and the first line's words are not finals twice.
    Its probes and updates are decoded alone, with the first line's text as their prompt."""
    seen, finals = two_lines(base.tokenizer)
    closes = [entry for entry in seen if entry[0] == 2 and entry[2] == "close"]
    assert closes and all(lead > 0 and lead % 320 == 0 for _, lead, *_ in closes), seen
    assert len({lead for _, lead, *_ in closes}) == 1, closes  # one lead for the line
    assert all(context == [] and prefix == [] for *_, context, prefix, _, _ in closes), closes
    alone = [entry for entry in seen if entry[0] == 2 and entry[2] != "close"]
    assert {entry[2] for entry in alone} == {"probe", "update"}, seen
    assert all(lead == 0 and context for _, lead, _, context, *_ in alone), seen
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals


def test_a_close_that_stops_before_its_line_is_decoded_again_with_half_its_lead_then_alone(
        base, monkeypatch):
    """Behind a lead Whisper sometimes ends its transcript before the line's last words: such
    a close is not applied; the line's close is decoded again with half the lead (whole
    steps) while that is at least ``MIN_RETRY_LEAD_S``, then on its own buffer (no lead, its
    prompt), and when that was found on the close decoded ahead, the next is decoded ahead."""
    monkeypatch.setattr(lead_in, "MIN_RETRY_LEAD_S", 1.0)  # the 3.3 s lead two_lines allows
    seen, finals = two_lines(base.tokenizer, stops_early=True)
    closes = [entry for entry in seen if entry[0] == 2 and entry[2] == "close"]
    leads = list(dict.fromkeys(lead for _, lead, *_ in closes))  # each lead tried, in order
    assert len(leads) == 3 and leads[-1] == 0, closes
    assert leads[1] == leads[0] // 2 // 320 * 320 >= 16000, leads  # half, still >= 1 s
    assert closes[-1][3] != [], closes  # alone: the first line's text is its prompt
    assert closes[-1][5], closes  # ... answered by the alone-close decoded ahead
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals
    # With the default minimum, a lead this short is not halved: the next close is alone.
    monkeypatch.undo()
    seen, finals = two_lines(base.tokenizer, stops_early=True)
    leads = list(dict.fromkeys(lead for utt, lead, kind, *_ in seen
                               if utt == 2 and kind == "close"))
    assert len(leads) == 2 and leads[-1] == 0, seen
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals


def test_a_retry_lead_is_half_the_lead_in_whole_steps_down_to_its_minimum():
    assert retry_lead(8 * 16000) == 4 * 16000
    assert retry_lead(5 * 16000 + 320) % 320 == 0 and retry_lead(5 * 16000) == 40000
    assert retry_lead(int(2 * MIN_RETRY_LEAD_S * 16000) - 640) == 0  # half is under it
    assert retry_lead(0) == 0


def test_a_short_line_with_a_lead_commits_nothing_before_its_close(base):
    """With ``first_commit_s`` an utterance whose close will hear a lead commits no word
    while its buffer is shorter: the close, heard with the speech before it, says all of a
    short line (updates alone agree on misheard first words of short buffers). The first
    line, which has no lead, commits as it goes; without the hold the second does too."""
    held, free = [], []
    _, finals = two_lines(base.tokenizer, hold_s=2.5, finals_by=held)
    two_lines(base.tokenizer, finals_by=free)
    assert {kind for utt, kind, _ in held if utt == 2} == {"close"}, held
    assert "update" in {kind for utt, kind, _ in free if utt == 2}, free
    assert "update" in {kind for utt, kind, _ in held if utt == 1}, held
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals


def test_a_word_the_model_is_unsure_of_waits_for_more_audio_or_the_close(base):
    """Two updates that agree on a word the model gives a low probability do not commit it,
    nor anything after it: a later update, or the close, says it. Sure words commit as the
    updates agree on them."""
    tok = base.tokenizer
    n = len(tok.encode(" Ever tried."))
    sure, unsure = [], []
    two_lines(tok, finals_by=sure, first_probs=[0.9] * n)
    _, finals = two_lines(tok, finals_by=unsure, first_probs=[0.3] + [0.9] * (n - 1))
    assert [(kind, text) for utt, kind, text in sure if utt == 1] == [
        ("update", "Ever"), ("close", "tried.")], sure  # "tried." is in the last 0.5 s
    assert [(kind, text) for utt, kind, text in unsure if utt == 1] == [
        ("close", "Ever tried.")], unsure
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals


def test_a_long_line_is_closed_alone(base):
    """A lead is for short lines: once lead + line would pass ``MAX_LEAD_BUFFER_S`` (a
    longer encoder window), the line drops its lead and is closed alone, the first line's text
    its prompt as without a lead; a short line with the same lead is closed with it."""
    seen, finals = two_lines(base.tokenizer, second_s=9.6)  # no cut before its close
    closes = [entry for entry in seen if entry[0] == 2 and entry[2] == "close"]
    assert closes and all(lead == 0 for _, lead, *_ in closes), closes
    assert all(n + 3 * 16000 > MAX_LEAD_BUFFER_S * 16000 for *_, n in closes), closes
    assert all(context for *_, context, _, _, _ in closes), closes  # the first line: prompt
    short, _ = two_lines(base.tokenizer)
    assert any(lead for _, lead, kind, *_ in short if kind == "close"), short
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals


def test_a_line_whose_lead_decode_loops_is_decoded_alone(base):
    """A hypothesis that repeats itself behind a lead, and again without the prompt, is not
    retried on a 30 s window (as a line alone is): the request asks for none, the decoder
    marks it ``looped``, and the line is closed alone at once."""
    seen, finals = two_lines(base.tokenizer, loops=True)
    closes = [entry for entry in seen if entry[0] == 2 and entry[2] == "close"]
    assert len(closes) >= 2 and closes[0][1] > 0, closes
    assert all(lead == 0 for _, lead, *_ in closes[1:]), closes
    assert " ".join(finals).split() == ["Ever", "tried.", "Ever", "failed."], finals


def test_words_the_alignment_gives_no_time_are_an_unheard_tail(base):
    """Two or more last words squeezed into no time (a line repeated after the speech) are
    cut; one such word (speech cut at the buffer's end) or squeezed words before heard ones
    are not."""
    tok = base.tokenizer
    tokens, spans = timed(tok, [(" What", 0.0, 0.3), (" now", 0.3, 0.6), ("?", 0.6, 0.8),
                                (" What", 0.8, 0.8), (" now", 0.8, 0.8), ("?", 0.8, 0.8)])
    assert unheard_tail(tokens, spans, tok) == 3
    assert unheard_tail(tokens[:5], spans[:5], tok) == 3
    assert unheard_tail(tokens[:4], spans[:4], tok) == 4  # one squeezed word: kept
    heard_after = spans[:3] + [(0.8, 0.8), (0.8, 1.2), (1.2, 1.3)]
    assert unheard_tail(tokens, heard_after, tok) == len(tokens)
    assert unheard_tail([], [], tok) == 0


def test_a_leads_first_draft_is_the_last_closes_words_from_the_lead_on(base):
    """Before a line's first lead decode, the draft for the lead's text is what the last close
    said there: its words from the first that ends within ``EARLY_S`` before the lead, their
    timestamps moved to the lead's time (whole 20 ms steps), opened at <|0.00|>."""
    tok = base.tokenizer
    tokens, spans = timed(tok, [("<t>", 0.0, 0.0), (" No", 0.2, 0.6), (".", 0.6, 0.6),
                                ("<t>", 0.8, 0.8), ("<t>", 1.0, 1.0), (" Ever", 1.1, 1.5),
                                (" said", 1.5, 2.0), (".", 2.0, 2.0), ("<t>", 2.2, 2.2)])
    lead_in = LeadIn(6.0)
    assert lead_in.draft(16000, tok) == []  # no close yet
    lead_in.closed(8000, tokens, spans)  # that close's audio began 0.5 s into the stream
    ts = tok.timestamp_begin
    # A lead from 1.7 s (1.2 s into the close's audio): "No." ended 0.6 s before, "Ever" ...
    assert lead_in.draft(27200, tok) == [ts, *tokens[5:8], ts + 50]
    # ... from 1.2 s (0.7 s in): "No." ends 0.1 s before it.
    assert EARLY_S == 0.5
    assert lead_in.draft(19200, tok) == [ts, *tokens[1:3], ts + 5, ts + 15, *tokens[5:8],
                                         ts + 75]


def test_a_lead_decodes_as_plain_greedy_and_its_drafts_save_calls(live, clips):
    """With a lead-in, the drafts (the lead's text from the last close, then each decode's)
    change nothing a session decodes, and take fewer decoder calls than greedy alone."""

    audio = load_audio(clips["beckett"].audio)
    plain, drafted = StreamDecoder(live, draft=False), StreamDecoder(live)
    alone = replay(plain, audio, StreamOptions(lead_in_s=6.0))
    led = replay(drafted, audio, StreamOptions(lead_in_s=6.0))
    assert led.hypotheses == alone.hypotheses and led.text == alone.text
    assert drafted.stats["tokens"] == plain.stats["tokens"]
    assert drafted.stats["decoder_calls"] < 0.9 * plain.stats["decoder_calls"], drafted.stats


def test_a_long_streams_prompt_text_stays_bounded_and_leads_still_find_their_prompt(base):
    """Hours of speech do not grow a session's prompt text without end: past twice
    ``KEEP_CONTEXT`` tokens only the last ``KEEP_CONTEXT`` stay, and where each piece's audio
    ended moves with them, so a lead's prompt still stops where the lead's audio begins."""
    from audiofast.stream.session import KEEP_CONTEXT

    tok = base.tokenizer
    session = StreamSession(tok, StreamOptions(lead_in_s=3.0))
    piece = tok.encode(" Ever tried. Ever failed.")
    for i in range(400):
        session._retire(piece, (i + 1) * 16000)  # one line per second of audio
    assert 400 * len(piece) > 2 * KEEP_CONTEXT  # it was trimmed ...
    assert KEEP_CONTEXT <= len(session.context) <= 2 * KEEP_CONTEXT  # ... to its last tokens
    assert session.context[-len(piece):] == piece
    lead_in = session._lead_in
    assert lead_in.prompt(session.context, 399 * 16000 + 1) == session.context[:-len(piece)]
    assert lead_in.prompt(session.context, 396 * 16000 + 1) \
        == session.context[:-4 * len(piece)]
    assert lead_in.prompt(session.context, 16000) == []  # its text is gone: no prompt


def test_a_live_server_with_a_lead_in_streams_real_speech(live, base, clips):
    """End to end on loopback, two real recordings at once at 2x real time through a server
    whose sessions close each line with up to 6 s of the speech before it: later lines'
    closes carry their lead (probes and updates never), and the finals read as offline's."""
    import asyncio

    from audiofast.eval.wer import wer
    from audiofast.stream.client import stream_audio
    from audiofast.stream.server import ServerOptions, ServerThread

    thread = ServerThread(live, ServerOptions(port=0, stream=StreamOptions(lead_in_s=6.0)))
    decoder = thread.server.decoder
    real, seen = decoder.decode, []

    def decode(requests: list, *encoded) -> list:
        seen.extend((kind(r), not r.full_window_retry) for r in requests if r.ready is None)
        return real(requests, *encoded)

    decoder.decode = decode
    names = ["beckett", "clone-test"]
    with thread as url:
        async def run_all():
            return await asyncio.gather(*(stream_audio(url, load_audio(clips[n].audio), 2.0)
                                          for n in names))
        results = asyncio.run(run_all())
    assert any(led for what, led in seen if what == "close"), seen  # leads were decoded
    assert not any(led for what, led in seen if what != "close"), seen  # ... for closes only
    for name, result in zip(names, results, strict=True):
        assert result.closed and not result.errors, result.events
        reference, n = clips[name].reference, len(clips[name].reference.split())
        offline = wer(reference, base.transcribe(clips[name].audio).text)
        # Within a word of offline (a live run decodes at other moments than a replay).
        assert (wer(reference, result.text) - offline) * n <= 1, result.text


def test_a_close_hears_its_whole_lead_while_an_earlier_close_is_late(live, clips, monkeypatch):
    """A loaded server answers late, so a line can begin while the one before still waits
    for its close; the later line's lead may reach back before the waiting line's buffer
    (cut after a long sentence) and must not be dropped from the session's audio (two_cities
    replayed with delays: four of its closes got a few stray samples instead of lead + line,
    and were heard as "Thank you.")."""
    seen = []
    real = StreamSession.next_request

    def next_request(self, urgent_only=False):
        request = real(self, urgent_only)
        if request is not None and request.ready is None:
            utt, end, _, _, lead = self._in_flight
            seen.append((lead, len(request.audio), end - (utt.start - lead)))
        return request

    monkeypatch.setattr(StreamSession, "next_request", next_request)
    replay(StreamDecoder(live), load_audio(clips["two_cities"].audio), latency=(0.05, 0.9))
    assert sum(1 for lead, *_ in seen if lead) >= 4, seen
    assert all(n == expected for _, n, expected in seen), [s for s in seen if s[1] != s[2]]
