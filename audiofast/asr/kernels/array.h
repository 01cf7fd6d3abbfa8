// Arrays borrowed from Python (numpy memory; kernels/__init__.py builds these): a pointer, a
// dtype and a C-contiguous shape. The library never owns, resizes or frees them, and it needs
// no torch: the default transcription path runs without importing it.
#pragma once
#include <cstdint>
#include <stdexcept>

namespace audiofast {

enum DType : int32_t { kFloat32 = 0, kFloat16 = 1, kInt8 = 2, kInt32 = 3, kInt64 = 4, kUInt8 = 5 };
constexpr int kMaxDims = 5;

struct Array {
  void* data;
  int64_t shape[kMaxDims];
  int32_t ndim;
  int32_t dtype;

  int64_t size(int i) const { return shape[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool same_shape(const Array& other) const {
    if (ndim != other.ndim) return false;
    for (int i = 0; i < ndim; ++i)
      if (shape[i] != other.shape[i]) return false;
    return true;
  }
  bool is(DType t, int dims) const { return dtype == t && ndim == dims; }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

// A caller's mistake: Python raises ValueError with this one-line message.
struct InputError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

inline void check(bool ok, const char* message) {
  if (!ok) throw InputError(message);
}

}  // namespace audiofast
