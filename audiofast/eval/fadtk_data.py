"""fadtk's shipped reference data: FMA-pop statistics per embedder, 23 AI-generated music
clips and their published per-clip FAD scores.

fadtk 1.1.0 cannot be installed beside transformers 5 / numpy 2, so its wheel is downloaded
(setup does this; so does the first call here) and the data files are read out of it.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from audiofast.cache import cache_dir

FADTK_WHEEL = "fadtk==1.1.0"


def fadtk_dir() -> Path:
    """Folder with ``stats/fma_pop.npz``, ``test/samples_FAD_scores.csv`` and ``test/samples``."""
    root = cache_dir() / "fadtk-1.1.0"
    if (root / "stats" / "fma_pop.npz").is_file():
        return root
    wheels = cache_dir() / "wheels"
    wheel = next(wheels.glob("fadtk-1.1.0-*.whl"), None)
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", FADTK_WHEEL,
                        "-d", str(wheels)], check=True, capture_output=True)
        wheel = next(wheels.glob("fadtk-1.1.0-*.whl"))
    tmp = root.with_name(root.name + ".tmp")
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(("fadtk/stats/", "fadtk/test/samples")):
                z.extract(name, tmp)
    (tmp / "fadtk").rename(root)
    tmp.rmdir()
    return root
