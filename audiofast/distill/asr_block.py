"""Training the block drafter (:mod:`audiofast.asr.drafters.block`) on the target's hidden states.

Data: the ASR lane's distillation clips (domain sentences spoken by several TTS voices,
encoded, transcribed by the target; no labels), read once more by the fused decoder with
their transcript forced, which gives the exact hidden state the drafter will see at every
position (int8 arithmetic included). A sample is (hidden state at a position, the token the
target chose there, the next ``block`` tokens of its transcript).

Loss: cross-entropy of both passes - the first with the block's earlier tokens unknown, the
second seeing the true token before each position (at inference it sees the first pass's
guesses) - over the kept head ids. Targets the head cannot spell are ignored.

``audiofast distill --stage drafter --kind block`` runs :func:`distill_block_drafter`;
it resumes from its workdir after a kill (cached clips, hidden states, atomic checkpoints).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from audiofast.asr.drafters.block import WEIGHTS_FILE, BlockConfig, linear_names
from audiofast.atomic import staged_directory
from audiofast.distill.asr import (
    Example,
    build_examples,
    domain_tokens,
    examples_cache,
    model_name,
    split_corpus,
)
from audiofast.eval.datasets import domain_corpus
from audiofast.training import TrainOptions, save_atomic, train

# Voices of the block drafter's clips: flite's four and piper's at three speaking rates.
BLOCK_VOICES = ("flite:slt", "flite:kal", "flite:awb", "flite:rms", "piper:joe",
                "piper:joe@rate=0.85", "piper:joe@rate=1.2")


class BlockDraftNet(nn.Module):
    """The block drafter's forward in torch (block.BlockDraftWeights.logits in numpy)."""

    def __init__(self, config: BlockConfig, embed: torch.Tensor, kept_ids: torch.Tensor,
                 dropout: float = 0.0):
        super().__init__()
        self.dropout = nn.Dropout(dropout)  # training only: 800 sentences are memorised
        d, w = config.d_model, config.width
        self.config = config
        self.register_buffer("embed", embed.float().clone(), persistent=False)  # frozen
        self.register_buffer("kept_ids", kept_ids.long().clone())
        self.ln_hidden = nn.LayerNorm(d)
        self.in_hidden = nn.Linear(d, w)
        self.in_token = nn.Linear(d, w, bias=False)
        self.in_prev = nn.Linear(d, w, bias=False)
        self.unknown = nn.Parameter(torch.zeros(d))
        self.positions = nn.Parameter(torch.randn(config.block, w) * 0.02)
        self.mlp = nn.ModuleList(nn.ModuleDict({
            "ln": nn.LayerNorm(w), "fc1": nn.Linear(w, 2 * w), "fc2": nn.Linear(2 * w, w)})
            for _ in range(config.mlp_blocks))
        self.ln_out = nn.LayerNorm(w)
        self.out = nn.Linear(w, d)

    def head(self) -> torch.Tensor:
        return self.embed[self.kept_ids]

    def forward(self, hidden: torch.Tensor, token: torch.Tensor,
                prev: torch.Tensor) -> torch.Tensor:
        """hidden (n, d), token (n,), prev (n, block) ids (-1: unknown) -> (n, block, kept)."""
        prev_embed = torch.where(prev[..., None] >= 0, self.embed[prev.clamp(min=0)],
                                 self.unknown)
        x = (self.in_hidden(self.ln_hidden(hidden)) + self.in_token(self.embed[token]))[:, None]
        x = self.dropout(x + self.in_prev(prev_embed) + self.positions)
        for block in self.mlp:
            x = x + block["fc2"](self.dropout(nn.functional.gelu(block["fc1"](block["ln"](x)),
                                                                 approximate="tanh")))
        return self.out(self.ln_out(x)) @ self.head().T


@dataclass
class BlockSamples:
    hidden: torch.Tensor  # (n, d) the fused decoder's final-norm hidden state at a position
    token: torch.Tensor  # (n,) the token the target chose there
    following: torch.Tensor  # (n, block) the transcript's next tokens (-1 past its end)


def collect_samples(engine, examples: list[Example], block: int, eot: int,
                    desc: str = "hidden states") -> BlockSamples:
    """Every transcript position of ``examples`` as a training sample, read by ``engine``
    (a fused WhisperDecoderEngine) with the transcript forced."""
    hidden, tokens, following = [], [], []
    for example in tqdm(examples, desc=desc):
        engine.set_audio(example.encoded.float().numpy()[None])
        target = example.target  # ends with end-of-text
        fed = example.prompt + target[:-1]
        engine(fed, 0, last=len(target))  # rows from the prompt's last on
        states = engine.last_hidden
        for m, token in enumerate(target):
            if token == eot:
                break
            nxt = target[m + 1 : m + 1 + block]
            hidden.append(states[m])
            tokens.append(token)
            following.append(nxt + [-1] * (block - len(nxt)))
    return BlockSamples(torch.from_numpy(np.stack(hidden)), torch.tensor(tokens),
                        torch.tensor(following))


def preceding(samples: BlockSamples, block_tokens: torch.Tensor) -> torch.Tensor:
    """(n, block) the token before each position: the one the target chose, then
    ``block_tokens`` shifted by one (-1: unknown)."""
    return torch.cat([samples.token[:, None], block_tokens[:, :-1]], 1)


def draft_passes(net: BlockDraftNet, samples: BlockSamples) -> tuple[torch.Tensor, torch.Tensor]:
    """Both passes' logits as at inference: the first with the block's earlier tokens
    unknown, the refined one seeing the first pass's guesses (computed without gradients)."""
    first = net(samples.hidden, samples.token,
                preceding(samples, torch.full_like(samples.following, -1)))
    with torch.no_grad():
        guesses = net.kept_ids[first.argmax(-1)]
        refined = net(samples.hidden, samples.token, preceding(samples, guesses))
    return first, refined


def block_losses(net: BlockDraftNet, samples: BlockSamples, to_kept: torch.Tensor
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """Both passes' cross-entropy (the second seeing the true token before each position),
    and the guesses a full-length draft would get accepted per sample (leading guesses all
    right), refined as at inference and first pass alone."""
    labels = torch.where(samples.following >= 0, to_kept[samples.following.clamp(min=0)], -100)
    first, refined = draft_passes(net, samples)
    second = net(samples.hidden, samples.token, preceding(samples, samples.following))
    ce = nn.functional.cross_entropy
    loss = (ce(first.flatten(0, 1), labels.flatten(), ignore_index=-100)
            + ce(second.flatten(0, 1), labels.flatten(), ignore_index=-100))
    with torch.no_grad():
        right = (net.kept_ids[refined.argmax(-1)] == samples.following).cumprod(1).float()
        right_first = (net.kept_ids[first.argmax(-1)] == samples.following).cumprod(1).float()
    return loss, {"accepted": round(right.sum(1).mean().item(), 4),
                  "accepted_first_pass": round(right_first.sum(1).mean().item(), 4)}


@torch.no_grad()
def confidence_tradeoff(net: BlockDraftNet, samples: BlockSamples,
                        thresholds: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8)
                        ) -> dict[str, dict[str, float]]:
    """Per ``min_prob`` (a draft ends at the first guess the drafter gives less): guesses
    drafted and accepted per draft, as at inference (refined pass). Every drafted guess is a
    verify row; only accepted ones save a step."""
    prob, index = draft_passes(net, samples)[1].softmax(-1).max(-1)
    right = net.kept_ids[index] == samples.following
    report = {}
    for threshold in thresholds:
        drafted = (prob >= threshold).cumprod(1)
        accepted = (drafted * right).cumprod(1)
        report[f"{threshold:.1f}"] = {"drafted": round(drafted.sum(1).float().mean().item(), 4),
                                      "accepted": round(accepted.sum(1).float().mean().item(), 4)}
    return report


def train_block_drafter(net: BlockDraftNet, samples: BlockSamples, to_kept: torch.Tensor,
                        opts: TrainOptions, checkpoint: str | Path,
                        batch_size: int = 256) -> BlockDraftNet:
    def step(_: int, generator: torch.Generator):
        index = torch.randint(len(samples.token), (batch_size,), generator=generator)
        batch = BlockSamples(samples.hidden[index], samples.token[index],
                             samples.following[index])
        return block_losses(net, batch, to_kept)

    return train(net, step, opts, checkpoint, desc="block drafter")


def export_block_drafter(net: BlockDraftNet, out: str | Path) -> Path:
    """The drafter's folder: its config and, per linear, fp32 weights and the int8 kernel's
    packed arrays (so loading it needs neither torch nor packing)."""
    from audiofast.asr.int8_pack import int8_linear_tensors

    arrays: dict[str, np.ndarray] = {"kept_ids": net.kept_ids.numpy().astype(np.int64)}
    modules = {name: net.get_submodule(name) for name in linear_names(net.config) if
               name != "head"}
    with torch.no_grad():
        for name, module in [*modules.items(), ("head", None)]:
            weight = net.head() if module is None else module.weight
            bias = None if module is None else module.bias
            arrays[f"{name}.weight"] = weight.numpy()
            if bias is not None:
                arrays[f"{name}.bias"] = bias.numpy()
            for k, t in enumerate(int8_linear_tensors(weight, bias)):
                arrays[f"{name}.q{k}"] = t.numpy()
        for name in ["ln_hidden", "ln_out", *(f"mlp.{i}.ln" for i in range(len(net.mlp)))]:
            norm = net.get_submodule(name)
            arrays[f"{name}.weight"], arrays[f"{name}.bias"] = (norm.weight.numpy(),
                                                                norm.bias.numpy())
        arrays["unknown"] = net.unknown.numpy()
        arrays["positions"] = net.positions.numpy()
    out = Path(out)
    with staged_directory(out) as staging:  # a kill never leaves half a drafter at out
        np.savez(staging / WEIGHTS_FILE, **{k: np.ascontiguousarray(v, dtype=v.dtype)
                                            for k, v in arrays.items()})
        net.config.save(staging)
    return out


@dataclass(frozen=True)
class BlockDrafterRecipe:
    train_sentences: int = 2400  # ~600 clips: 800 were memorised (held-out 0.47 vs 1.54)
    steps: int = 3000
    batch_size: int = 128
    lr: float = 1e-3
    dropout: float = 0.1
    width: int = 512
    block: int = 4
    mlp_blocks: int = 1
    head_keep: int = 8000
    heldout_sentences: int = 60  # spoken apart from training, for the acceptance report


def distill_block_drafter(model: str, recipe: BlockDrafterRecipe, workdir: str | Path,
                          out: str | Path | None = None, threads: int = 0) -> Path:
    """Train a block drafter for ``model`` (on its fused int8 decoder) and export it."""
    from audiofast.asr.fast_runtime import FastWhisper

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    target = FastWhisper(model, threads=threads, precision="int8", encoder="ct2")
    if threads:
        torch.set_num_threads(threads)
    teacher_rt, tok = target.ct2, target.tokenizer
    sentences, held_out = split_corpus(domain_corpus())
    sentences = sentences[: recipe.train_sentences]
    cache = examples_cache(workdir, teacher_rt, recipe.train_sentences)
    examples = build_examples(teacher_rt, sentences,
                              cache=cache.with_name(cache.stem + "-block.pt"),
                              voices=BLOCK_VOICES)
    name = f"{model_name(teacher_rt)}-block{recipe.block}"
    # Hidden states and checkpoint are this corpus's: another --sentences starts over.
    samples_file = workdir / f"{name}-{recipe.train_sentences}-samples.pt"
    if samples_file.is_file():
        samples = BlockSamples(**torch.load(samples_file))
    else:
        samples = collect_samples(target.engine, examples, recipe.block, tok.eot)
        save_atomic(vars(samples), samples_file)
    embed = torch.from_numpy(np.asarray(target.engine.embed))
    kept = torch.tensor(domain_tokens(teacher_rt, sentences, recipe.head_keep, embed.shape[0]))
    to_kept = torch.full((embed.shape[0],), -100, dtype=torch.long)
    to_kept[kept] = torch.arange(len(kept))
    config = BlockConfig(embed.shape[1], recipe.width, recipe.block, recipe.mlp_blocks,
                         special_from=tok.eot, timestamps_from=tok.timestamp_begin)
    net = BlockDraftNet(config, embed, kept, recipe.dropout)
    opts = TrainOptions(steps=recipe.steps, lr=recipe.lr, warmup=max(1, recipe.steps // 20),
                        checkpoint_every=100)
    net = train_block_drafter(net, samples, to_kept, opts,
                              workdir / f"{name}-{recipe.train_sentences}.ckpt", recipe.batch_size)
    out = export_block_drafter(net, out or workdir / name)
    # Guesses accepted per draft on held-out sentences vs training ones: memorising shows.
    held = build_examples(teacher_rt, held_out[: recipe.heldout_sentences],
                          cache=workdir / f"examples-{model_name(teacher_rt)}-heldout-block.pt",
                          voices=BLOCK_VOICES)
    report = {}
    for split, data in (("train", samples), ("held_out", collect_samples(
            target.engine, held, recipe.block, tok.eot, desc="held-out hidden states"))):
        with torch.no_grad():
            report[split] = block_losses(net, data, to_kept)[1] | {"samples": len(data.token)}
        report[split]["by_min_prob"] = confidence_tradeoff(net, data)
    (out / "eval.json").write_text(json.dumps(report, indent=1))
    return out

