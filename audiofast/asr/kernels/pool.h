// A tiny thread pool for the decoder's many short parallel loops.
//
// A decoder token is ~60 loops of 5-50 us each. With OpenMP (at::parallel_for) each loop wakes
// the other thread; once CTranslate2's encoder has run in the same process, libgomp stops
// spinning between loops and every wake-up is a futex round trip: a token measured 1.6 ms
// before the first encode and 4.4 ms after it (OMP_WAIT_POLICY=PASSIVE gives the same 4.4).
// Here workers spin on an atomic counter for ~1 ms after each loop - long enough to cover a
// token's loops and the Python between tokens - and only then sleep.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace audiofast {

class Pool {
 public:
  using Job = std::function<void(int64_t, int64_t)>;

  explicit Pool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return threads_; }

  // job(begin, end) over contiguous slices of [0, n), one per thread; returns when all are done.
  // Only the decoder's own thread calls this, one loop at a time.
  void run(int64_t n, const Job& job) {
    if (threads_ == 1 || n < 2) {
      if (n > 0) job(0, n);
      return;
    }
    job_ = &job;
    n_ = n;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    slice(0);
    while (pending_.load(std::memory_order_acquire) != 0) _mm_pause();
  }

 private:
  void slice(int index) {
    const int64_t per = (n_ + threads_ - 1) / threads_;
    const int64_t begin = index * per, end = std::min(n_, begin + per);
    if (begin < end) (*job_)(begin, end);
  }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      for (int64_t spins = 0; generation_.load(std::memory_order_acquire) == seen; ++spins) {
        if (spins < kSpins) {
          _mm_pause();
          continue;
        }
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      seen = generation_.load(std::memory_order_acquire);
      if (stop_) return;
      slice(index);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  static constexpr int64_t kSpins = 1 << 15;  // ~1 ms of pause instructions

  const int threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  const Job* job_ = nullptr;
  int64_t n_ = 0;
};

// The pool for torch's current thread count (rebuilt if torch.set_num_threads changed it).
inline Pool& pool() {
  static std::unique_ptr<Pool> current;
  const int want = std::max(1, at::get_num_threads());
  if (!current || current->threads() != want) current = std::make_unique<Pool>(want);
  return *current;
}

}  // namespace audiofast
