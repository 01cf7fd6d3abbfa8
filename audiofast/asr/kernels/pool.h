// A tiny thread pool for the decoder's many short parallel loops.
//
// A decoder token is ~60 loops of 5-50 us each. With OpenMP (torch's parallel_for) each loop wakes
// the other thread; once CTranslate2's encoder has run in the same process, libgomp stops
// spinning between loops and every wake-up is a futex round trip: a token measured 1.6 ms
// before the first encode and 4.4 ms after it (OMP_WAIT_POLICY=PASSIVE gives the same 4.4).
// Here workers spin on an atomic counter for ~1 ms after each loop - long enough to cover a
// token's loops and the Python between tokens - and only then sleep. Safe to call from several
// threads, across fork(), and with jobs that throw (see parallel_for).
#pragma once
#include <immintrin.h>

#include <algorithm>

#include <pthread.h>

#include <atomic>
#include <exception>
#include <new>
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

  // A pool copied into a fork()ed child has no threads behind it: forget it without joining.
  void abandon() {
    for (auto& w : workers_) w.detach();
    workers_.clear();
  }

  int threads() const { return threads_; }

  // job(begin, end) over contiguous slices of [0, n), one per thread; returns when all are done.
  // One caller at a time (parallel_for below serialises callers). The first exception any
  // slice throws is rethrown here, after every slice has finished.
  void run(int64_t n, const Job& job) {
    if (threads_ == 1 || n < 2) {
      if (n > 0) job(0, n);
      return;
    }
    job_ = &job;
    n_ = n;
    error_ = nullptr;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    slice(0);
    while (pending_.load(std::memory_order_acquire) != 0) _mm_pause();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void slice(int index) {
    const int64_t per = (n_ + threads_ - 1) / threads_;
    const int64_t begin = index * per, end = std::min(n_, begin + per);
    try {
      if (begin < end) (*job_)(begin, end);
    } catch (...) {  // carried to the caller: an exception escaping a thread ends the process
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
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
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// The process's pool and the lock every parallel loop holds: two engines in two threads take
// turns (a loop is microseconds), and the pool is only rebuilt for a new thread count
// while no loop runs on it. fork() is prepared for: the lock is held across it so no loop is
// mid-flight, and the child starts with a fresh lock and no pool (its copy has no threads).
struct PoolState {
  std::mutex lock;
  Pool* pool = nullptr;

  PoolState() {
    pthread_atfork([] { state().lock.lock(); }, [] { state().lock.unlock(); },
                   [] {
                     PoolState& s = state();
                     new (&s.lock) std::mutex();  // the parent's holder does not exist here
                     if (s.pool) s.pool->abandon();
                     s.pool = nullptr;  // leaked on purpose: destroying it would join nothing
                   });
  }

  static PoolState& state() {
    static PoolState* instance = new PoolState();  // never destroyed: safe at exit
    return *instance;
  }
};

// Threads every parallel loop uses (set_threads in kernels/__init__.py; 0: this machine's).
inline std::atomic<int> pool_threads{0};

// job(begin, end) over slices of [0, n) on pool_threads threads.
inline void parallel_for(int64_t n, const Pool::Job& job) {
  PoolState& s = PoolState::state();
  std::lock_guard<std::mutex> guard(s.lock);
  const int set = pool_threads.load(std::memory_order_relaxed);
  const int want = std::max(1, set > 0 ? set : static_cast<int>(std::thread::hardware_concurrency()));
  if (!s.pool || s.pool->threads() != want) {
    delete s.pool;
    s.pool = new Pool(want);
  }
  s.pool->run(n, job);
}

}  // namespace audiofast
