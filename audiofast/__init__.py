"""audiofast: make audio models fast without making them worse."""

import os

# Idle OpenMP threads (PyTorch's, CTranslate2's) spin ~300k rounds after each parallel region
# before they sleep. The owned decoder alternates its own threads (asr/kernels/pool.h) with
# small PyTorch ops every token, and on 2 cores a spinning OpenMP thread took the core they
# needed: whether it did depended on whether ctranslate2 or torch was imported first (decoder
# 1.6 vs 6.4 ms per token, measured; the CTranslate2 encoder's time was unchanged either way).
# Read by libgomp when it loads, so set before torch; a value already set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

__version__ = "0.1.0"


def __getattr__(name: str):
    """``audiofast.load_model`` (asr/runtime.py) and the options, imported on first use:
    ``import audiofast`` itself stays free of torch and CTranslate2, since the CLI and the GOMP
    setting above need it before either loads."""
    if name == "load_model":
        from audiofast.asr.runtime import load_model

        return load_model
    if name in ("TranscribeOptions", "DecodingOptions"):
        from audiofast.asr import options

        return getattr(options, name)
    raise AttributeError(f"module 'audiofast' has no attribute {name!r}")
