"""silero VAD's own ONNX graph on onnxruntime: the live server's VAD without PyTorch.

The ``silero-vad`` wheel ships the network twice, as TorchScript and as ONNX. The server runs
one detector per session, and importing torch for them cost ~400 MB of resident memory and a
second of start-up; onnxruntime is a fraction of that, and one ``InferenceSession`` (weights
loaded once) serves every stream, because the network's recurrent state is an input and an
output of each call rather than something the graph keeps.

Each 512-sample chunk (32 ms at 16 kHz) is fed with the last 64 samples of the chunk before it
in front, as the network was trained (zeros before the first chunk).
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import numpy as np

CHUNK = 512  # samples per call at 16 kHz
CONTEXT = 64  # samples of the previous chunk fed in front of each chunk
_SR = np.array(16000, dtype=np.int64)

_lock = threading.Lock()
_shared = None


def shared_session():
    """The process's one onnxruntime session for silero (built on first use, ~20 ms)."""
    global _shared
    with _lock:
        if _shared is None:
            # The graph's file, found without importing silero_vad (which imports torch).
            spec = importlib.util.find_spec("silero_vad")
            if spec is None or importlib.util.find_spec("onnxruntime") is None:
                raise ModuleNotFoundError("live VAD needs onnxruntime and silero-vad: pip "
                                          "install 'audiofast[serve]'")
            import onnxruntime as ort

            path = Path(spec.submodule_search_locations[0]) / "data" / "silero_vad.onnx"
            options = ort.SessionOptions()
            # Single chunks are far too small to split; sessions run in parallel instead.
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            options.log_severity_level = 3  # the graph's unused-initializer notices
            _shared = ort.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
        return _shared


class SileroStream:
    """One audio stream's silero VAD: speech probability per 512-sample chunk."""

    def __init__(self, session=None):
        self.session = session if session is not None else shared_session()
        self.state = np.zeros((2, 1, 128), dtype=np.float32)
        self.context = np.zeros(CONTEXT, dtype=np.float32)

    def __call__(self, chunk: np.ndarray) -> float:
        """The probability that ``chunk`` (512 float32 samples at 16 kHz) is speech."""
        if chunk.shape != (CHUNK,):
            raise ValueError(f"silero takes chunks of {CHUNK} samples, got {chunk.shape}")
        window = np.concatenate([self.context, chunk.astype(np.float32, copy=False)])[None]
        prob, self.state = self.session.run(None, {"input": window, "state": self.state,
                                                   "sr": _SR})
        self.context = window[0, -CONTEXT:]
        return float(prob[0, 0])
