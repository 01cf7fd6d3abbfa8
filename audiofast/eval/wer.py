"""WER after one documented normalisation, so every lane scores text the same way.

Normalisation: lower-case, expand a few English contractions, drop punctuation (keeping
apostrophes inside words), collapse whitespace. This is a subset of Whisper's English
normaliser; it leaves numbers alone, so eval texts avoid them.
"""

from __future__ import annotations

import re

import jiwer

_CONTRACTIONS = {
    r"\bwon't\b": "will not", r"\bcan't\b": "can not", r"n't\b": " not", r"'re\b": " are",
    r"'ll\b": " will", r"'ve\b": " have", r"'m\b": " am",
}


def normalize(text: str) -> str:
    text = text.lower().replace("\u2019", "'")
    for pattern, replacement in _CONTRACTIONS.items():
        text = re.sub(pattern, replacement, text)
    text = re.sub(r"[^\w\s']|(?<!\w)'|'(?!\w)", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def wer(references: list[str] | str, hypotheses: list[str] | str) -> float:
    """Corpus WER (total errors over total reference words) of normalised text."""
    refs = [references] if isinstance(references, str) else references
    hyps = [hypotheses] if isinstance(hypotheses, str) else hypotheses
    refs, hyps = [normalize(r) for r in refs], [normalize(h) for h in hyps]
    if not any(refs):
        raise ValueError("references are empty after normalisation")
    return jiwer.wer(refs, hyps)
