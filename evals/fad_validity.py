"""FAD validity: does the default embedder rank known degradations in the right order?

Reference = the real recordings; candidates = the same recordings degraded by noise at
falling SNR, low-pass at falling cut-off, and time-stretch at growing factors. Each family
must give FAD rising with the damage. Writes evals/fad_validity.json, prints a markdown table.

    python evals/fad_validity.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from audiofast.audio import load_audio
from audiofast.eval import augment
from audiofast.eval.datasets import real_speech_clips
from audiofast.eval.fad import Stats, WhisperEmbedder, fad_inf, frechet_distance

FAMILIES = {
    "noise (SNR dB)": ("noise", [40, 30, 20, 10, 0]),
    "low-pass (Hz)": ("lowpass", [6000, 3000, 1500, 700]),
    "time-stretch (x)": ("stretch", [1.05, 1.1, 1.3, 1.6]),
    "reverb (RT60 s)": ("reverb", [0.2, 0.5, 1.0, 2.0]),
}


def main() -> None:
    embedder = WhisperEmbedder("whisper-base", threads=2)
    audio = [load_audio(c.audio) for c in real_speech_clips()]
    clean = np.concatenate([embedder.embed(a) for a in audio])
    reference = Stats.of(clean)
    rows = []
    for family, (name, levels) in FAMILIES.items():
        values = []
        for level in levels:
            emb = np.concatenate([embedder.embed(augment.apply(a, f"{name}:{level}"))
                                  for a in audio])
            values.append((level, frechet_distance(Stats.of(emb), reference),
                           fad_inf(emb, reference)))
        fads = [v[1] for v in values]
        rows.append({"family": family, "values": values, "monotonic": fads == sorted(fads)})
    out = Path(__file__).with_name("fad_validity.json")
    out.write_text(json.dumps({"embedder": embedder.name, "frames": len(clean), "rows": rows},
                              indent=2))
    print("| degradation | level: FAD (FAD-inf) | rises with damage |\n|---|---|---|")
    for r in rows:
        cells = ", ".join(f"{lv}: {f:.2f} ({fi:.2f})" for lv, f, fi in r["values"])
        print(f"| {r['family']} | {cells} | {'yes' if r['monotonic'] else 'NO'} |")


if __name__ == "__main__":
    main()
