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
