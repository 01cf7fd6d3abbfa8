"""CTranslate2 Whisper -> Hugging Face ``WhisperForConditionalGeneration`` (+ processor).

The weight renaming lives in :mod:`audiofast.models.ct2_whisper_weights`; this module adds
the config, generation config and processor transformers needs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperProcessor,
    WhisperTokenizer,
)

from audiofast.models.ct2_reader import CT2FormatError, CT2Model, read_ct2_model
from audiofast.models.ct2_whisper_weights import layer_count, whisper_state_dict


def _whisper_config(ct2: CT2Model, tokenizer: WhisperTokenizer, ct2_config: dict) -> WhisperConfig:
    vocab_size, d_model = ct2["decoder/embeddings/weight"].shape
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=ct2["encoder/conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=layer_count(ct2, "encoder"),
        decoder_layers=layer_count(ct2, "decoder"),
        encoder_attention_heads=ct2.scalar("encoder/num_heads"),
        decoder_attention_heads=ct2.scalar("decoder/num_heads"),
        encoder_ffn_dim=ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=ct2["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2["decoder/position_encodings/encodings"].shape[0],
        decoder_start_token_id=tokenizer.convert_tokens_to_ids("<|startoftranscript|>"),
        # A vocab-diet folder's embedding is smaller than the original ids its tokenizer
        # speaks: no padding id then (the OpenVINO export reads only its encoder).
        bos_token_id=eot, eos_token_id=eot, pad_token_id=eot if eot < vocab_size else None,
        tie_word_embeddings=True,
    )


def _generation_config(config: WhisperConfig, tokenizer: WhisperTokenizer,
                       ct2_config: dict) -> GenerationConfig:
    """What ``model.generate`` needs for Whisper's prompt, timestamps and suppression rules."""
    ids = tokenizer.convert_tokens_to_ids
    multilingual = config.vocab_size >= 51865
    lang_to_id = {tokenizer.convert_ids_to_tokens(i): i for i in ct2_config.get("lang_ids", [])}
    no_timestamps = ids("<|notimestamps|>")
    return GenerationConfig(
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.max_target_positions,
        suppress_tokens=ct2_config.get("suppress_ids", []),
        begin_suppress_tokens=ct2_config.get("suppress_ids_begin", [220, config.eos_token_id]),
        no_timestamps_token_id=no_timestamps,
        prev_sot_token_id=ids("<|startofprev|>"),
        max_initial_timestamp_index=50,
        is_multilingual=multilingual,
        lang_to_id=lang_to_id,
        task_to_id={"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")}
        if multilingual else {},
        alignment_heads=ct2_config.get("alignment_heads"),
        return_timestamps=False,
    )


def whisper_from_ct2(
    ct2_dir: str | Path,
) -> tuple[WhisperForConditionalGeneration, WhisperProcessor]:
    """Build the PyTorch Whisper (fp32, eval mode) and its processor from a CT2 directory."""
    ct2_dir = Path(ct2_dir)
    ct2 = read_ct2_model(ct2_dir)
    if ct2.spec != "WhisperSpec":
        raise CT2FormatError(f"{ct2_dir}: a {ct2.spec} model, not Whisper")
    config_path = ct2_dir / "config.json"
    ct2_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    tokenizer = WhisperTokenizer(tokenizer_file=str(ct2_dir / "tokenizer.json"))
    config = _whisper_config(ct2, tokenizer, ct2_config)
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    state = whisper_state_dict(ct2)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if k != "proj_out.weight"]  # tied to embed_tokens
    if missing or unexpected:
        raise CT2FormatError(f"{ct2_dir}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    model.generation_config = _generation_config(config, tokenizer, ct2_config)
    processor = WhisperProcessor(
        feature_extractor=WhisperFeatureExtractor(feature_size=config.num_mel_bins),
        tokenizer=tokenizer,
    )
    return model.eval(), processor


def save_hf(ct2_dir: str | Path, out_dir: str | Path) -> Path:
    """Convert and write a Hugging Face directory (safetensors + processor files)."""
    model, processor = whisper_from_ct2(ct2_dir)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir)
    processor.save_pretrained(out_dir)
    return out_dir
