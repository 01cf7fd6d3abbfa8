"""A small draft decoder: a 2-layer Whisper decoder that reads the target's encoder output.

Built from the target itself (its embedding, positions, final norm and two of its layers,
first and last), then distilled on the target's own greedy transcripts and logits
(``audiofast distill --stage drafter``). Because it is a Whisper decoder with fewer layers,
it is saved as an ordinary Hugging Face Whisper checkpoint and runs on the same
:class:`WhisperDecoderEngine` as the target; drafting k tokens costs k small steps, and the
target verifies them all in one pass.

The drafter's output head is cut to the domain's frequent tokens (``head_ids.json`` beside the
checkpoint, a vocab diet without recovery): the full 51865-row head was a third of a draft
step, and a rare token the cut head cannot propose only ends that draft early.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import WhisperConfig, WhisperForConditionalGeneration

from audiofast.asr.engine import Precision, WhisperDecoderEngine


def draft_from_target(target: WhisperForConditionalGeneration,
                      layers: tuple[int, ...] = (0, -1)) -> WhisperForConditionalGeneration:
    """A Whisper with the target's decoder cut to ``layers`` and no encoder layers (the draft
    reads the target's encoder output, so its own encoder is never run)."""
    config: WhisperConfig = copy.deepcopy(target.config)
    config.decoder_layers = len(layers)
    config.encoder_layers = 0
    draft = WhisperForConditionalGeneration(config)
    draft.model.decoder.embed_tokens.weight.data.copy_(target.model.decoder.embed_tokens.weight)
    draft.model.decoder.embed_positions.weight.data.copy_(
        target.model.decoder.embed_positions.weight)
    draft.model.decoder.layer_norm.load_state_dict(target.model.decoder.layer_norm.state_dict())
    for mine, index in zip(draft.model.decoder.layers, layers, strict=True):
        mine.load_state_dict(target.model.decoder.layers[index].state_dict())
    draft.tie_weights()
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


HEAD_IDS_FILE = "head_ids.json"


def save_head_ids(folder: str | Path, ids: list[int]) -> None:
    (Path(folder) / HEAD_IDS_FILE).write_text(json.dumps(sorted(ids)))


class ModelDrafter:
    """Greedy drafts from a small decoder, keeping its KV cache across calls: only the tokens
    that changed since the last call (the verified ones) are fed again."""

    def __init__(self, draft: WhisperForConditionalGeneration | str | Path,
                 precision: Precision = "int8", max_draft: int = 6, special_from: int = 50257,
                 timestamps_from: int | None = None):
        head_ids = None
        if not isinstance(draft, nn.Module):
            ids_file = Path(draft) / HEAD_IDS_FILE
            if ids_file.is_file():
                head_ids = torch.tensor(json.loads(ids_file.read_text()))
            draft = WhisperForConditionalGeneration.from_pretrained(draft)
        self.engine = WhisperDecoderEngine(draft, precision, head_ids=head_ids)
        self.head_ids = head_ids
        self.special_from = special_from  # drafts stop before special tokens ...
        self.timestamps_from = timestamps_from  # ... except timestamps, when given
        self.max_draft = max_draft
        self.draft_len = 4
        self.fed: list[int] = []  # tokens whose keys/values are in the draft's cache

    def set_audio(self, encoded: np.ndarray) -> None:
        self.engine.set_audio(encoded)
        self.fed = []

    def propose(self, context: list[int]) -> list[int]:
        same = 0
        for a, b in zip(self.fed, context, strict=False):
            if a != b:
                break
            same += 1
        same = min(same, len(context) - 1)  # always feed at least the last token
        logits = self.engine(context[same:], same, last=1)[0]
        self.fed = list(context)
        draft: list[int] = []
        while len(draft) < self.draft_len:
            token = int(logits.argmax())
            if self.head_ids is not None:
                token = int(self.head_ids[token])
            if not self._draftable(token) or len(self.fed) + 1 >= self.engine.n_ctx:
                break
            draft.append(token)
            if len(draft) == self.draft_len:
                break
            logits = self.engine([token], len(self.fed))[0]
            self.fed.append(token)
        return draft

    def _draftable(self, token: int) -> bool:
        return token < self.special_from or (
            self.timestamps_from is not None and token >= self.timestamps_from)

    def feedback(self, drafted: int, accepted: int) -> None:
        """Draft longer after a full accept, shorter after an early miss."""
        if drafted and accepted == drafted:
            self.draft_len = min(self.max_draft, self.draft_len + 1)
        elif drafted:
            self.draft_len = max(2, accepted + 1)
