"""The gate's sentences cut into two fixed halves, so the judge is not fitted by the search.

Picking the best of N gated trials overfits the sentences they were gated on: a trial that
passes by luck on those sentences looks best. A sweep therefore selects on one half (even or
odd sentences in file order, comment header excluded) with no real recordings, and confirms
the chosen configuration on the other half plus the real recordings, which no trial saw.
"""

from __future__ import annotations

HALVES = ("even", "odd")


def split_texts(texts: list[str], select: str = "even") -> tuple[list[str], list[str]]:
    """(selection half, confirmation half) of ``texts``: every other sentence, the same on
    every run; ``select`` says which of the two the search sees."""
    if select not in HALVES:
        raise ValueError(f"select must be one of {HALVES}, not {select!r}")
    even, odd = texts[0::2], texts[1::2]
    return (even, odd) if select == "even" else (odd, even)


def halves(config: dict, select: str = "even", limit: int | None = None
           ) -> tuple[list[str], list[str]]:
    """The two halves of the gate config's sentences (``asr.texts``), each cut to ``limit``
    sentences if given (smoke runs)."""
    from audiofast.eval.gate import gate_texts

    selection, confirmation = split_texts(gate_texts(config), select)
    if limit is not None:
        selection, confirmation = selection[:limit], confirmation[:limit]
    return selection, confirmation
