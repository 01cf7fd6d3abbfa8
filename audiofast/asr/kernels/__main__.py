"""``python -m audiofast.asr.kernels``: build the C++ kernel now (setup runs this)."""

from audiofast.asr.kernels import backend

print(f"audiofast: C++ decoder kernels: {backend()}")
