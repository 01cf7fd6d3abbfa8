"""LocalAgreement-2 over Whisper tokens, and times for committed text.

A token is committed once two consecutive hypotheses of the same (growing) buffer agree on
it and on everything before it (Machacek et al., whisper_streaming). We agree on token ids,
not words, but only commit up to a word boundary, so a word is never split between commits.
Committed tokens keep their timestamp tokens: they are fed back as the decoder's forced
prefix, and they carry the times of the text they bracket.
"""

from __future__ import annotations

from audiofast.asr.tokenizer import TIME_PER_TIMESTAMP, WhisperTokenizer


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
