"""``python -m audiofast.asr.kernels``: build the C++ kernel now (setup runs this), and say
which path runs here: the AVX2 build also carries the AVX-512 VNNI kernels, chosen at run time."""

from audiofast.asr.kernels import backend, uses_vnni

built = backend()
path = " (AVX-512 VNNI path on this CPU)" if built != "none" and uses_vnni() else ""
print(f"audiofast: C++ decoder kernels: {built}{path}")
