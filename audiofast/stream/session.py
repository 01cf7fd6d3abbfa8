"""One live stream's policy: VAD utterances, LocalAgreement-2 commits, bounded buffers.

Pure bookkeeping, no I/O: the server feeds audio, asks for the next decode request, runs it
(batched with other streams) and hands the hypothesis back; events come out as dicts.

- silero VAD splits the stream into utterances; audio outside them is never decoded.
- While an utterance grows, it is re-decoded every ``min_chunk_s`` of new audio; tokens two
  consecutive hypotheses agree on, up to a word the model is unsure of, are committed
  (``final`` events) and forced as the prefix of later decodes, the rest is the ``partial``.
- Past ``trim_after_s`` the buffer is cut at the end of a committed Whisper segment, so the
  work per update stays bounded; ``max_utterance_s`` force-commits if no cut point appears.
- When VAD hears the utterance end, one last decode commits everything left. It is decoded
  ahead, when the silence that may end the utterance begins (plus the post-roll): if VAD
  confirms the end at that sample, the final costs the confirmation wait, not wait + decode
  (``close_ahead``). With ``lead_in_s`` a line's close hears the speech before it (lead_in.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from audiofast.asr.hallucination import words_anomalous
from audiofast.asr.tokenizer import TIME_PER_TIMESTAMP, WhisperTokenizer
from audiofast.asr.word_timing import trim_pauses
from audiofast.stream.agreement import (
    agreed_length,
    aligned_spans,
    last_segment_end,
    shift_timestamps,
    skip_committed,
    starts_word,
    token_probs,
    token_spans,
)
from audiofast.stream.decoder import DecodeRequest, Hypothesis
from audiofast.stream.final_words import FinalWords, timed_words
from audiofast.stream.lead_in import LeadIn, fits, retry_lead
from audiofast.stream.vad import SAMPLE_RATE, SpeechDetector, VadEvent

KEEP_CONTEXT = 512  # earlier text tokens kept for prompts (each takes its last 64 at most)


class Overloaded(RuntimeError):
    """More audio is waiting for this stream than ``max_pending_s`` allows."""


@dataclass(frozen=True)
class StreamOptions:
    language: str | None = "en"
    task: str = "transcribe"
    min_chunk_s: float = 0.5  # new audio that triggers a re-decode
    # ... until the utterance has text: short buffers are cheap, first words are awaited.
    first_chunk_s: float = 0.25
    commit_margin_s: float = 0.5  # never commit words this close to the buffer end
    # A line whose close hears a lead commits nothing while shorter: its close says it all.
    first_commit_s: float = 2.5
    # Agreed words commit only up to one the model is less sure of: more audio mends those.
    commit_min_prob: float = 0.5
    trim_after_s: float = 10.0  # then cut the buffer at a committed segment end
    max_utterance_s: float = 24.0  # force-commit beyond this: bounded work per update
    pre_roll_s: float = 0.25  # audio kept before the VAD onset
    post_roll_s: float = 0.2  # ... and after the VAD offset
    max_pending_s: float = 60.0  # audio waiting to be decoded before the stream is refused
    no_speech_threshold: float = 0.6
    logprob_threshold: float = -1.0
    context_tokens: int = 64  # earlier text passed as the <|startofprev|> prompt
    early_close: bool = True  # decode the closing buffer when the silence begins
    lead_in_s: float = 8.0  # close a line with this much earlier speech before it (lead_in.py)


@dataclass
class Utterance:
    index: int
    start: int  # stream sample of the buffer's first sample (moves when trimmed)
    onset: int  # stream sample where VAD heard speech begin
    end: int | None = None  # set when VAD hears the utterance end
    committed: list[int] = field(default_factory=list)  # hypothesis prefix already emitted
    previous: list[int] = field(default_factory=list)  # the last hypothesis after that
    decoded_to: int = 0  # stream sample where the last decoded buffer ended
    committed_end: float = 0.0  # seconds from the buffer start where the committed text ends
    # The closing decode done ahead (stream sample it closes on, its hypothesis); valid while
    # nothing else was applied to the utterance since.
    early: tuple[int, Hypothesis] | None = None
    lead: int = 0  # samples of earlier audio before ``start`` its close hears (lead_in.py)
    lead_tokens: list[int] = field(default_factory=list)  # what the last close said of them

    def drop_lead(self, keep: int = 0) -> None:
        """Decode the line alone from now on (or with only ``keep`` samples of lead)."""
        self.lead, self.lead_tokens = keep, []


class StreamSession:
    def __init__(self, tokenizer: WhisperTokenizer, options: StreamOptions = StreamOptions(),
                 detector: SpeechDetector | None = None):
        self.tokenizer = tokenizer
        self.options = options
        self.detector = detector if detector is not None else SpeechDetector()
        self.audio = np.zeros(0, dtype=np.float32)  # kept samples, from ``audio_start``
        self.audio_start = 0
        self.received = 0
        self.utterances: list[Utterance] = []
        self.context: list[int] = []
        self._lead_in = LeadIn(options.lead_in_s)  # what lead-ins need of the past
        self.ending = False
        self._count = 0
        # (utterance, end sample, closes the utterance, decoded ahead of its end, lead samples)
        self._in_flight: tuple[Utterance, int, bool, bool, int] | None = None
        self._last_partial = ""
        self._final_words = FinalWords()  # times the finals' words across the stream

    # -- input -------------------------------------------------------------------------
    def feed(self, audio: np.ndarray) -> None:
        """Append 16 kHz mono float32 audio."""
        if self.ending:
            raise ValueError("audio after end of stream")
        self.audio = np.concatenate([self.audio, audio.astype(np.float32, copy=False)])
        self.received += len(audio)
        for event in self.detector.feed(audio):
            self._on_vad(event)
        self._drop_old_audio()
        if self.pending_seconds() > self.options.max_pending_s:
            raise Overloaded(f"more than {self.options.max_pending_s:g} s of audio is waiting")

    def end_of_audio(self) -> None:
        for event in self.detector.flush():
            self._on_vad(event)
        self.ending = True

    @property
    def finished(self) -> bool:
        return self.ending and not self.utterances and self._in_flight is None

    def pending_seconds(self) -> float:
        """Audio received but not yet covered by a decode."""
        if not self.utterances:
            return 0.0
        first = self.utterances[0]
        return (self.received - max(first.decoded_to, first.start)) / SAMPLE_RATE

    def _on_vad(self, event: VadEvent) -> None:
        if event.kind == "start":
            floor = self.utterances[-1].end if self.utterances else self.audio_start
            start = max(event.sample - int(self.options.pre_roll_s * SAMPLE_RATE),
                        floor or 0, self.audio_start)
            self._count += 1
            self.utterances.append(Utterance(self._count, start, event.sample,
                                             lead=self._lead_in.lead(start, self.audio_start)))
        elif self.utterances and self.utterances[-1].end is None:
            self._lead_in.speech_end = event.sample
            end = event.sample + int(self.options.post_roll_s * SAMPLE_RATE)
            self.utterances[-1].end = min(end, self.received) if not self.ending else end

    def _drop_old_audio(self) -> None:
        keep_s = max(self.options.pre_roll_s, self.options.lead_in_s)
        keep_from = self.received - int(keep_s * SAMPLE_RATE)
        # Every waiting utterance's lead (a later line's can reach back before the start of
        # one still waiting for its close).
        keep_from = min([keep_from, *(u.start - u.lead for u in self.utterances)])
        if keep_from > self.audio_start:
            self.audio = self.audio[keep_from - self.audio_start:]
            self.audio_start = keep_from

    def _samples(self, start: int, end: int) -> np.ndarray:
        assert start >= self.audio_start, "audio dropped before it was decoded"
        return self.audio[start - self.audio_start: end - self.audio_start]

    # -- decoding ----------------------------------------------------------------------
    def next_request(self, urgent_only: bool = False) -> DecodeRequest | None:
        """The decode this stream needs now, if any (one at a time per stream); with
        ``urgent_only``, only one a user waits on (an utterance's first words, its close)."""
        if self._in_flight is not None or not self.utterances:
            return None
        utt = self.utterances[0]
        closed_at = self._closed_at(utt)
        closed = closed_at is not None
        end = closed_at if closed else self.received
        early = None if closed else self._early_end(utt)
        heard = bool(utt.committed or utt.previous)
        if early is not None:
            end = early
        elif not closed:
            chunk = self.options.min_chunk_s if heard else self.options.first_chunk_s
            if end - max(utt.decoded_to, utt.onset) < chunk * SAMPLE_RATE \
                    or self._silence_pending(utt):
                return None
        closing = closed or early is not None
        if urgent_only and heard and not closing:
            return None
        if utt.lead and not fits(utt.lead + end - utt.start):
            utt.drop_lead()  # the line is long enough to be heard alone
        # Only a close hears the lead; probes and updates are decoded alone (streaming-log.md).
        lead = utt.lead if closing else 0
        self._in_flight = (utt, end, closed, early is not None, lead)
        j = last_segment_end(utt.committed, self.tokenizer)
        prefix = utt.committed[: j + 1] if j is not None else []
        # What the last decode said after the prefix: the draft the new decode verifies.
        draft = utt.committed[len(prefix):] + utt.previous
        ready = utt.early[1] if closed and utt.early and utt.early[0] == end else None
        since = end - int(self.options.post_roll_s * SAMPLE_RATE) if closing else utt.onset
        context = self.context
        if lead:  # the prompt stops where the lead's audio begins; nothing is forced
            context = self._lead_in.prompt(context, utt.start - lead)
            said = utt.lead_tokens or self._lead_in.draft(utt.start - lead, self.tokenizer)
            draft = said + shift_timestamps(prefix + draft, self.tokenizer, -lead / SAMPLE_RATE)
            prefix = []
        keep = self.options.context_tokens  # 0: no prompt (a [-0:] slice would keep all)
        return DecodeRequest(self._samples(utt.start - lead, end),
                             context[-keep:] if keep > 0 else [],
                             self.options.language, self.options.task, prefix, draft, ready,
                             urgent=closing or not heard, probe=not (closing or heard),
                             waited_s=(self.received - since) / SAMPLE_RATE,
                             full_window_retry=not lead)

    def supersede(self) -> DecodeRequest | None:
        """Replace the update in flight, not decoded yet, by the close that came due since
        (the silence that may end the utterance began, or VAD ended it): the close decodes
        the update's audio and more, and a user waits on it. Returns the close's request (the
        update's is dropped: nothing of it was applied), or None (the update stays)."""
        if self._in_flight is None:
            return None
        utt, _, closed, early, _ = self._in_flight
        if closed or early or not (utt.committed or utt.previous):
            return None  # not an update of an utterance under way
        update, self._in_flight = self._in_flight, None
        request = self.next_request(urgent_only=True)
        if request is None:
            self._in_flight = update
        return request

    def close_ahead(self) -> list[dict] | None:
        """Close the first utterance now if VAD has confirmed its end where its closing
        decode was done ahead: that needs no decoder, so the server applies it at once rather
        than after the decode round in progress (the same hypothesis either way). Returns the
        close's events, or None when that is not the case."""
        if self._in_flight is not None or not self.utterances:
            return None
        utt = self.utterances[0]
        end = self._closed_at(utt)
        if end is None or not (utt.early and utt.early[0] == end):
            return None
        request = self.next_request()
        assert request is not None and request.ready is not None
        return self.apply(request.ready)

    def _closed_at(self, utt: Utterance) -> int | None:
        """The sample ``utt`` closes on once VAD has ended it and its post-roll has arrived (or
        the stream ended); None while it goes on."""
        if utt.end is None or (utt.end > self.received and not self.ending):
            return None
        return min(utt.end, self.received)

    def _silence_pending(self, utt: Utterance) -> bool:
        """Whether VAD hears a silence that may end ``utt``: its close is decoded once the
        post-roll has arrived (or was already), so an update now would only be replaced by
        that close or, once encoded, make the close wait for it."""
        return self.options.early_close and self.detector.pending_end is not None \
            and self.utterances[-1] is utt

    def _early_end(self, utt: Utterance) -> int | None:
        """The sample the utterance closes on if the silence VAD is hearing lasts, once its
        post-roll has arrived and if not decoded ahead already (None: nothing to do ahead)."""
        if not self._silence_pending(utt):
            return None
        end = self.detector.pending_end + int(self.options.post_roll_s * SAMPLE_RATE)
        if end > self.received or end <= max(utt.decoded_to, utt.start) \
                or (utt.early and utt.early[0] == end):
            return None
        return end

    def apply(self, hyp: Hypothesis) -> list[dict]:
        """Take the hypothesis for the request :meth:`next_request` gave; return events."""
        assert self._in_flight is not None, "apply() without a request"
        utt, end, closed, early, lead_samples = self._in_flight
        self._in_flight = None
        if lead_samples and hyp.looped:  # Whisper repeated itself behind the lead: the line
            utt.drop_lead()  # is decoded again, alone (not at 30 s)
            return []
        if early and not lead_samples:  # kept for the close; later audio is decoded from here on
            utt.early, utt.decoded_to = (end, hyp), end
            return []
        if not early:
            utt.early = None
        opts, tok = self.options, self.tokenizer
        tokens = hyp.tokens
        silent = hyp.no_speech_prob > opts.no_speech_threshold
        if silent and hyp.avg_logprob < opts.logprob_threshold:
            tokens = []  # silence or noise: nothing new
        duration = (end - utt.start) / SAMPLE_RATE
        origin = utt.start / SAMPLE_RATE  # token times are relative to it (cuts move it)
        forced = closed or duration > opts.max_utterance_s
        aligned = bool(hyp.text_times) and len(tokens) > 0
        lead = lead_samples / SAMPLE_RATE
        spans = aligned_spans(tokens, tok, hyp.text_times, duration + lead) if aligned \
            else token_spans(tokens, tok, duration + lead)
        probs = token_probs(tokens, tok, hyp.text_probs)
        if closed and opts.lead_in_s:  # the next line's lead drafts from it
            self._lead_in.closed(utt.start - lead_samples, tokens, spans)
        if lead_samples:
            speech_end = (utt.end or end) / SAMPLE_RATE - opts.post_roll_s - origin
            tokens, spans, probs, utt.lead_tokens, doubtful = self._lead_in.own(
                utt.index, utt.start - lead_samples, tokens, spans, probs, lead, speech_end, tok)
            if doubtful or utt.committed and skip_committed(
                    utt.committed, utt.committed_end, tokens, tok, False) is None:
                # Whisper ended early, added words it did not hear or dropped committed ones:
                # decoded again with a shorter lead, then alone (found ahead: ahead).
                utt.drop_lead(keep=retry_lead(utt.lead))
                return []
            if early:
                utt.early, utt.decoded_to = (end, hyp), end
                return []
        if silent and aligned and hyp.text_probs and not utt.committed \
                and words_anomalous(trim_pauses(timed_words(tokens, spans, probs, origin, tok))):
            # A breath or a click VAD took for speech, "heard" as "Thank you.": the model
            # doubts there is speech and its words look unlike speech (offline's rule).
            tokens, spans, probs = [], [], []
        done = skip_committed(utt.committed, utt.committed_end, tokens, tok, forced,
                              spans if aligned else None)
        if done is None:
            utt.decoded_to = end
            return []
        tail = tokens[done:]
        if forced:
            agreed = len(tail)
        else:  # agreed twice, and not in the last moments of audio the model has heard
            agreed = agreed_length(utt.previous, tail, 0, tok)
            if not utt.committed and utt.lead and duration < opts.first_commit_s:
                agreed = 0  # a short line is decided by its close, heard with its lead
            limit = duration - opts.commit_margin_s
            agreed = next((i for i in range(agreed) if probs[done + i] is not None
                           and probs[done + i] < opts.commit_min_prob), agreed)
            while agreed and (spans[done + agreed - 1][1] > limit
                              or not starts_word(tok, tail[agreed])):
                agreed -= 1
        events = self._final(utt, tokens[done:done + agreed], spans[done:done + agreed],
                             probs[done:done + agreed])
        if agreed:
            utt.committed_end = spans[done + agreed - 1][1]
        utt.committed, utt.previous, utt.decoded_to = tokens[:done + agreed], tail[agreed:], end
        if closed:
            self._retire(utt.committed, end)
            self.utterances.remove(utt)
            return events + self._partial("", utt, 0.0)
        if forced:
            self._cut(utt, duration, len(utt.committed))
        elif duration > opts.trim_after_s and (j := last_segment_end(utt.committed, tok)):
            self._cut(utt, (utt.committed[j] - tok.timestamp_begin) * TIME_PER_TIMESTAMP, j + 1)
        rest = tail[agreed:]
        start = spans[done + agreed][0] if rest else duration
        return events + self._partial(tok.decode(rest).strip(), utt, origin + start)

    def _final(self, utt: Utterance, tokens: list[int], spans: list[tuple[float, float]],
               probs: list[float | None]) -> list[dict]:
        tok = self.tokenizer
        text_at = [i for i, t in enumerate(tokens) if t < tok.eot]
        text = tok.decode(tokens).strip()
        if not text:
            return []
        offset = utt.start / SAMPLE_RATE
        out = self._final_words.time(timed_words(tokens, spans, probs, offset, tok))
        self._lead_in.said(utt.index, out)
        start, end = offset + spans[text_at[0]][0], offset + spans[text_at[-1]][1]
        if out:  # the words' bounds: a pause trimmed from the last word is not speech
            start, end = out[0]["start"], out[-1]["end"]
        return [{"type": "final", "utterance": utt.index, "text": text,
                 "start": round(start, 3), "end": round(end, 3), "words": out}]

    def _cut(self, utt: Utterance, seconds: float, keep_from: int) -> None:
        """Move the buffer start ``seconds`` later; committed tokens before ``keep_from``
        are done with and become prompt context."""
        self._retire(utt.committed[:keep_from], utt.start + int(round(seconds * SAMPLE_RATE)))
        utt.committed = shift_timestamps(utt.committed[keep_from:], self.tokenizer, seconds)
        utt.previous = shift_timestamps(utt.previous, self.tokenizer, seconds)
        utt.committed_end = max(0.0, utt.committed_end - seconds)
        utt.start += int(round(seconds * SAMPLE_RATE))
        utt.drop_lead()  # the buffer now starts inside the utterance

    def _retire(self, tokens: list[int], until: int) -> None:
        """Committed text leaving the buffer (its audio ends at stream sample ``until``)
        becomes prompt context (never text still in the buffer: the prompt would then make
        Whisper repeat it)."""
        self._lead_in.retire(len(self.context), until)
        self.context += [t for t in tokens if t < self.tokenizer.eot]
        if len(self.context) > 2 * KEEP_CONTEXT:  # an hours-long stream keeps only its end
            drop = len(self.context) - KEEP_CONTEXT
            self.context = self.context[drop:]
            self._lead_in.forget(drop)

    def _partial(self, text: str, utt: Utterance, start: float) -> list[dict]:
        if text == self._last_partial:
            return []
        self._last_partial = text
        return [{"type": "partial", "utterance": utt.index, "text": text,
                 "start": round(start, 3)}]

