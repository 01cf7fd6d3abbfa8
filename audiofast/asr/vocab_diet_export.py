"""Export a vocab-diet Whisper: a CTranslate2 model with the remapped vocabulary (the folder
itself, so ``--model DIR`` and ``resolve_model`` take it as is) and the Hugging Face
checkpoint in ``DIR/hf``, both with ``vocab_map.json`` (diet id -> original id) and the
original ``tokenizer.json``, which keeps decoding text in original ids.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from ctranslate2.converters.transformers import WhisperLoader

from audiofast.asr.vocab_diet import VOCAB_MAP_FILE, DietVocab
from audiofast.atomic import staged_directory


def diet_token_strings(tokenizer_json: Path, vocab: DietVocab, timestamp_begin: int) -> list[str]:
    """The kept tokens' strings in diet-id order, as CTranslate2's vocabulary wants them
    (specials by name, timestamps as ``<|1.23|>``, which is how CT2 finds them)."""
    data = json.loads(tokenizer_json.read_text())
    names = {i: t for t, i in data["model"]["vocab"].items()}
    names.update({t["id"]: t["content"] for t in data["added_tokens"]})
    return [
        f"<|{(i - timestamp_begin) * 0.02:.2f}|>" if i >= timestamp_begin else names[i]
        for i in vocab.kept
    ]


class _DietWhisperLoader(WhisperLoader):
    def __init__(self, tokens: list[str]):
        super().__init__()
        self.tokens = tokens

    def get_vocabulary(self, model, tokenizer):
        return list(self.tokens)


def whisper_spec(model, tokens: list[str], quantization: str):
    """A Hugging Face Whisper as a validated CTranslate2 spec with ``tokens`` as its
    vocabulary, weights in ``quantization``; ``model`` is left untouched (the spec holds the
    tensors it is given and quantizes them in place, so it gets a copy)."""
    spec = _DietWhisperLoader(tokens)(copy.deepcopy(model), None)
    spec.validate()
    spec.optimize(quantization=quantization)
    return spec


def export_diet_whisper(student, vocab: DietVocab, source_dir: str | Path, out_dir: str | Path,
                        timestamp_begin: int, quantization: str = "int8") -> Path:
    """Write ``out_dir`` (CT2, ``quantization`` weights) and ``out_dir/hf``; atomic: a
    half-written export never replaces a finished one."""
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    tokenizer_json = source_dir / "tokenizer.json"
    with staged_directory(out_dir) as staging:
        student.save_pretrained(staging / "hf")
        tokens = diet_token_strings(tokenizer_json, vocab, timestamp_begin)
        whisper_spec(student, tokens, quantization).save(str(staging))
        for folder in (staging, staging / "hf"):
            vocab.save(folder / VOCAB_MAP_FILE)
            shutil.copy(tokenizer_json, folder / "tokenizer.json")
        config = json.loads((staging / "config.json").read_text())
        source_config = source_dir / "config.json"
        if source_config.is_file():  # suppress lists in diet ids (the runtime maps them back)
            original = json.loads(source_config.read_text())
            for key in ("suppress_ids", "suppress_ids_begin"):
                if key in original:
                    config[key] = vocab.map_kept(original[key])
        (staging / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir
