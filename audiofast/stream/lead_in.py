"""Lead-in: close a line with the speech before it (whisper_streaming's buffer, per line).

A short line decoded alone is heard worse than with the speech before it (a voice, a rhythm;
evals/utterance_context.py). With ``StreamOptions.lead_in_s`` an utterance's closing decode
starts up to that much earlier, where an earlier utterance's audio is (its probes and updates
are decoded alone: what they commit stays, the close decides the rest). The prompt then holds
only the text before that audio (Whisper skips a phrase its prompt already holds), nothing is
forced (the earlier text would have to be forced too, and Whisper often stopped after it),
and the draft is the lead's text (what the last close said there) and the line's last
hypothesis, so the decode stays cheap. The hypothesis is then cut after the lead's text -
found by the words earlier finals said in the lead's audio, else by aligned times - and the
session sees the rest as a hypothesis of its own buffer.
"""

from __future__ import annotations

from collections import deque

from audiofast.asr.tokenizer import WhisperTokenizer
from audiofast.stream.agreement import after_words, norm_word, shift_timestamps, starts_word
from audiofast.stream.vad import SAMPLE_RATE

STEP = 320  # samples per timestamp step (20 ms): a lead of whole steps shifts tokens exactly
SPLIT_SLACK_S = 0.1  # a word must end this far into the utterance to be its own
END_SLACK_S = 0.5  # a close's last word must end this near to where VAD heard speech end
UNHEARD_S = 0.02  # a word the alignment gives less time than this was not heard
MIN_LEAD_SPEECH_S = 1.0  # a lead needs this much of an earlier utterance in it
EARLY_S = 0.5  # a lead's draft starts with the words ending this near before the lead (a draft
# that starts early realigns on the first words greedy says; one that starts late cannot)
# A line keeps its lead while lead + line fit the encoder window a short buffer gets anyway
# (decoder.py: PADDED_BUFFER_S + the 10 s pad, less its 2 s minimum): past that each decode
# would cost a longer window, and the line is long enough to be heard alone.
MAX_LEAD_BUFFER_S = 12.0
RETRY_FRACTION = 0.5  # a doubtful close is decoded again with this much of its lead ...
MIN_RETRY_LEAD_S = 2.0  # ... while the lead stays this long, then alone


class LeadIn:
    """What a stream's lead-ins need to know of its past: where VAD last heard speech end,
    the words earlier finals said (and when), and where each piece of prompt text's audio
    ended."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.speech_end = 0  # stream sample
        self._said: deque[tuple[int, float, str]] = deque(maxlen=200)  # (utterance, start, w)
        # (context length before, its audio's end) of the last pieces of prompt text
        self._retired: deque[tuple[int, int]] = deque(maxlen=256)
        # The last close: (its audio's start, its tokens, their aligned spans)
        self._last_close: tuple[int, list[int], list[tuple[float, float]]] = (0, [], [])

    def lead(self, start: int, audio_start: int) -> int:
        """Samples of earlier audio a new utterance from ``start`` is decoded with: up to
        ``seconds`` (whole timestamp steps), if an earlier utterance's speech is in them."""
        lead_from = max(start - int(self.seconds * SAMPLE_RATE), audio_start)
        if not self.seconds or self.speech_end < lead_from + MIN_LEAD_SPEECH_S * SAMPLE_RATE:
            return 0
        return (start - lead_from) // STEP * STEP

    def retire(self, context_length: int, until: int) -> None:
        """Text is becoming prompt context after ``context_length`` tokens; its audio ended at
        stream sample ``until``."""
        self._retired.append((context_length, until))

    def forget(self, tokens: int) -> None:
        """The prompt context's first ``tokens`` were dropped: text from before them is gone."""
        self._retired = deque(((max(0, n - tokens), end) for n, end in self._retired),
                              maxlen=self._retired.maxlen)

    def closed(self, audio_from: int, tokens: list[int], spans: list[tuple[float, float]]
               ) -> None:
        """The last close's hypothesis (with its lead, if it had one), each token's aligned
        span, and where its audio started: the next line's lead is most of that audio."""
        self._last_close = (audio_from, tokens, spans)

    def draft(self, lead_from: int, tokenizer: WhisperTokenizer) -> list[int]:
        """A draft for a lead's text before any decode of it: the last close's words from the
        first that ends within ``EARLY_S`` before the lead's start on, moved to its time
        (verification keeps only what greedy says, and the draft realigns after a departure:
        a guess costs little)."""
        audio_from, tokens, spans = self._last_close
        skip = (lead_from - audio_from) / SAMPLE_RATE
        first = next((i for i, t in enumerate(tokens) if t < tokenizer.eot
                      and starts_word(tokenizer, t) and spans[i][1] > skip - EARLY_S), None)
        if first is None:
            return []
        return [tokenizer.timestamp_begin, *shift_timestamps(tokens[first:], tokenizer, skip)]

    def said(self, utterance: int, words: list[dict]) -> None:
        self._said.extend((utterance, w["start"], w["w"]) for w in words)

    def prompt(self, context: list[int], lead_from: int) -> list[int]:
        """The prompt context that comes before the audio a lead starts at (stream sample)."""
        return context[:min([n for n, end in self._retired if end > lead_from],
                            default=len(context))]

    def own(self, utterance: int, lead_from: int, tokens: list[int],
            spans: list[tuple[float, float]], probs: list[float | None], lead_s: float,
            speech_end_s: float, tokenizer: WhisperTokenizer):
        """:func:`drop_lead` with the words earlier finals said in the lead's audio, less an
        unheard tail (:func:`unheard_tail`). Returns (tokens, spans, probs, the lead's tokens,
        doubtful: a tail was unheard or the words stop short of ``speech_end_s``)."""
        known = [w for u, start, w in self._said
                 if u < utterance and start >= lead_from / SAMPLE_RATE - 0.05]
        tokens, spans, probs, lead = drop_lead(tokens, spans, probs, lead_s, tokenizer, known)
        cut = unheard_tail(tokens, spans, tokenizer)
        doubtful = cut < len(tokens) or not reaches(tokens[:cut], spans[:cut], speech_end_s,
                                                    tokenizer)
        return tokens[:cut], spans[:cut], probs[:cut], lead, doubtful


def fits(samples: int) -> bool:
    """Whether a buffer of lead + line this long (samples) still decodes with its lead."""
    return samples <= MAX_LEAD_BUFFER_S * SAMPLE_RATE


def retry_lead(lead: int) -> int:
    """The lead (samples) a close is decoded again with when the one it had was doubtful:
    behind a long lead Whisper sometimes ends before a short last line, and a shorter lead is
    often heard through where the line alone is misheard. 0: alone."""
    lead = int(lead * RETRY_FRACTION) // STEP * STEP
    return lead if lead >= MIN_RETRY_LEAD_S * SAMPLE_RATE else 0


def lead_split(tokens: list[int], spans: list[tuple[float, float]], lead_s: float,
               tokenizer: WhisperTokenizer, known: list[str] | None = None) -> int:
    """Index of the first token of the utterance's own text in a hypothesis of lead + buffer.

    By text: ``known`` holds the words earlier finals said in the lead's audio; the line
    starts after the hypothesis's last three of them, searched near their count (as the
    session finds committed words). Else by time: the first word whose spoken part
    (punctuation aside) ends ``SPLIT_SLACK_S`` past ``lead_s`` (alignment stretches words into
    the silence beside them, the first of a line back to the last one's end; punctuation
    soaks up the pause after a line). A segment's opening timestamp at or past ``lead_s``
    goes with the line; ``len(tokens)`` if it has no word."""
    eot = tokenizer.eot
    words = _words(tokens, spans, tokenizer)
    split = next((w for w, word in enumerate(words) if word[2] > lead_s + SPLIT_SLACK_S),
                 len(words))
    after = after_words([w[3] for w in words], [norm_word(w) for w in known or []])
    split = split if after is None else after
    if split == len(words):
        return len(tokens)
    i = words[split][0]
    if i > 0 and tokens[i - 1] > eot and spans[i - 1][0] >= lead_s:
        i -= 1  # the segment's opening timestamp belongs to the utterance
    return i


def _words(tokens: list[int], spans: list[tuple[float, float]], tokenizer: WhisperTokenizer
           ) -> list[tuple[int, float, float, str]]:
    """(first token, start, end of its spoken part - punctuation aside -, normalised text) of
    each word of a hypothesis."""
    eot, words = tokenizer.eot, []
    firsts = [i for i, t in enumerate(tokens) if t < eot and starts_word(tokenizer, t)]
    for i, stop in zip(firsts, [*firsts[1:], len(tokens)][:len(firsts)], strict=True):
        j = i + 1
        while j < stop and tokens[j] < eot:
            j += 1
        spoken = [k for k in range(i, j) if k == i
                  or any(c.isalnum() for c in tokenizer.decode([tokens[k]]))]
        text = norm_word(tokenizer.decode(tokens[i:j]))
        words.append((i, spans[i][0], spans[spoken[-1]][1], text))
    return words


def unheard_tail(tokens: list[int], spans: list[tuple[float, float]],
                 tokenizer: WhisperTokenizer) -> int:
    """Where a hypothesis's last words begin if the alignment gives two or more of them no
    time at all (words the audio does not hold: Whisper, behind a lead, sometimes repeats a
    line or the prompt's text after the speech); ``len(tokens)`` otherwise."""
    words = _words(tokens, spans, tokenizer)
    n = len(words)
    while n and words[n - 1][2] - words[n - 1][1] < UNHEARD_S:
        n -= 1
    return words[n][0] if len(words) - n >= 2 else len(tokens)


def drop_lead(tokens: list[int], spans: list[tuple[float, float]], probs: list[float | None],
              lead_s: float, tokenizer: WhisperTokenizer, known: list[str] | None = None
              ) -> tuple[list[int], list[tuple[float, float]], list[float | None], list[int]]:
    """(tokens, spans, probs) of the utterance's own part, in its buffer's time (timestamps and
    spans ``lead_s`` earlier; a ``<|0.00|>`` opens it if the cut fell inside a segment), and
    the lead's tokens."""
    k = lead_split(tokens, spans, lead_s, tokenizer, known)
    own, lead = shift_timestamps(tokens[k:], tokenizer, lead_s), tokens[:k]
    own_spans = [(max(0.0, a - lead_s), max(0.0, b - lead_s)) for a, b in spans[k:]]
    own_probs = probs[k:]
    if own and own[0] < tokenizer.timestamp_begin:
        own, own_spans = [tokenizer.timestamp_begin, *own], [(0.0, 0.0), *own_spans]
        own_probs = [None, *own_probs]
    return own, own_spans, own_probs, lead


def reaches(tokens: list[int], spans: list[tuple[float, float]], speech_end_s: float,
            tokenizer: WhisperTokenizer) -> bool:
    """Whether a line's hypothesis has words up to where its speech ended (within
    ``END_SLACK_S``): behind a lead, Whisper sometimes ends its transcript early."""
    ends = [end for token, (_, end) in zip(tokens, spans, strict=True) if token < tokenizer.eot]
    return bool(ends) and ends[-1] >= speech_end_s - END_SLACK_S
