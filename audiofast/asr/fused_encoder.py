"""Whisper's audio encoder on audiofast's C++ kernels: int8 linears, float32 attention.

The encoder is about half of a transcription once the decoder is fused (1.7 of 3.0 s on the
four real clips). Here every layer's linears (Q/K/V, output, both feed-forward layers) are the
decoder's int8 kernel (kernels/int8_linear.cpp): CTranslate2's weights quantized again as the
decoder's are (int8_pack.py: one scale per output channel), each frame's activations over that
frame's own range.
Norms, GELU and attention (float32) run in the same C++ op (kernels/encoder_forward.cpp) on
the same thread pool: with torch doing the attention between our linears the two runtimes'
threads fought over the two cores. The two convolutions are float32 matrix products over each
output frame's 3-frame input window (numpy's BLAS on one thread). No torch at run time (only
to pack the weights once into the cache). With AVX-512 VNNI it beats CTranslate2 on 30 s
windows; on the AVX2 path it does not (ct2_runtime.FUSED_MIN_FRAMES says where "auto" uses it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from audiofast.asr import kernels
from audiofast.asr.blas import one_blas_thread
from audiofast.asr.packed_cache import load_or_pack

# A layer's arrays in kernels/encoder_forward.cpp's order: a norm is (weight, bias), a linear
# the int8 kernel's four arrays.
LAYER_PARTS = ("attn_ln", "qkv", "out", "ffn_ln", "fc1", "fc2")
NORMS = ("attn_ln", "ffn_ln")


def conv_windows(x: np.ndarray, stride: int) -> np.ndarray:
    """(batch, frames, channels) -> (batch x out_frames, channels x 3): each output frame's
    three input frames (zero-padded by one at each end), channels outer as in the weight's
    (out, in, 3) layout."""
    batch, frames, channels = x.shape
    padded = np.pad(x, ((0, 0), (1, 1), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, 3, axis=1)[:, ::stride]
    return windows.reshape(-1, channels * 3)


def encoder_tensors(ct2_dir: Path) -> dict[str, np.ndarray]:
    """The encoder of a CTranslate2 Whisper folder as named arrays: the convolutions as float
    (in x 3, out) matrices, positions and norms, and each layer's linears packed for the
    int8 kernel."""
    import torch

    from audiofast.asr.int8_pack import int8_linear_tensors
    from audiofast.models.ct2_reader import read_ct2_model
    from audiofast.models.ct2_whisper_weights import encoder_state

    ct2 = read_ct2_model(ct2_dir / "model.bin")
    sd = {k.removeprefix("model.encoder."): v for k, v in encoder_state(ct2).items()}
    out = {name: np.ascontiguousarray(sd[name], dtype=np.float32) for name in (
        "embed_positions.weight", "layer_norm.weight", "layer_norm.bias")}
    out["num_heads"] = np.array([ct2.scalar("encoder/num_heads")], np.int64)
    for conv in ("conv1", "conv2"):  # (out, in, 3) -> (in x 3 window columns, out), float
        weight = np.asarray(sd[f"{conv}.weight"], np.float32)
        out[f"{conv}.weight"] = np.ascontiguousarray(weight.reshape(weight.shape[0], -1).T)
        out[f"{conv}.bias"] = np.asarray(sd[f"{conv}.bias"], np.float32)
    layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    for i in range(layers):
        p = f"layers.{i}"
        q, k, v = (sd[f"{p}.self_attn.{n}_proj.weight"] for n in "qkv")
        zero = np.zeros(k.shape[0], np.float32)
        qkv_bias = np.concatenate([sd[f"{p}.self_attn.q_proj.bias"], zero,
                                   sd[f"{p}.self_attn.v_proj.bias"]])
        parts = {"qkv": (np.concatenate([q, k, v]), qkv_bias),
                 "out": (sd[f"{p}.self_attn.out_proj.weight"], sd[f"{p}.self_attn.out_proj.bias"]),
                 "fc1": (sd[f"{p}.fc1.weight"], sd[f"{p}.fc1.bias"]),
                 "fc2": (sd[f"{p}.fc2.weight"], sd[f"{p}.fc2.bias"])}
        for name, (weight, bias) in parts.items():
            packed = int8_linear_tensors(torch.from_numpy(np.asarray(weight, np.float32)),
                                         torch.from_numpy(np.asarray(bias, np.float32)))
            for j, t in enumerate(packed):
                out[f"{p}.{name}.{j}"] = t.numpy()
        for name, hf in (("attn_ln", "self_attn_layer_norm"), ("ffn_ln", "final_layer_norm")):
            out[f"{p}.{name}.weight"] = np.asarray(sd[f"{p}.{hf}.weight"], np.float32)
            out[f"{p}.{name}.bias"] = np.asarray(sd[f"{p}.{hf}.bias"], np.float32)
    return out


class FusedEncoder:
    """``encoder(mel (batch, n_mels, frames)) -> (batch, frames // 2, d_model)`` float32."""

    def __init__(self, ct2_dir: str | Path):
        ct2_dir = Path(ct2_dir)
        if kernels.backend() == "none":
            raise RuntimeError("the fused encoder needs audiofast's C++ kernels, which are not "
                               "built here (see the warning above): use --encoder ct2")
        arrays = load_or_pack(ct2_dir / "model.bin", None, lambda: encoder_tensors(ct2_dir),
                              precision="encoder-int8")
        self.n_heads = int(arrays["num_heads"][0])
        self.convs = [(arrays[f"{c}.weight"], arrays[f"{c}.bias"]) for c in ("conv1", "conv2")]
        self.positions = arrays["embed_positions.weight"]
        n_layers = 1 + max(int(k.split(".")[1]) for k in arrays if k.startswith("layers."))
        order = ["layer_norm.weight", "layer_norm.bias"]
        for i in range(n_layers):
            for part in LAYER_PARTS:
                order += [f"layers.{i}.{part}.{j}" for j in
                          (("weight", "bias") if part in NORMS else range(4))]
        self._arrays = [arrays[name] for name in order]  # kept alive: params points into them
        self.params = kernels.as_arrays(self._arrays)

    def __call__(self, mel: np.ndarray) -> np.ndarray:
        mel = np.asarray(mel, dtype=np.float32)
        n_mels, most = self.convs[0][0].shape[0] // 3, 2 * len(self.positions)
        if mel.ndim != 3 or mel.shape[1] != n_mels or not 1 <= mel.shape[2] <= most:
            raise ValueError(f"the encoder takes (batch, {n_mels} mels, 1..{most} frames) "
                             f"windows, not {mel.shape}")
        batch = mel.shape[0]
        x = mel.transpose(0, 2, 1)
        # BLAS's threads would spin beside our pool's right after the convolutions
        # (measured: 1000 frames 66 -> 169 ms); one thread does them in a few ms.
        with one_blas_thread():
            for (weight, bias), stride in zip(self.convs, (1, 2), strict=True):
                y = kernels.gelu_(np.matmul(conv_windows(x, stride), weight) + bias)
                x = y.reshape(batch, -1, y.shape[1])
        return kernels.encoder_forward_(x + self.positions[: x.shape[1]], self.n_heads,
                                        self.params)  # a new array: safe to overwrite
