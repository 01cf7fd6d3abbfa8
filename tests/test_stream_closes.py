"""How an utterance closes in a live session: the closing decode done ahead when the silence
begins, applied without the decoder once VAD confirms it, replacing an update still waiting
for its encoder call, and at the end of a stream that stops in a pause."""

from __future__ import annotations

import dataclasses

import numpy as np

from audiofast.audio import load_audio
from audiofast.eval.wer import normalize, wer
from audiofast.stream.decoder import StreamDecoder
from audiofast.stream.replay import replay
from audiofast.stream.session import StreamOptions, StreamSession
from audiofast.stream.vad import SpeechDetector


def test_closing_decode_done_ahead_is_the_closing_decode(live, clips):
    """Each utterance VAD closes is answered by the decode started when its silence began,
    and that hypothesis is exactly what decoding the closing request then would give (same
    audio, prefix and context); a pause too short to end the utterance wastes one decode
    but its hypothesis is never used."""
    speech = load_audio(clips["clone-test"].audio)
    pause = lambda s: np.zeros(int(s * 16000), np.float32)  # noqa: E731
    # a 0.3 s pause (silence begins, the utterance goes on), then a 1.5 s one (it ends)
    audio = np.concatenate([speech[:32000], pause(0.3), speech[32000:], pause(1.5), speech])
    decoder = StreamDecoder(live, draft=False)
    checked = []
    decode = decoder.decode

    def decode_and_check(requests):
        for request in requests:
            if request.ready is not None:
                fresh = decode([dataclasses.replace(request, ready=None)])[0]
                checked.append(fresh.tokens == request.ready.tokens)
        return decode(requests)

    decoder.decode = decode_and_check
    run = replay(decoder, audio)
    assert checked == [True] and run.ready == 1  # the first utterance; the second ends with
    assert len({e["utterance"] for e in run.finals}) == 2  # the stream, not with VAD
    waited = replay(StreamDecoder(live, draft=False), audio, StreamOptions(early_close=False))
    assert waited.ready == 0
    assert normalize(waited.text) == normalize(run.text)


def test_a_close_decoded_ahead_is_applied_without_the_decoder(live, clips):
    """``close_ahead`` (what the server calls right after each VAD feed) closes an utterance
    whose closing decode was done ahead, with no decoder call: the decoder never sees a
    ready request, and the finals are the same as when that close waits for a decode round
    (replay). It declines while a decode is in flight."""
    speech = load_audio(clips["clone-test"].audio)
    audio = np.concatenate([speech, np.zeros(24000, np.float32), speech])
    decoder = StreamDecoder(live)
    session = StreamSession(decoder.tokenizer, StreamOptions())
    finals, ahead, in_flight_declined = [], 0, 0

    def decode_due() -> None:
        nonlocal in_flight_declined
        while (request := session.next_request()) is not None:
            assert request.ready is None
            in_flight_declined += session.close_ahead() is None
            hyp = decoder.decode([request])[0]
            finals.extend(e for e in session.apply(hyp) if e["type"] == "final")

    for start in range(0, len(audio), 1600):
        session.feed(audio[start:start + 1600])
        if (events := session.close_ahead()) is not None:
            ahead += 1
            finals.extend(e for e in events if e["type"] == "final")
        decode_due()
    session.end_of_audio()
    decode_due()
    assert session.finished and ahead >= 1 and in_flight_declined > 0
    waited = replay(StreamDecoder(live), audio)
    assert waited.ready == ahead
    assert [(e["text"], e["start"]) for e in finals] \
        == [(e["text"], e["start"]) for e in waited.finals]


def test_a_close_that_came_due_replaces_the_update_in_flight(live, clips):
    """``supersede`` (asked by the server before it encodes a round's update) keeps an update
    in flight while the utterance goes on, and replaces it by the close once the silence that
    may end the utterance begins: the close's buffer holds the update's audio and more, the
    dropped update is never applied, and the session still streams every word."""
    clip = clips["clone-test"]
    audio = np.concatenate([load_audio(clip.audio), np.zeros(24000, np.float32)])
    decoder = StreamDecoder(live)
    session = StreamSession(decoder.tokenizer, StreamOptions())
    texts: list[str] = []
    held, kept, replaced = None, 0, None

    def run(request) -> None:
        events = session.apply(decoder.decode([request])[0])
        texts.extend(e["text"] for e in events if e["type"] == "final")

    for start in range(0, len(audio), 1600):
        session.feed(audio[start:start + 1600])
        if held is not None:  # a busy server: the update waits for its encoder call
            if (request := session.supersede()) is None:
                kept += 1
                continue
            replaced, held = (held, request), None
            run(request)
            continue
        while (request := session.next_request()) is not None:
            if not request.urgent and replaced is None:
                held = request
                break
            run(request)
    session.end_of_audio()
    while (request := session.next_request()) is not None:
        run(request)
    assert session.finished and kept > 0 and replaced is not None
    update, close = replaced
    assert close.urgent and not close.probe and len(close.audio) > len(update.audio)
    assert np.array_equal(close.audio[: len(update.audio)], update.audio)
    assert wer(clip.reference, " ".join(texts)) <= 0.1, texts


def test_a_stream_that_ends_in_a_pause_closes_with_the_decode_done_ahead(live, clips):
    """A client that stops sending 0.3 s into the pause after its last words (before VAD's
    0.5 s could end the utterance) gets the close decoded when that pause began: no decode
    after the end of the stream."""
    audio = load_audio(clips["clone-test"].audio)
    detector = SpeechDetector()
    last_end = [e.sample for e in detector.feed(audio) + detector.flush() if e.kind == "end"][-1]
    audio = np.concatenate([audio[:last_end], np.zeros(4800, np.float32)])
    run = replay(StreamDecoder(live), audio)
    assert run.ready == 1 and run.finals


def test_no_update_while_a_silence_that_may_end_the_utterance_waits_for_its_post_roll(live,
                                                                                   clips):
    """Once VAD hears a silence that may end the utterance, the only decode asked for is
    its close (done ahead when the post-roll has arrived): an update then would be replaced
    by that close, or once encoded make the close wait for it. Speech after a pause too short
    to end the utterance is updated as before, and every word still streams."""
    speech = load_audio(clips["clone-test"].audio)
    pause = lambda s: np.zeros(int(s * 16000), np.float32)  # noqa: E731
    audio = np.concatenate([speech[:32000], pause(0.35), speech[32000:], pause(1.5)])
    decoder = StreamDecoder(live)
    # an update every 0.1 s of new audio: without the rule one falls in every such silence
    session = StreamSession(decoder.tokenizer, StreamOptions(min_chunk_s=0.1))
    in_silence, updates, texts = [], 0, []
    for start in range(0, len(audio), 800):  # 50 ms frames
        session.feed(audio[start:start + 800])
        while (request := session.next_request()) is not None:
            if session.detector.pending_end is not None:
                in_silence.append(request)
            updates += not request.urgent
            events = session.apply(decoder.decode([request])[0])
            texts += [e["text"] for e in events if e["type"] == "final"]
    session.end_of_audio()
    while (request := session.next_request()) is not None:
        texts += [e["text"] for e in session.apply(decoder.decode([request])[0])
                  if e["type"] == "final"]
    assert session.finished and updates > 2
    kinds = [(r.urgent, r.probe) for r in in_silence]
    assert kinds and all(urgent and not probe for urgent, probe in kinds), kinds
    assert wer(clips["clone-test"].reference, " ".join(texts)) <= 0.1, texts


def test_urgent_requests_say_how_long_their_user_has_waited(live, clips):
    """The scheduler orders what users wait on by deadline, from ``waited_s``: first words
    are asked for ``first_chunk_s`` after VAD heard the speech begin, a close ``post_roll_s``
    after the silence that ends it began (one decoded ahead is handed out once VAD confirms
    the end, ``min_silence_s`` in). Fed in 50 ms frames, each is that late give or take a
    frame and VAD's 32 ms chunk."""
    decoder = StreamDecoder(live)
    options = StreamOptions()
    session = StreamSession(decoder.tokenizer, options)
    audio = np.concatenate([load_audio(clips["clone-test"].audio), np.zeros(16000, np.float32)])
    waits: dict[str, list[float]] = {"probe": [], "close": [], "ready": []}
    for start in range(0, len(audio), 800):
        session.feed(audio[start:start + 800])
        while (request := session.next_request()) is not None:
            if request.urgent:
                kind = "probe" if request.probe else "ready" if request.ready else "close"
                waits[kind].append(request.waited_s)
            session.apply(request.ready or decoder.decode([request])[0])
    slack = 0.05 + 0.032
    assert waits["probe"] and waits["close"] and waits["ready"], waits
    assert all(options.first_chunk_s <= w <= options.first_chunk_s + slack
               for w in waits["probe"]), waits
    assert all(options.post_roll_s <= w <= options.post_roll_s + slack
               for w in waits["close"]), waits
    assert all(w >= session.detector.options.min_silence_s for w in waits["ready"]), waits


def test_the_prompt_holds_the_last_context_tokens_of_closed_utterances(live, clips):
    """What closed utterances said is the next decodes' prompt, cut to ``context_tokens``;
    0 means no prompt at all (not the whole history, as a ``[-0:]`` slice would give). Lines
    closed alone: a close with a lead-in stops its prompt where the lead's audio begins
    (test_stream_lead_in.py)."""
    decoder = StreamDecoder(live)
    audio = load_audio(clips["beckett"].audio)  # six short lines
    for keep in (0, 5):
        session = StreamSession(decoder.tokenizer, StreamOptions(context_tokens=keep,
                                                                 lead_in_s=0.0))
        prompts = []
        for start in range(0, len(audio), 1600):
            session.feed(audio[start:start + 1600])
            while (request := session.next_request()) is not None:
                prompts.append((request.context, list(session.context)))
                session.apply(request.ready or decoder.decode([request])[0])
        assert any(len(history) > 5 for _, history in prompts)  # several lines closed
        for prompt, history in prompts:
            assert prompt == (history[-keep:] if keep else []), (keep, prompt, history)
