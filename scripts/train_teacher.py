"""Train the proving-ground teacher (an SA3-architecture text-to-audio model) on 2 CPU cores.

    python scripts/train_teacher.py --workdir runs/teacher

Stages: log-spectrogram latents of the training clips -> DiT by flow matching -> SA3
checkpoint in ``WORKDIR/teacher``. Kill it at any point and rerun the same command: each stage
resumes from its last atomic checkpoint (see ``audiofast/training.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from audiofast.diffusion.teacher import TeacherRecipe, train_teacher


def main() -> None:
    defaults = TeacherRecipe()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="runs/teacher")
    for field in dataclasses.fields(TeacherRecipe):
        if field.type in ("int", "float"):
            kind = int if field.type == "int" else float
            flag = "--" + field.name.replace("_", "-")
            parser.add_argument(flag, type=kind, default=getattr(defaults, field.name))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = TeacherRecipe(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(TeacherRecipe)
           if f.name != "size"}
    )
    start = time.perf_counter()
    out = train_teacher(recipe, args.workdir)
    print(f"teacher checkpoint: {out} ({(time.perf_counter() - start) / 60:.1f} min)")


if __name__ == "__main__":
    main()
