"""Whisper's byte-level BPE plus the special tokens that steer decoding.

Special ids differ between English-only (51864 tokens) and multilingual (51865+) vocabularies,
so they are looked up by name in ``tokenizer.json`` rather than hard-coded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

TIME_PER_TIMESTAMP = 0.02  # seconds between consecutive timestamp tokens
PROMPT_HISTORY_TOKENS = 223  # Whisper keeps at most n_text_ctx // 2 - 1 previous tokens


@dataclass
class WhisperTokenizer:
    tokenizer: Tokenizer
    multilingual: bool

    @classmethod
    def from_dir(cls, model_dir: str | Path, multilingual: bool) -> WhisperTokenizer:
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json beside the model")
        return cls(Tokenizer.from_file(str(path)), multilingual)

    def special(self, token: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise KeyError(f"tokenizer has no special token {token}")
        return token_id

    @cached_property
    def eot(self) -> int:
        return self.special("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self.special("<|startoftranscript|>")

    @cached_property
    def sot_prev(self) -> int:
        return self.special("<|startofprev|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self.special("<|notimestamps|>")

    @cached_property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1

    @cached_property
    def no_speech(self) -> int:
        for name in ("<|nospeech|>", "<|nocaptions|>"):
            if self.tokenizer.token_to_id(name) is not None:
                return self.tokenizer.token_to_id(name)
        raise KeyError("tokenizer has no no-speech token")

    def task_token(self, task: str) -> int:
        if task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {task!r}")
        return self.special(f"<|{task}|>")

    @cached_property
    def languages(self) -> frozenset[str]:
        """Language codes the model knows (just English for ``.en`` models)."""
        if not self.multilingual:
            return frozenset({"en"})
        last = self.special("<|translate|>")
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        return frozenset(t[2:-2] for t, i in vocab.items() if self.sot < i < last)

    def language_token(self, language: str) -> int:
        token_id = self.tokenizer.token_to_id(f"<|{language}|>")
        if token_id is None or not self.multilingual:
            raise ValueError(f"language {language!r} is not supported by this model")
        return token_id

    def sot_sequence(self, language: str | None, task: str, timestamps: bool) -> list[int]:
        """``<|startoftranscript|> [<|lang|> <|task|>] [<|notimestamps|>]``."""
        tokens = [self.sot]
        if self.multilingual:
            tokens += [self.language_token(language or "en"), self.task_token(task)]
        if not timestamps:
            tokens.append(self.no_timestamps)
        return tokens

    def prompt(
        self, previous: list[int], language: str | None, task: str, timestamps: bool
    ) -> list[int]:
        """Decoder prompt: recent transcript after ``<|startofprev|>``, then the SOT sequence."""
        head = [self.sot_prev, *previous[-PROMPT_HISTORY_TOKENS:]] if previous else []
        return head + self.sot_sequence(language, task, timestamps)

    def suppressed_tokens(self, requested: tuple[int, ...], model_defaults: list[int]) -> list[int]:
        """Token ids never to generate: -1 expands to the model's list, and the task/control
        tokens are always added (as openai-whisper does; CTranslate2 alone would not)."""
        ids = set(requested)
        if -1 in ids:
            ids.discard(-1)
            ids.update(model_defaults)
        controls = ("<|transcribe|>", "<|translate|>", "<|startoftranscript|>",
                    "<|startofprev|>", "<|startoflm|>")
        ids.update(i for t in controls if (i := self.tokenizer.token_to_id(t)) is not None)
        ids.add(self.no_speech)
        return sorted(ids)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: list[int]) -> str:
        """Text of the ordinary tokens (specials and timestamps dropped)."""
        return self.tokenizer.decode([t for t in tokens if t < self.eot])
