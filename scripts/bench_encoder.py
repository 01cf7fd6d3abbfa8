"""Whisper's encoder alone: CTranslate2 int8 vs audiofast's fused int8 encoder, by window length.

Each window is a real clip's log-mel cut or padded to the frame count; the runtimes are
interleaved in every repeat (machine drift hits both alike) and the median is reported, with
each output's error against the float32 encoder (transformers' modules on the same weights).

    python scripts/bench_encoder.py --model whisper-base --frames 500 1000 1500 2000 3000
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="whisper-base")
    p.add_argument("--frames", type=int, nargs="+", default=[500, 1000, 1500, 2000, 3000])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=Path("runs/bench_encoder.json"))
    args = p.parse_args()

    import ctranslate2
    import torch

    from audiofast.asr import kernels
    from audiofast.asr.ct2_runtime import CT2Whisper
    from audiofast.asr.features import log_mel_spectrogram, pad_or_trim
    from audiofast.asr.fused_encoder import FusedEncoder
    from audiofast.asr.ov_encoder import _EncoderForExport
    from audiofast.audio import load_audio
    from audiofast.eval.datasets import real_speech_clips
    from audiofast.models.ct2_to_hf import whisper_from_ct2

    ct2 = CT2Whisper(args.model)
    fused = FusedEncoder(ct2.resolved.ct2_dir)
    reference = _EncoderForExport(whisper_from_ct2(ct2.resolved.ct2_dir)[0].model.encoder).eval()
    encoders = {"ct2": lambda w: np.array(ct2.model.encode(ctranslate2.StorageView.from_array(w))),
                "fused": fused}
    clips = real_speech_clips()
    rows = []
    for i, frames in enumerate(args.frames):
        mel = log_mel_spectrogram(load_audio(clips[i % len(clips)].audio), ct2.n_mels)
        window = np.ascontiguousarray(pad_or_trim(mel, 3000)[None, :, :frames], np.float32)
        with torch.no_grad():
            exact = reference(torch.from_numpy(window)).numpy()
        times: dict[str, list[float]] = {name: [] for name in encoders}
        errors = {}
        for repeat in range(args.repeats + 1):
            for name, encode in encoders.items():
                t0 = time.perf_counter()
                out = encode(window)
                if repeat:
                    times[name].append(time.perf_counter() - t0)
                else:
                    errors[name] = float(np.abs(out - exact).mean() / np.abs(exact).mean())
        row = {"frames": frames, **{f"{n}_ms": 1000 * statistics.median(t)
                                    for n, t in times.items()},
               **{f"{n}_rel_error": e for n, e in errors.items()}}
        row["speedup"] = row["ct2_ms"] / row["fused_ms"]
        rows.append(row)
        print(f"{frames:>6} frames  ct2 {row['ct2_ms']:7.1f} ms  fused {row['fused_ms']:7.1f} ms"
              f"  x{row['speedup']:.2f}  |error| / |fp32|: ct2 {errors['ct2']:.4f}"
              f"  fused {errors['fused']:.4f}")
    result = {"model": args.model, "cpu": platform.processor() or platform.machine(),
              "vnni": kernels.uses_vnni(), "repeats": args.repeats, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    plot(rows, args.out.with_suffix(".png"), kernels.uses_vnni())
    print(f"wrote {args.out} (+ .png)")


def plot(rows: list[dict], path: Path, vnni: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    frames = [r["frames"] for r in rows]
    for name in ("ct2", "fused"):
        ax.plot(frames, [r[f"{name}_ms"] for r in rows], "o-", label=name)
    ax.set_xlabel("mel frames (100 per second)")
    ax.set_ylabel("ms per window (median)")
    ax.set_title(f"Whisper encoder, {'VNNI' if vnni else 'AVX2'} path")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
