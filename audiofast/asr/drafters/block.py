"""A block drafter: one small pass proposes the next ``block`` tokens at once.

The target's last hidden state (the final-norm row its head just read, ``engine.last_hidden``)
already holds what the decoder knows about the audio and the text so far. The drafter maps it,
with the token just chosen, to ``block`` guesses in parallel - one row per position, a learned
position vector each - through a small residual MLP and the target's own frozen embedding as
its output head (Whisper ties the two), cut to the domain's frequent tokens. A second pass
refines the block Markov-style: each position also sees the token the first pass guessed
before it. Two passes of a few rows cost about what one row of a small model does, instead
of one pass per drafted token (the 2-layer drafter, :mod:`audiofast.asr.drafters.model`).

Trained by ``audiofast distill --stage drafter --kind block`` (:mod:`audiofast.distill.asr_block`)
on the fused decoder's own hidden states over the target's transcripts of domain audio. The
target verifies every draft (``decoding.GreedySearch``), so output equals plain greedy.

Here the forward runs in numpy (fp32), or with the int8 kernel's packed linears (the default:
the weights and head are a quarter of the bytes); :class:`BlockDraftNet` in the distill
module is the same function in torch (a test holds them together).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

WEIGHTS_FILE = "block_drafter.npz"
CONFIG_FILE = "block_drafter.json"
LINEARS = ("in_hidden", "in_token", "in_prev", "out")  # + mlp.{i}.fc1 / fc2, the head


@dataclass(frozen=True)
class BlockConfig:
    d_model: int  # the target's width
    width: int = 512  # the drafter's
    block: int = 4  # tokens proposed per pass
    mlp_blocks: int = 1
    special_from: int = 50257  # end-of-text and later: never drafted ...
    timestamps_from: int | None = None  # ... except timestamps, when given

    @classmethod
    def load(cls, folder: str | Path) -> BlockConfig:
        return cls(**json.loads((Path(folder) / CONFIG_FILE).read_text()))

    def save(self, folder: str | Path) -> None:
        (Path(folder) / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=1))


def linear_names(config: BlockConfig) -> list[str]:
    mlp = [f"mlp.{i}.{fc}" for i in range(config.mlp_blocks) for fc in ("fc1", "fc2")]
    return [*LINEARS, *mlp, "head"]


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh form (torch's ``approximate="tanh"``)."""
    return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * (x * x * x))))


class BlockDraftWeights:
    """A trained block drafter's arrays (``WEIGHTS_FILE``): fp32 weights, and each linear
    packed for the int8 kernel when ``int8``. Loaded once, shared by every sequence's
    :class:`BlockDrafter`."""

    def __init__(self, folder: str | Path, int8: bool = True):
        folder = Path(folder)
        if not (folder / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(f"{folder} holds no block drafter ({WEIGHTS_FILE}); train "
                                    "one: audiofast distill --stage drafter --kind block")
        try:
            self.config = BlockConfig.load(folder)
            with np.load(folder / WEIGHTS_FILE) as data:
                self.arrays = {k: np.ascontiguousarray(data[k]) for k in data.files}
            self.kept_ids = self.arrays["kept_ids"]
            missing = [n for n in linear_names(self.config) if f"{n}.weight" not in self.arrays]
            if missing:
                raise KeyError(f"no {missing[0]} weights")
        except (OSError, ValueError, TypeError, KeyError, zipfile.BadZipFile) as err:
            raise ValueError(f"{folder}: not a complete block drafter export "
                             f"({type(err).__name__}: {err}); train it again") from None
        self.int8 = int8
        if int8:
            from audiofast.asr import kernels

            if kernels.backend() != "avx2":
                raise RuntimeError("the int8 block drafter needs the C++ kernels; pass "
                                   "int8=False for numpy fp32")
            # The C arrays built once (they borrow self.arrays): a call is then one ctypes hop.
            self.packed = {name: kernels.as_arrays([self.arrays[f"{name}.q{k}"]
                                                    for k in range(4)])
                           for name in linear_names(self.config)}

    def linear(self, name: str, x: np.ndarray) -> np.ndarray:
        if self.int8:
            from audiofast.asr import kernels

            return kernels.quant_linear(x, self.packed[name])
        y = x @ self.arrays[f"{name}.weight"].T
        bias = self.arrays.get(f"{name}.bias")
        return y if bias is None else y + bias

    def norm(self, name: str, x: np.ndarray) -> np.ndarray:
        return layer_norm(x, self.arrays[f"{name}.weight"], self.arrays[f"{name}.bias"])

    def context(self, hidden: np.ndarray, token_embedding: np.ndarray) -> np.ndarray:
        """(1, width): what every position of the block starts from - the target's ``hidden``
        state (d,) and the embedding of the token it just chose."""
        return (self.linear("in_hidden", self.norm("ln_hidden", hidden[None]))
                + self.linear("in_token", token_embedding[None]))

    def logits(self, context: np.ndarray, prev_embeddings: np.ndarray) -> np.ndarray:
        """(block, kept) logits: row i guesses the token ``i + 1`` places after the one just
        chosen, from the :meth:`context` and the embedding of the token before it
        (``prev_embeddings`` (block, d)); the head's rows are ``kept_ids``."""
        x = context + self.linear("in_prev", prev_embeddings) + self.arrays["positions"]
        for i in range(self.config.mlp_blocks):
            inner = gelu(self.linear(f"mlp.{i}.fc1", self.norm(f"mlp.{i}.ln", x)))
            x = x + self.linear(f"mlp.{i}.fc2", inner)
        return self.linear("head", self.linear("out", self.norm("ln_out", x)))


class BlockDrafter:
    """One sequence's drafts: the target's hidden state arrives through :meth:`observe`
    (decoding.GreedySearch calls it before every :meth:`propose`)."""

    def __init__(self, weights: BlockDraftWeights, embed: np.ndarray, refine: bool = True,
                 min_prob: float = 0.0):
        """``embed``: the target's token embedding (numpy, (vocab, d)); ``min_prob``: a
        draft ends at the first guess the drafter gives less probability (each drafted
        guess is a verify row, paid whether it is accepted or not)."""
        self.weights, self.config = weights, weights.config
        self.embed = embed
        self.refine = refine
        self.min_prob = min_prob
        self.draft_len = self.config.block
        self.hidden: np.ndarray | None = None
        self._unknown = np.broadcast_to(weights.arrays["unknown"],
                                        (self.config.block - 1, self.config.d_model))

    def observe(self, hidden: np.ndarray | None) -> None:
        if hidden is None:
            raise RuntimeError("the block drafter reads the target's hidden states: decode on "
                               "the fused decoder (--precision int8 or int4)")
        self.hidden = np.asarray(hidden, np.float32)

    def _guess(self, context: np.ndarray, token: int, previous: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Each position's best guess (full-vocabulary ids) and its probability."""
        prev = np.concatenate([self.embed[token][None], previous]).astype(np.float32)
        logits = self.weights.logits(context, prev)
        best = logits.argmax(-1)
        top = logits[np.arange(len(best)), best]
        prob = 1.0 / np.exp(logits - top[:, None]).sum(-1)
        return self.weights.kept_ids[best], prob

    def propose(self, context: list[int]) -> list[int]:
        if self.hidden is None or self.draft_len == 0:
            return []
        token = context[-1]
        start = self.weights.context(self.hidden, self.embed[token])
        guess, prob = self._guess(start, token, self._unknown)
        if self.refine:  # each position again, now seeing the guess before it
            guess, prob = self._guess(start, token, self.embed[guess[:-1]])
        draft = []
        for t, p in zip(guess[: self.draft_len].tolist(), prob.tolist(), strict=False):
            if not self._draftable(t) or p < self.min_prob:
                break
            draft.append(t)
        return draft

    def _draftable(self, token: int) -> bool:
        return token < self.config.special_from or (
            self.config.timestamps_from is not None and token >= self.config.timestamps_from)

    def feedback(self, drafted: int, accepted: int) -> None:
        """A rejected guess costs a verify row: after a miss draft one more than was
        accepted; after a full accept, the whole block again."""
        if drafted and accepted == drafted:
            self.draft_len = self.config.block
        elif drafted:
            self.draft_len = max(1, accepted + 1)
