"""Whisper's audio encoder on OpenVINO: the same weights, compiled for this CPU.

Measured on this 2-core AVX2 CPU (whisper-base, one 30 s window): OpenVINO in fp32 ran the
encoder faster than CTranslate2 in int8, and its output is the fp32 model's, not an int8
approximation (NNCF int8 on top was no faster on AVX2 and changed words, so it is not used).
The encoder is half of a transcription's time, so it is worth a second runtime.

The model is exported once per CTranslate2 model (CT2 -> PyTorch -> OpenVINO IR, ~15 s) into
the cache, with a dynamic batch and frame count so short padded windows run at their length.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from audiofast.cache import cache_dir

log = logging.getLogger(__name__)

IR_NAME = "encoder.xml"


class _EncoderForExport(nn.Module):
    """HF's WhisperEncoder arithmetic without its fixed-30-s input check: positions are cut
    to the window's length, as CTranslate2 does for short windows."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        enc = self.encoder
        x = nn.functional.gelu(enc.conv1(mel))
        x = nn.functional.gelu(enc.conv2(x)).transpose(1, 2)
        x = x + enc.embed_positions.weight[: x.shape[1]]
        for layer in enc.layers:
            x = layer(x, attention_mask=None)
            x = x[0] if isinstance(x, tuple) else x
        return enc.layer_norm(x)


def export_encoder(ct2_dir: Path, out_dir: Path) -> Path:
    """Write the OpenVINO IR of the CTranslate2 model's encoder to ``out_dir`` (atomically)."""
    import openvino as ov

    from audiofast.models.ct2_to_hf import whisper_from_ct2

    log.info("audiofast: exporting %s's encoder to OpenVINO (once, ~20 s)", ct2_dir.name)
    hf_model, _ = whisper_from_ct2(ct2_dir)
    module = _EncoderForExport(hf_model.model.encoder).eval()
    n_mels = hf_model.config.num_mel_bins
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ir = ov.convert_model(module, example_input=torch.zeros(1, n_mels, 3000),
                              input=[ov.PartialShape([-1, n_mels, -1])])
    ov.save_model(ir, tmp / IR_NAME, compress_to_fp16=False)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir / IR_NAME


class OpenVINOEncoder:
    """``encoder(mel (batch, n_mels, frames)) -> (batch, frames // 2, d_model)`` float32."""

    def __init__(self, ct2_dir: str | Path, threads: int = 0):
        import openvino as ov

        ct2_dir = Path(ct2_dir)
        weights = (ct2_dir / "model.bin").resolve()
        stat = weights.stat()
        key = hashlib.sha256(f"{weights}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        folder = cache_dir() / "openvino" / key.hexdigest()[:16]
        self.path = folder / IR_NAME
        if not self.path.is_file():
            export_encoder(ct2_dir, folder)
        # fp32 said explicitly: on a CPU with AVX-512 BF16 OpenVINO otherwise runs in bf16
        # (measured: mean |error| vs the PyTorch encoder 1e-5 -> 0.014, max 8.2).
        config = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            config["INFERENCE_NUM_THREADS"] = threads
        self.model = ov.Core().compile_model(str(self.path), "CPU", config)

    def __call__(self, mel: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(self.model(np.ascontiguousarray(mel, dtype=np.float32))[0])
