"""LocalAgreement-2 over Whisper tokens, and times for committed text.

A token is committed once two consecutive hypotheses of the same (growing) buffer agree on
it and on everything before it (Machacek et al., whisper_streaming). We agree on token ids,
not words, but only commit up to a word boundary, so a word is never split between commits.
Committed tokens keep their timestamp tokens: they are fed back as the decoder's forced
prefix, and they carry the times of the text they bracket.
"""

from __future__ import annotations

from audiofast.asr.tokenizer import TIME_PER_TIMESTAMP, WhisperTokenizer

TIME_SLACK_S = 0.1  # a word must end this much after the committed text to be new


def agreed_length(previous: list[int], current: list[int], start: int,
                  tokenizer: WhisperTokenizer) -> int:
    """Length of the committable prefix of ``current``: agreed with ``previous`` token for
    token, at least ``start`` (already committed), and ending where a new word begins."""
    n = start
    while n < min(len(previous), len(current)) and previous[n] == current[n]:
        n += 1
    # Only cut before a token that starts a word (or a timestamp): "Hel|lo" must not commit.
    while n > start and (n == len(current) or not starts_word(tokenizer, current[n])):
        n -= 1
    return n


def starts_word(tokenizer: WhisperTokenizer, token: int) -> bool:
    if token >= tokenizer.eot:
        return True
    return (tokenizer.tokenizer.id_to_token(token) or "").startswith("Ġ")  # byte-level space


def token_spans(tokens: list[int], tokenizer: WhisperTokenizer,
                duration: float) -> list[tuple[float, float]]:
    """(start, end) seconds from the buffer start for every token: text between two
    timestamp tokens is spread over that segment in proportion to its characters."""
    ts_begin = tokenizer.timestamp_begin
    spans = [(0.0, 0.0)] * len(tokens)
    segment: list[int] = []
    left = 0.0

    def place(right: float) -> None:
        lengths = [len(tokenizer.decode([tokens[i]])) or 1 for i in segment]
        total, done = sum(lengths), 0
        for i, length in zip(segment, lengths, strict=True):
            spans[i] = (left + (right - left) * done / total,
                        left + (right - left) * (done + length) / total)
            done += length
        segment.clear()

    for i, token in enumerate(tokens):
        if token >= ts_begin:
            time = (token - ts_begin) * TIME_PER_TIMESTAMP
            if segment:
                place(max(time, left))
            spans[i] = (time, time)
            left = time
        else:
            segment.append(i)
    if segment:
        place(max(duration, left))
    return spans


def aligned_spans(tokens: list[int], tokenizer: WhisperTokenizer, text_times: list[float],
                  duration: float) -> list[tuple[float, float]]:
    """(start, end) seconds for every token from the model's own alignment: ``text_times``
    holds each text token's start (cross-attention DTW, word_timing.py) and then the end of
    the last one; timestamp tokens keep their own time."""
    ts_begin = tokenizer.timestamp_begin
    spans, k = [], 0
    for token in tokens:
        if token >= ts_begin:
            time = (token - ts_begin) * TIME_PER_TIMESTAMP
            spans.append((time, time))
        else:
            start = text_times[min(k, len(text_times) - 1)]
            end = text_times[min(k + 1, len(text_times) - 1)]
            spans.append((min(start, duration), min(max(end, start), duration)))
            k += 1
    return spans


def shift_timestamps(tokens: list[int], tokenizer: WhisperTokenizer, seconds: float) -> list[int]:
    """Move timestamp tokens earlier by ``seconds`` (after the buffer start moved later)."""
    ts_begin, steps = tokenizer.timestamp_begin, round(seconds / TIME_PER_TIMESTAMP)
    return [max(ts_begin, t - steps) if t >= ts_begin else t for t in tokens]


def last_segment_end(tokens: list[int], tokenizer: WhisperTokenizer) -> int | None:
    """Index of the last timestamp token that closes a segment (follows text), if any."""
    ts_begin = tokenizer.timestamp_begin
    for i in range(len(tokens) - 1, 0, -1):
        if tokens[i] >= ts_begin and tokens[i - 1] < ts_begin:
            return i
    return None


def token_probs(tokens: list[int], tokenizer: WhisperTokenizer,
                text_probs: list[float] | None) -> list[float | None]:
    """Each token's probability from the alignment (text tokens only; None elsewhere)."""
    probs: list[float | None] = [None] * len(tokens)
    if text_probs:
        text_at = [i for i, t in enumerate(tokens) if t < tokenizer.eot]
        for i, p in zip(text_at, text_probs, strict=False):
            probs[i] = p
    return probs


def norm_word(word: str) -> str:
    """A word as the session matches it against earlier text: lower case, letters and digits."""
    return "".join(c for c in word.lower() if c.isalnum())


def repeated_run(text: str, max_words: int = 3) -> int:
    """The most times a phrase of up to ``max_words`` words follows itself back to back (1:
    never): the short loops zlib cannot see in a short text ("Humpty, humpty, humpty, humpty")."""
    words = [w for w in map(norm_word, text.split()) if w]
    most = 1
    for n in range(1, max_words + 1):
        for i in range(len(words) - n + 1):
            times = 1
            while words[i + times * n: i + (times + 1) * n] == words[i: i + n]:
                times += 1
            most = max(most, times)
    return most


def after_words(words: list[str], done: list[str]) -> int | None:
    """Index of the word after a hypothesis's copy of the last (up to) three of the words
    ``done`` (both normalised, :func:`norm_word`), searched near ``len(done)``: Whisper may
    have reworded, merged or split a few of the earlier ones. None if they are not there."""
    n = len(done)
    for k in sorted(range(max(1, n - 3), n + 4), key=lambda k: abs(k - n)) if n else []:
        tail = min(3, n, k)
        if k <= len(words) and words[k - tail:k] == done[n - tail:]:
            return k
    return None


def skip_committed(committed: list[int], committed_end: float, tokens: list[int],
                   tokenizer: WhisperTokenizer, force: bool,
                   spans: list[tuple[float, float]] | None = None) -> int | None:
    """Where the uncommitted part of a new hypothesis begins. Usually the committed tokens
    are its prefix; if Whisper reworded them, align on the last committed words
    (:func:`after_words`). None: the hypothesis lost them (short windows sometimes drop a
    whole phrase, e.g. one the prompt already holds), so it cannot be trusted -- unless
    ``force`` (the utterance is closing and this is the only hypothesis of all its audio):
    then skip the words that end before the committed text did (``committed_end``, seconds;
    ``spans``: the hypothesis's aligned token times; a word's end, not its start: alignment
    stretches the first word over audio whose words the text lost), or without times as
    many words as were committed."""
    if tokens[: len(committed)] == committed:
        return len(committed)
    starts = [i for i, t in enumerate(tokens) if t < tokenizer.eot and starts_word(tokenizer, t)]
    stops = [*starts[1:], len(tokens)] if starts else []  # where each word ends
    words = [norm_word(tokenizer.decode(tokens[i:j])) for i, j in zip(starts, stops, strict=True)]
    done = [norm_word(w) for w in tokenizer.decode(committed).split()]
    if not done:  # only timestamps were committed: every word is new
        return starts[0] if starts else len(tokens)
    k = after_words(words, done)
    if k is not None:
        return starts[k] if k < len(starts) else len(tokens)
    if force and spans is not None:  # a word ending after the committed text is new
        ends = [spans[j - 1][1] for j in stops]
        after = [i for i, e in zip(starts, ends, strict=True) if e > committed_end + TIME_SLACK_S]
        return after[0] if after else len(tokens)
    if force:
        return starts[len(done)] if len(done) < len(starts) else len(tokens)
    return None
