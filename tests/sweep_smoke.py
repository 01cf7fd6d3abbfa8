"""The whisper-tiny.en smoke sweep both sweep test files run."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
AUDIOFAST = [sys.executable, "-m", "audiofast.cli"]
SENTENCES = ["The birch canoe slid on the smooth planks.",
             "Glue the sheet to the dark blue background.",
             "It's easy to tell the depth of a well.",
             "These days a chicken leg is a rare dish."]


def smoke_config(tmp_path: Path, **changes) -> Path:
    """A whisper-tiny.en sweep judged on 4 sentences (2 a half) in one voice, timed on one
    short real clip. Trials encode on CTranslate2, as the baseline does: transcribe's
    default ``--encoder auto`` runs the fused encoder for 30 s windows on VNNI CPUs, and
    there tiny.en's real clips differ from the baseline by a word, so whether the choice
    confirms (and a preset is written) would depend on the CPU and on which trial the
    interrupt hit."""
    texts = tmp_path / "texts.txt"
    texts.write_text("# smoke\n" + "\n".join(SENTENCES) + "\n")
    gates = yaml.safe_load((ROOT / "configs" / "gates.yaml").read_text())
    gates["asr"] |= {"texts": str(texts), "voices": ["flite:slt"], "augmentation": None}
    (tmp_path / "gates.yaml").write_text(yaml.safe_dump(gates))
    config = {"lane": "asr", "study": "smoke", "model": "whisper-tiny.en", "trials": 2,
              "out": str(tmp_path / "sweeps"), "preset": "smoke",
              "speed": {"runs": 1, "clips": ["clone-test"], "warmup": False},
              "gate": {"config": str(tmp_path / "gates.yaml"), "threads": 1},
              "space": {"engine": ["fast", "ct2"], "window_pad": [None, 2],
                        "drafter": ["none", "ngram"], "draft_len": {"low": 2, "high": 8},
                        "encoder": "ct2", "threads": [0, 1]}} | changes
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
