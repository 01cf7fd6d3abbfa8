"""WER after Whisper's English text normaliser, so every lane scores text the same way.

The normaliser is the one the Whisper paper scored with (transformers ships it as
``EnglishTextNormalizer``): lower case, contractions and titles expanded ("won't" -> "will
not", "Mr." -> "mister"), fillers dropped ("uh", "hmm"), spelled-out numbers and currency
turned into digits ("twenty-five dollars" -> "$25"), punctuation and diacritics removed. Its
British -> American spelling table lives in the Hub tokenizers' ``normalizer.json``, which no
offline wheel carries, so it is empty here: "colour" and "color" count as different words.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache

import jiwer


@lru_cache(maxsize=1)
def _normalizer():
    # Imported on first use: the module pulls in transformers' lazy package (~1 s).
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer({})


def normalize(text: str) -> str:
    return _normalizer()(text.replace("\u2019", "'").replace("\u2018", "'"))


def word_pairs(words: list[str], reference: list[str]) -> list[tuple[int, int]]:
    """(i, j) for each word ``words[i]`` matched to ``reference[j]``: the same letters and
    digits in any case, in order (difflib's longest matching blocks). For comparing the
    times of words two transcripts share."""
    def key(word: str) -> str:
        return "".join(c for c in word.lower() if c.isalnum())

    blocks = difflib.SequenceMatcher(None, [key(w) for w in words], [key(w) for w in reference],
                                     autojunk=False).get_matching_blocks()
    return [(b.a + k, b.b + k) for b in blocks for k in range(b.size)]


def wer(references: list[str] | str, hypotheses: list[str] | str) -> float:
    """Corpus WER (total errors over total reference words) of normalised text."""
    refs = [references] if isinstance(references, str) else references
    hyps = [hypotheses] if isinstance(hypotheses, str) else hypotheses
    refs, hyps = [normalize(r) for r in refs], [normalize(h) for h in hyps]
    if not any(re.search(r"\w", r) for r in refs):
        raise ValueError("references are empty after normalisation")
    return jiwer.wer(refs, hyps)
