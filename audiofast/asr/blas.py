"""numpy's BLAS held to one thread around inference's few matmuls.

The log-mel filterbank and the fused encoder's convolutions are numpy matmuls. OpenBLAS runs
a large one on all cores and its threads then spin for a while, beside the decoder's pool and
CTranslate2's threads on the same few cores: on 2 cores the four real clips took 2.59 s with
its threads, 2.47 s with one (same process, alternated; the encoder 1.42 -> 1.30 s). One
thread does these matmuls in a few ms.

The limit is process-wide while the live server runs these from two threads at once, so it
is counted: the first to enter sets it, the last to leave restores what was there before.
(Each caller holding threadpoolctl's limit of its own restored the other's one-thread
setting, and the last to leave left BLAS on one thread for good.)
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0
_limiter = None  # threadpoolctl's limiter while anyone holds the limit


@functools.cache
def _controller():
    from threadpoolctl import ThreadpoolController  # ~5 ms to import and scan: on first use

    return ThreadpoolController()


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """``with one_blas_thread(): ...`` runs numpy's BLAS on one thread, as before after the
    last of the threads inside leaves."""
    global _holders, _limiter
    with _lock:
        if _holders == 0:
            _limiter = _controller().limit(limits=1, user_api="blas")
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                _limiter.restore_original_limits()
                _limiter = None
