"""The previous hypothesis as the draft (live streaming).

A live session re-decodes its growing buffer every half second, and most of what the new
decode says, the last one already said: the words not yet committed, with their timestamps.
Those tokens are the draft; the target verifies them (greedy_decode keeps a drafted token only
where greedy would have picked it), so the output is exactly plain greedy's and the draft only
changes how many decoder calls it takes.

Where the new decode departs from the old (a timestamp moved, a word was re-heard), the draft
picks up again after the latest place the last few tokens occur in the old hypothesis.
"""

from __future__ import annotations

REALIGN_NGRAM = 2  # tokens that must match to resume the old hypothesis after a departure


class HypothesisDrafter:
    def __init__(self, prompt_length: int, expected: list[int], max_draft: int = 32):
        """``expected``: the previous hypothesis's output tokens (what greedy is expected to
        say after the ``prompt_length`` prompt tokens, forced prefix included)."""
        self.prompt_length = prompt_length
        self.expected = expected
        self.max_draft = max_draft
        self.draft_len = max_draft

    def propose(self, context: list[int]) -> list[int]:
        generated = context[self.prompt_length:]
        k = len(generated)
        if generated == self.expected[:k]:  # still saying what it said last time
            return self.expected[k : k + self.draft_len]
        key = generated[-REALIGN_NGRAM:]
        if len(key) < REALIGN_NGRAM:
            return []
        for start in range(len(self.expected) - REALIGN_NGRAM, -1, -1):
            if self.expected[start : start + REALIGN_NGRAM] == key:
                resume = start + REALIGN_NGRAM
                return self.expected[resume : resume + self.draft_len]
        return []

    def feedback(self, drafted: int, accepted: int) -> None:
        """A rejected draft cost a decoder row per token past the rejection: after one, draft
        little more than was accepted; after a full accept, go back to the whole rest."""
        if drafted and accepted == drafted:
            self.draft_len = self.max_draft
        elif drafted:
            self.draft_len = max(2, 2 * accepted)
