"""Word start/end times from the model's cross-attention (``--word-timestamps``).

Whisper's timestamp tokens mark segments, 20 ms apart at best and often seconds long. Words
are timed the way openai-whisper and faster-whisper do it: some of the decoder's
cross-attention heads (the "alignment heads") follow the audio closely, so their attention
from each text token over the encoder frames, median-filtered, is a cost matrix; dynamic time
warping (DTW) through it gives each token the frame where the path first reaches it.
CTranslate2's ``Whisper.align`` runs the forced decoding and the DTW in one call over the
window's encoder output (whichever decoder wrote the text: the runtimes' ``align``). What is
left here is turning token times into words: tokens grouped into words (a word starts with a
space-led token; closing punctuation is timed apart, then joined to its word without its
time), each word from its first token's time to the next piece's, and pauses trimmed from
over-long words (:func:`trim_pauses`); the
long-form loop then sets each segment's bounds from its words (the timestamp tokens are 20 ms
steps the model often rounds to whole seconds).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from audiofast.asr.tokenizer import WhisperTokenizer
from audiofast.asr.types import Word

ENCODER_FRAMES_PER_SECOND = 50  # the encoder halves the mel frame rate (100 per second)
MEDIAN_FILTER_WIDTH = 7
PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"
SENTENCE_END = (".", "。", "!", "！", "?", "？")
SENTENCE_END_MARKS = ".。!！?？"
MAX_MEDIAN_WORD_S = 0.7


def split_words(tokens: list[int], tokenizer: WhisperTokenizer) -> list[list[int]]:
    """Text tokens grouped into words: a new word at each token whose text starts with
    whitespace (Whisper's byte-level BPE puts the space before a word)."""
    words: list[list[int]] = []
    for token in tokens:
        text = tokenizer.decode([token])
        if not words or text[:1].isspace():
            words.append([token])
        else:
            words[-1].append(token)
    return words


def merge_punctuation(words: list[str], starts: list[float], ends: list[float],
                      probs: list[float]) -> tuple[list[str], list[float], list[float],
                                                   list[float]]:
    """Opening quotes/brackets join the next word, closing punctuation the previous one (each
    keeping the word's own times)."""
    out_w, out_s, out_e, out_p = [], [], [], []
    carry = ""
    for word, start, end, prob in zip(words, starts, ends, probs, strict=True):
        if word.strip() and word.strip() in PREPEND_PUNCTUATION and not carry:
            carry = word
            continue
        if out_w and word.strip() and all(c in APPEND_PUNCTUATION for c in word.strip()) \
                and not word.startswith(" "):
            out_w[-1] += word  # the word keeps its own end: the pause the mark spans is
            continue  # no part of it (openai-whisper's and faster-whisper's convention)
        out_w.append(carry + word if carry else word)
        out_s.append(start)
        out_e.append(end)
        out_p.append(prob)
        carry = ""
    return out_w, out_s, out_e, out_p


def ends_sentence(word: Word) -> bool:
    return word.word.rstrip().endswith(SENTENCE_END)


def trim_pauses(words: list[Word], heard: Sequence[float] = (),
                opens_sentence: bool = True) -> list[Word]:
    """A word ends where the next begins, so a pause goes to the word before it, and DTW
    often starts the word after a pause early, inside it. As openai-whisper does: words
    longer than twice the median (at most 0.7 s) lose the excess at a sentence's end (their
    end) and at a sentence's start (their start).

    ``heard``: durations of the speaker's earlier words, counted in the median beside
    ``words``' own. A live final often holds one or two words, whose own median is no
    speaking rate at all (the word the pause stretched would be its own yardstick).
    ``opens_sentence``: whether the first word begins a sentence (a live final may continue
    one the previous final began)."""
    durations = [*heard, *(w.end - w.start for w in words if w.end > w.start)]
    if not durations:
        return words
    longest = 2 * min(float(np.median(durations)), MAX_MEDIAN_WORD_S)
    out = list(words)
    for i, w in enumerate(out):
        if w.end - w.start <= longest:
            continue
        if ends_sentence(w):
            out[i] = w = Word(w.start, round(w.start + longest, 3), w.word, w.probability)
        starts_sentence = opens_sentence if i == 0 else ends_sentence(out[i - 1])
        if starts_sentence and w.end - w.start > longest:
            out[i] = Word(round(w.end - longest, 3), w.end, w.word, w.probability)
    return out


def keep_within_segment(words: list[Word], start: float, end: float,
                        median_s: float) -> list[Word]:
    """A segment's first and last words cut back to its timestamp tokens when they run more
    than 0.5 s past them (as openai-whisper and faster-whisper do): DTW gives the last word
    everything up to end-of-text, which in a slow ending runs on into the silence after it.
    ``median_s``: the window's median word duration (at most 0.7 s), the shortest a cut
    word keeps."""
    if not words:
        return words
    out = list(words)
    first = out[0]
    if start < first.end and start - 0.5 > first.start:
        out[0] = Word(round(max(0.0, min(first.end - median_s, start)), 3), first.end,
                      first.word, first.probability)
    last = out[-1]
    if end > last.start and end + 0.5 < last.end:
        out[-1] = Word(last.start, round(max(last.start + median_s, end), 3), last.word,
                       last.probability)
    return out


def median_word_s(words: Sequence[Word]) -> float:
    durations = [w.end - w.start for w in words if w.end > w.start]
    return min(float(np.median(durations)), MAX_MEDIAN_WORD_S) if durations else 0.0


def token_times(alignment) -> np.ndarray:
    """Seconds from the window start at which the DTW path first reaches each aligned text
    token, then end-of-text (the last token's end)."""
    pairs = np.asarray(alignment.alignments, dtype=np.int64).reshape(-1, 2)
    jumps = np.diff(pairs[:, 0], prepend=-1) > 0
    return pairs[jumps, 1] / ENCODER_FRAMES_PER_SECOND


def is_closing(token_text: str) -> bool:
    """Closing punctuation glued to the word before it (",", ".", "?\"")."""
    mark = token_text.strip()
    return bool(mark) and not token_text[:1].isspace() and all(
        c in APPEND_PUNCTUATION for c in mark)


def split_pieces(tokens: list[int], tokenizer: WhisperTokenizer) -> list[list[int]]:
    """:func:`split_words`, with each closing-punctuation token a piece of its own (as
    openai-whisper splits before timing; :func:`merge_punctuation` joins it back): a
    sentence's final "." then carries the pause after the word, and the sentence-end rule
    cuts it there."""
    pieces: list[list[int]] = []
    for token in tokens:
        text = tokenizer.decode([token])
        if not pieces or text[:1].isspace() or is_closing(text):
            pieces.append([token])
        else:
            pieces[-1].append(token)
    return pieces


def cut_sentence_ends(pieces: list[str], starts: list[float], ends: list[float],
                      max_s: float) -> None:
    """In place: a sentence's end mark longer than ``max_s`` ends ``max_s`` after its start,
    the piece after one starts ``max_s`` before its end (openai-whisper's rule, before
    punctuation joins its word)."""
    for i in range(1, len(pieces)):
        if ends[i] - starts[i] > max_s:
            if pieces[i].strip() in SENTENCE_END_MARKS:
                ends[i] = starts[i] + max_s
            elif pieces[i - 1].strip() in SENTENCE_END_MARKS:
                starts[i] = ends[i] - max_s


def words_from_alignment(alignment, tokenizer: WhisperTokenizer,
                         segment_tokens: list[list[int]], time_offset: float
                         ) -> list[list[Word]]:
    """Words of each segment of one window, from CTranslate2's alignment of the window's text
    tokens (all segments' text tokens joined, as :meth:`align` on a runtime returns it).

    ``time_offset``: the window's start in seconds. A word runs from its first token's time
    to the next piece's: a pause before a comma or full stop is no part of it, one before
    the next word is; a word after a sentence's end starts at most twice the window's median
    piece before its end (:func:`cut_sentence_ends`)."""
    texts = [[t for t in tokens if t < tokenizer.eot] for tokens in segment_tokens]
    token_probs = np.asarray(alignment.text_token_probs, dtype=np.float64)
    jump_times = time_offset + token_times(alignment)
    timed = []  # per segment: its pieces' texts, starts, ends, probabilities
    first = 0  # index of the segment's first token among the window's text tokens
    for text in texts:
        groups = split_pieces(text, tokenizer)
        bounds = np.cumsum([first] + [len(g) for g in groups])
        first += len(text)
        if not groups or not len(jump_times):
            timed.append(([], [], [], []))
            continue
        times = [float(jump_times[min(i, len(jump_times) - 1)]) for i in bounds]
        timed.append(([tokenizer.decode(g) for g in groups], times[:-1], times[1:],
                      [float(token_probs[a:b].mean()) if b > a and b <= len(token_probs)
                       else 0.0 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]))
    durations = [e - s for _, starts, ends, _ in timed for s, e in zip(starts, ends, strict=True)
                 if e > s]
    max_s = 2 * min(float(np.median(durations)), MAX_MEDIAN_WORD_S) if durations else 0.0
    out: list[list[Word]] = []
    for pieces, starts, ends, probs in timed:
        if durations:
            cut_sentence_ends(pieces, starts, ends, max_s)
        words, starts, ends, probs = merge_punctuation(pieces, starts, ends, probs)
        out.append([Word(round(start, 3), round(max(end, start), 3), word, round(prob, 4))
                    for word, start, end, prob in zip(words, starts, ends, probs, strict=True)])
    return out


def force_align(runtime, audio: np.ndarray, text: str, language: str = "en") -> list[Word]:
    """The words of a known transcript timed on its audio (16 kHz, at most 30 s): forced
    alignment with the same DTW and pause convention as ``--word-timestamps``. ``runtime``:
    a CT2Whisper or FastWhisper (their ``encode`` and ``align``)."""
    from audiofast.asr.features import N_FRAMES, log_mel_spectrogram, pad_or_trim

    if len(audio) > N_FRAMES * 160:
        raise ValueError(f"force_align takes at most 30 s of audio, got {len(audio) / 16000:.1f} s")
    tok = runtime.tokenizer
    mel = pad_or_trim(log_mel_spectrogram(audio, runtime.n_mels), N_FRAMES)
    tokens = tok.encode(" " + " ".join(text.split()))
    alignment = runtime.align(runtime.encode(mel), tok.sot_sequence(language, "transcribe", True),
                              [tokens], [min(N_FRAMES, len(audio) // 160)])[0]
    return trim_pauses(words_from_alignment(alignment, tok, [tokens], 0.0)[0])

