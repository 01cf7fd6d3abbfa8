"""Vocab diet: cut the output head (and embedding) to the tokens a deployment actually uses.

A 51,865-token head is ~1.3 ms of every Whisper-base decoding step in int8 (Qwen3-ASR's is
152k x 2048: most of its decoder's weights). A domain needs far fewer. The kept set is:

- every special and timestamp token (the decoding rules need them all),
- the 256 byte-level tokens, so any text stays encodable (a dropped token is spelled with
  the fewest kept pieces, bytes at worst: :meth:`DietVocab.encode`),
- then the tokens that cover most of a domain corpus, most frequent first.

Slicing keeps the kept rows exactly, so before any training the diet model's logits are the
full model's logits at the kept ids. What it cannot do yet is spell words whose token was
dropped; recovery (``audiofast distill --stage vocab``) teaches that by distillation from the
full model on audio (:mod:`audiofast.distill.asr`). Works on any Hugging Face model with
input/output embeddings: Whisper and Qwen3-ASR share this code.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import nn

VOCAB_MAP_FILE = "vocab_map.json"


def byte_level_alphabet() -> set[str]:
    """The 256 printable characters byte-level BPE (GPT-2, Whisper, Qwen) uses for raw bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return set(chars)


@dataclass
class DietVocab:
    """The kept token ids (ascending: specials keep their relative order) and the id maps."""

    kept: list[int]
    full_size: int
    token_to_id: dict[str, int] | None = None  # byte-level token strings, for re-spelling

    def __post_init__(self) -> None:
        if sorted(set(self.kept)) != self.kept:
            raise ValueError("kept token ids must be unique and ascending")
        if self.kept and not 0 <= self.kept[0] <= self.kept[-1] < self.full_size:
            raise ValueError(f"kept ids must lie in [0, {self.full_size})")

    @cached_property
    def to_diet(self) -> np.ndarray:
        """Original id -> diet id (-1 for dropped tokens), int64."""
        table = np.full(self.full_size, -1, dtype=np.int64)
        table[np.asarray(self.kept, dtype=np.int64)] = np.arange(len(self.kept))
        return table

    @cached_property
    def kept_ids(self) -> np.ndarray:
        return np.asarray(self.kept, dtype=np.int64)

    @cached_property
    def kept_set(self) -> frozenset[int]:
        return frozenset(self.kept)

    def map_ids(self, ids: Iterable[int]) -> list[int]:
        """Original ids -> diet ids; a dropped id is an error (spell it with :meth:`encode`)."""
        out = []
        for i in ids:
            j = int(self.to_diet[i]) if 0 <= i < self.full_size else -1
            if j < 0:
                raise KeyError(f"token {i} is not in the diet vocabulary")
            out.append(j)
        return out

    def map_kept(self, ids: Iterable[int]) -> list[int]:
        """Original ids -> diet ids, leaving out the ids the diet dropped (suppress lists)."""
        return [int(self.to_diet[i]) for i in ids if 0 <= i < self.full_size
                and self.to_diet[i] >= 0]

    def unmap_ids(self, ids: Iterable[int]) -> list[int]:
        return [self.kept[i] for i in ids]

    def split(self, token: int) -> list[int]:
        """A token spelled with the fewest kept tokens (itself when kept; bytes at worst)."""
        if token in self.kept_set:
            return [token]
        if token in self._splits:
            return self._splits[token]
        if self.token_to_id is None:
            raise ValueError("this DietVocab has no token strings: attach_tokenizer first")
        name = self._id_to_token[token]
        # best[i]: fewest kept pieces spelling name[:i], and the last piece's start.
        best: list[tuple[int, int]] = [(0, 0)] + [(1 << 30, 0)] * len(name)
        for end in range(1, len(name) + 1):
            for begin in range(end):
                piece = self._kept_strings.get(name[begin:end])
                if piece is not None and best[begin][0] + 1 < best[end][0]:
                    best[end] = (best[begin][0] + 1, begin)
        pieces, end = [], len(name)
        while end:
            begin = best[end][1]
            pieces.append(self._kept_strings[name[begin:end]])
            end = begin
        self._splits[token] = pieces[::-1]  # training re-spells the same targets every step
        return self._splits[token]

    @cached_property
    def _splits(self) -> dict[int, list[int]]:
        return {}

    @cached_property
    def _id_to_token(self) -> dict[int, str]:
        return {i: t for t, i in (self.token_to_id or {}).items()}

    @cached_property
    def _kept_strings(self) -> dict[str, int]:
        return {t: i for t, i in (self.token_to_id or {}).items() if i in self.kept_set}

    def encode(self, ids: Iterable[int]) -> list[int]:
        """Re-spell an original token sequence so that every token is kept (same text)."""
        return [piece for token in ids for piece in self.split(token)]

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"full_size": self.full_size, "kept": self.kept}))

    @classmethod
    def load(cls, path: str | Path, tokenizer_json: str | Path | None = None) -> DietVocab:
        data = json.loads(Path(path).read_text())
        vocab = cls(data["kept"], data["full_size"])
        if tokenizer_json is not None:
            vocab.attach_tokenizer(tokenizer_json)
        return vocab

    def attach_tokenizer(self, tokenizer_json: str | Path) -> None:
        """Read the token strings, which say how to spell a dropped token with kept ones."""
        self.token_to_id = json.loads(Path(tokenizer_json).read_text())["model"]["vocab"]


def select_tokens(
    texts: Iterable[str],
    encode: Callable[[str], list[int]],
    keep: int,
    full_size: int,
    always: Iterable[int],
    token_text: Callable[[int], str] | None = None,
) -> list[int]:
    """``always`` plus the corpus's most frequent tokens, ``keep`` ids in all, ascending.

    Ties (and tokens the corpus never uses, when ``keep`` exceeds its coverage) go first to
    tokens written with the corpus's own characters (with ``token_text``, an id's text), then
    to the lower id: BPE ids follow merge order, so a lower id is a more common piece. Whisper's
    vocabulary is multilingual: an English domain's corpus misses common English words
    (" umbrella", " dreaming": ids past 16k), which the alphabet ranks before other scripts.
    """
    always = set(always)
    if keep < len(always):
        raise ValueError(f"--keep {keep} is below the {len(always)} tokens every diet must keep")
    texts = list(texts)
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(encode(" " + text.strip()))
        counts.update(encode(text.strip()))  # a line's first word has no leading space
    alphabet = set("".join(texts)) | {" "}

    def foreign(i: int) -> bool:
        if token_text is None:
            return False
        text = token_text(i)
        return not text or not set(text) <= alphabet

    ranked = sorted(range(full_size), key=lambda i: (-counts[i], foreign(i), i))
    kept = set(always)
    for token in ranked:
        if len(kept) >= keep:
            break
        kept.add(token)
    return sorted(kept)


def whisper_always_kept(tokenizer_json: str | Path, eot: int, full_size: int) -> list[int]:
    """Whisper: the byte-level tokens and every id from end-of-text on (specials, timestamps)."""
    vocab = json.loads(Path(tokenizer_json).read_text())["model"]["vocab"]
    alphabet = byte_level_alphabet()
    return sorted({i for t, i in vocab.items() if t in alphabet} | set(range(eot, full_size)))


def _remap(value, vocab: DietVocab):
    """Original ids inside a config value (int, list, dict of ids) -> diet ids."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return next(iter(vocab.map_kept([value])), value)
    if isinstance(value, list | tuple):
        return type(value)(vocab.map_kept(v for v in value if isinstance(v, int)))
    if isinstance(value, dict):
        return {k: _remap(v, vocab) for k, v in value.items()}
    return value


_ID_FIELDS = ("suppress_tokens", "begin_suppress_tokens", "lang_to_id", "task_to_id")


def _remap_config(config, vocab: DietVocab) -> None:
    for name in list(vars(config)):
        if name.endswith("_token_id") or name.endswith("_token_ids") or name in _ID_FIELDS:
            setattr(config, name, _remap(getattr(config, name), vocab))


def slice_vocab(model: nn.Module, vocab: DietVocab) -> nn.Module:
    """Cut ``model``'s input embedding and output head to the kept ids, in place.

    Special-token ids in the config and generation config are rewritten to diet ids. Tied
    weights stay tied.
    """
    import torch
    from torch import nn

    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    if embed.num_embeddings != vocab.full_size:
        raise ValueError(f"model has {embed.num_embeddings} tokens, the diet map expects "
                         f"{vocab.full_size}")
    tied = head is not None and head.weight is embed.weight
    idx = torch.from_numpy(vocab.kept_ids)
    new_embed = nn.Embedding(len(idx), embed.embedding_dim, padding_idx=None)
    new_embed.weight = nn.Parameter(embed.weight.detach()[idx].clone())
    model.set_input_embeddings(new_embed)
    if head is not None:
        new_head = nn.Linear(head.in_features, len(idx), bias=head.bias is not None)
        new_head.weight = new_embed.weight if tied else nn.Parameter(head.weight.detach()[idx])
        if head.bias is not None:
            new_head.bias = nn.Parameter(head.bias.detach()[idx].clone())
        model.set_output_embeddings(new_head)
    configs = [model.config, model.config.get_text_config()]
    if getattr(model, "generation_config", None) is not None:
        configs.append(model.generation_config)
    for config in {id(c): c for c in configs}.values():
        _remap_config(config, vocab)
        if hasattr(config, "vocab_size"):
            config.vocab_size = len(idx)
    return model


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor,
            temperature: float = 2.0, alpha: float = 0.5,
            teacher_knows: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy on the (diet-spelled) targets plus KL to the teacher, both over the kept
    ids; ``targets`` of -100 are ignored (prompt positions). ``teacher_knows`` (bool, like
    ``targets``) limits the KL to the positions where the teacher's view is the right one: where
    a dropped token was re-spelled in pieces, the teacher wanted the dropped token and has never
    seen the pieces, so only the cross-entropy teaches them."""
    from torch import nn

    mask = targets != -100
    s = student_logits[mask]
    hard = nn.functional.cross_entropy(s, targets[mask])
    soft_at = mask if teacher_knows is None else mask & teacher_knows
    if not soft_at.any():
        return hard
    s, t = student_logits[soft_at], teacher_logits[soft_at]
    soft = nn.functional.kl_div(
        (s / temperature).log_softmax(-1), (t / temperature).log_softmax(-1),
        log_target=True, reduction="batchmean",
    ) * temperature**2
    return (1 - alpha) * hard + alpha * soft
