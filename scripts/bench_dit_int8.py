"""Time one SA3 DiT pass in float32 and in the int8 options, side by side in one process.

    python scripts/bench_dit_int8.py --model evals/teacher --batch 32 --runs 15

Options: float32 (the baseline), the project's packed int8 kernel (per-token 8-bit activations,
exact int32 sums: what ``distill --stage qad`` exports) with its blocks' norms fused into the
kernel calls (diffusion/int8_block.py: norms and adaLN before the linears) and its
self-attention in 8 bits in one kernel pass (q/k norms, RoPE, int8 QK and PV:
kernels.dit_attention_int8); the same with the io layers int8 too (what QAD students export);
the same with float attention (q/k norms and RoPE in a kernel, then SDPA), with the first
fusion only, and without; torch's dynamic int8 quantization of the
same linears (fbgemm: one activation range per tensor), and the kernel's PyTorch reference
(dequantized weights, fake-quantized activations: numerics only). Runs are interleaved (each
round times every option once, in a shuffled order) and the median per option is reported,
with the output's relative error against float32. Prints a table, writes ``<out>.json``.
"""

from __future__ import annotations

import audiofast  # noqa: F401 - first: sets GOMP_SPINCOUNT before torch loads libgomp
import argparse
import copy
import json
import random
import statistics
import time
from pathlib import Path
from unittest import mock

import torch

from audiofast.diffusion import int8_block
from audiofast.diffusion.dit import DiTBlock
from audiofast.diffusion.generate import load_for_generation
from audiofast.diffusion.int8 import kernel_available, quantize_dit
from audiofast.diffusion.qad import quantized_linear_names


def torch_dynamic(dit: torch.nn.Module) -> torch.nn.Module:
    """fbgemm dynamic int8 on exactly the linears the kernel path quantizes."""
    import warnings

    names = set(quantized_linear_names(dit))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(dit, names, dtype=torch.qint8)


def unfused(dit: torch.nn.Module) -> torch.nn.Module:
    """The int8 DiT with PyTorch norms between kernel calls (before diffusion/int8_block.py)."""
    for layer in dit.transformer.layers:
        layer.__class__ = DiTBlock
    return dit


class NormsOnly(torch.nn.Module):
    """The fused int8 DiT with self-attention wholly in PyTorch (q/k norms, RoPE, SDPA and
    its residual: the fused block before ``kernels.qk_norm_rope``), to show the attention
    kernels' share."""

    def __init__(self, dit: torch.nn.Module):
        super().__init__()
        self.dit = dit

    def forward(self, *args, **kwargs) -> torch.Tensor:
        with mock.patch.object(int8_block, "attention_rows", lambda *_: None):
            return self.dit(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="evals/teacher")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="evals/benchmarks/dit_int8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not kernel_available():
        raise SystemExit("the int8 kernel is not built: run scripts/setup.sh")
    model = load_for_generation(args.model)
    cfg = model.config
    frames = cfg.sample_size // cfg.autoencoder.downsampling_ratio
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, cfg.io_channels, frames, generator=gen)
    t = torch.full((args.batch,), 0.7)
    inputs = {c.id: ["a loud saw playing a A3 note"] * args.batch for c in cfg.conditioning.text}
    inputs.update({c.id: [2.0] * args.batch for c in cfg.conditioning.numbers})
    with torch.inference_mode():
        cond = model.condition(inputs)
    extra = {}
    if cfg.student and cfg.student.guidance and cfg.student.guidance.range:
        extra["guidance"] = cfg.student.guidance.scale
    options = {
        "float32": model.dit,
        "int8 kernel, fused blocks, int8 attention, int8 io layers (QAD students)":
            quantize_dit(copy.deepcopy(model.dit), use_kernel=True, io=True),
        "int8 kernel, fused blocks, int8 attention": quantize_dit(copy.deepcopy(model.dit),
                                                                  use_kernel=True),
        "int8 kernel, fused blocks, float attention": quantize_dit(
            copy.deepcopy(model.dit), use_kernel=True, attention=False),
        "int8 kernel, fused norms, PyTorch q/k norm + RoPE": NormsOnly(
            quantize_dit(copy.deepcopy(model.dit), use_kernel=True, attention=False)),
        "int8 kernel, unfused blocks": unfused(quantize_dit(copy.deepcopy(model.dit), True,
                                                            attention=False)),
        "torch dynamic int8": torch_dynamic(copy.deepcopy(model.dit)),
        "int8 PyTorch reference": quantize_dit(copy.deepcopy(model.dit), use_kernel=False),
    }

    def run(dit: torch.nn.Module) -> torch.Tensor:
        return dit(x, t, cond.cross_attn_cond, cond.global_cond, **extra)

    times: dict[str, list[float]] = {k: [] for k in options}
    outputs = {}
    with torch.inference_mode():
        for name, dit in options.items():
            outputs[name] = run(dit)  # warm-up
        rng = random.Random(0)
        for _ in range(args.runs):  # each round in a new order: what ran before matters here
            for name in rng.sample(list(options), len(options)):
                start = time.perf_counter()
                run(options[name])
                times[name].append(time.perf_counter() - start)
    ref = outputs["float32"]
    rows = []
    for name in options:
        err = ((outputs[name] - ref).norm() / ref.norm()).item()
        med = statistics.median(times[name])
        rows.append({"option": name, "median_s": med, "min_s": min(times[name]),
                     "speedup_vs_fp32": statistics.median(times["float32"]) / med,
                     "relative_error_vs_fp32": err})
    reference = outputs["int8 PyTorch reference"]
    kernel_vs_ref = ((outputs["int8 kernel, fused blocks, int8 attention"] - reference).abs().max()
                     / reference.abs().max()).item()
    print(f"\nDiT pass, batch {args.batch} x {frames} latents, {args.threads} threads, "
          f"median of {args.runs}\n")
    print("| option | median ms | min ms | speed-up vs fp32 | rel. error vs fp32 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['option']} | {r['median_s'] * 1000:.1f} | {r['min_s'] * 1000:.1f} | "
              f"{r['speedup_vs_fp32']:.2f}x | {r['relative_error_vs_fp32']:.4f} |")
    print(f"\nkernel vs its PyTorch reference: max |diff| / max |ref| = {kernel_vs_ref:.2e}")
    out = Path(args.out).with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model, "batch": args.batch, "frames": frames,
                               "threads": args.threads, "runs": args.runs, "rows": rows,
                               "kernel_vs_reference_max_rel": kernel_vs_ref}, indent=2))


if __name__ == "__main__":
    main()
