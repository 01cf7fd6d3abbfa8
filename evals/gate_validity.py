"""Gate validity study: does round-trip (TTS) WER rank ASR candidates the way real speech does?

Candidates of known, different quality (tiny.en, base at several precisions, base with a
damaged decoder) are scored on the synthetic set and on the real-speech anchor set; the
rankings are compared with Kendall's tau. Writes evals/gate_validity[_AUG].json and
prints a markdown table (pasted into evals/gate_validity.md).

    python evals/gate_validity.py [--augment noise:15]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from scipy.stats import kendalltau

from audiofast.eval.datasets import tts_texts
from audiofast.eval.degrade import degraded_model
from audiofast.eval.roundtrip import CachedASR, build_eval_audio, corpus_wer, score
from audiofast.eval.tts import DEFAULT_VOICES


def candidates() -> dict[str, str]:
    return {
        "base fp32": "whisper-base@float32",
        "base int8": "whisper-base@int8",
        "tiny.en int8": "whisper-tiny.en@int8",
        "base, decoder 4-bit": f"{degraded_model('whisper-base', 'fake_quant:4')}@int8",
        "base, decoder 3-bit": f"{degraded_model('whisper-base', 'fake_quant:3')}@int8",
        "base, head noise 0.5": f"{degraded_model('whisper-base', 'head_noise:0.5')}@int8",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--augment", default=None, help="e.g. noise:15 (see eval/augment.py)")
    args = parser.parse_args()
    items = build_eval_audio(tts_texts(), DEFAULT_VOICES, args.augment, anchors=True)
    rows = []
    for label, spec in candidates().items():
        start = time.perf_counter()
        utts = score(CachedASR(spec, threads=2), items, label)
        tts = [u for u in utts if u.set == "tts"]
        real = [u for u in utts if u.set == "real"]
        rows.append({"candidate": label, "spec": spec, "tts_wer": corpus_wer(tts),
                     "real_wer": corpus_wer(real), "seconds": time.perf_counter() - start,
                     "per_voice": {v: corpus_wer([u for u in tts if u.voice == v])
                                   for v in DEFAULT_VOICES}})
    tau, p = kendalltau([r["tts_wer"] for r in rows], [r["real_wer"] for r in rows])
    suffix = f"_{args.augment.replace(':', '')}" if args.augment else ""
    out = Path(__file__).with_name(f"gate_validity{suffix}.json")
    out.write_text(json.dumps({"augmentation": args.augment, "rows": rows, "kendall_tau": tau,
                               "p_value": p}, indent=2))
    voices = " | ".join(DEFAULT_VOICES)
    print(f"| candidate | TTS WER % | real WER % | {voices} |")
    print("|---|---|---|" + "---|" * len(DEFAULT_VOICES))
    for r in rows:
        per_voice = " | ".join(f"{100 * r['per_voice'][v]:.1f}" for v in DEFAULT_VOICES)
        print(f"| {r['candidate']} | {100 * r['tts_wer']:.1f} | {100 * r['real_wer']:.1f} | "
              f"{per_voice} |")
    print(f"\nKendall tau (TTS vs real ranking): {tau:.3f} (p = {p:.3f})")


if __name__ == "__main__":
    main()
