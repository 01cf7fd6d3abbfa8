"""Prompt-lookup / n-gram drafting.

Speech in a domain repeats itself: the running transcript, the previous window (already in
the decoder prompt) and the domain's own phrases. The drafter finds the longest recent suffix
of the context that occurred before (in the context, else in a domain n-gram table built from
a corpus) and proposes what followed it. Draft length adapts to recent acceptance.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path


class NgramDrafter:
    def __init__(self, special_from: int, max_ngram: int = 4, min_ngram: int = 1,
                 max_draft: int = 8, table: dict[tuple[int, ...], int] | None = None):
        self.special_from = special_from  # first special token id: drafts stop before these
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.max_draft = max_draft
        self.draft_len = 4
        self.table = table or {}

    def _lookup_context(self, context: list[int], n: int) -> list[int]:
        key = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):  # most recent occurrence first
            if context[start : start + n] == key:
                return context[start + n : start + n + self.draft_len]
        return []

    def _lookup_table(self, context: list[int]) -> list[int]:
        draft, ctx = [], list(context)
        while len(draft) < self.draft_len:
            for n in range(self.max_ngram, 0, -1):
                nxt = self.table.get(tuple(ctx[-n:]))
                if nxt is not None:
                    break
            else:
                break
            draft.append(nxt)
            ctx.append(nxt)
        return draft

    def propose(self, context: list[int]) -> list[int]:
        draft: list[int] = []
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(context) > n and (draft := self._lookup_context(context, n)):
                break
        if not draft and self.table:
            draft = self._lookup_table(context)
        for i, token in enumerate(draft):
            if token >= self.special_from:
                return draft[:i]
        return draft

    def feedback(self, drafted: int, accepted: int) -> None:
        """Grow the draft after a full accept, shrink it towards what was accepted."""
        if drafted and accepted == drafted:
            self.draft_len = min(self.max_draft, self.draft_len + 2)
        elif drafted:
            self.draft_len = max(2, accepted + 1)


def build_table(texts: list[str], encode, max_ngram: int = 4) -> dict[tuple[int, ...], int]:
    """Most frequent next token after every n-gram (n <= max_ngram) of a domain corpus."""
    counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for text in texts:
        ids = encode(" " + text.strip())
        for i in range(1, len(ids)):
            for n in range(1, max_ngram + 1):
                if i - n >= 0:
                    counts[tuple(ids[i - n : i])][ids[i]] += 1
    return {key: c.most_common(1)[0][0] for key, c in counts.items()}


def table_from_corpus(path: str | Path, encode, max_ngram: int = 4) -> dict[tuple[int, ...], int]:
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    return build_table(lines, encode, max_ngram)
