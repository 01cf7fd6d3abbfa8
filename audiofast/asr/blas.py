"""numpy's BLAS held to one thread around inference's few matmuls.

The log-mel filterbank and the fused encoder's convolutions are numpy matmuls. OpenBLAS runs
a large one on all cores and its threads then spin for a while, beside the decoder's pool and
CTranslate2's threads on the same few cores: on 2 cores the four real clips took 2.59 s with
its threads, 2.47 s with one (same process, alternated; the encoder 1.42 -> 1.30 s). One
thread does these matmuls in a few ms.
"""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager


@functools.cache
def _controller():
    from threadpoolctl import ThreadpoolController  # ~5 ms to import and scan: on first use

    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager:
    """``with one_blas_thread(): ...`` runs numpy's BLAS on one thread, as before after."""
    return _controller().limit(limits=1, user_api="blas")
