// radixrt::parallel_for: at::parallel_for's contract (run f(chunk_begin, chunk_end) over contiguous chunks of
// [begin, end), each at least `grain` long, on up to at::get_num_threads() threads) over radixrt's own thread
// pool, whose workers spin for a bounded time after each task before they sleep.
//
// Why not torch's OpenMP pool: a decode step calls ~150 products of tens of microseconds each, with small
// ops between them. Once libgomp's workers sleep, every product pays a futex wake-up of tens of
// microseconds on a VM, and they sleep almost at once whenever the process has more OpenMP threads than
// CPUs (the Engine's scheduler thread beside a main thread that ran a parallel torch op: each has its own
// team; libgomp then spins ~100 iterations), or under OMP_WAIT_POLICY=PASSIVE (the scheduler process's
// setting: spinning OpenMP workers starve a competing process). Measured, 120 fp32 batch-1 projections with
// 30 us gaps, 2 cores: 14.2-17.4 ms from a lone OpenMP team, 26.7-28.6 ms from a second thread, 16-20 ms
// through this pool from either.
//
// Chunks are claimed, not assigned: the caller and the workers take chunks off a shared counter, so a worker
// that is asleep or descheduled (a busy machine) never holds the caller up; the caller then does the chunks
// itself. A chunk's result never depends on which thread ran it, so results are the same bits either way.
//
//   caller thread                              worker (spinning, or woken from the condvar)
//   -------------                              ------
//   task = {f, chunks, next = 0, done = 0}
//   publish &task, ++gen                  ->   ++active; load &task
//   claim chunks until none are left           claim chunks until none are left
//   spin (yielding) until done == chunks  <-   done += what it ran
//   unpublish &task; wait for active == 0 <-   --active; spin RADIXRT_SPIN_US (default 200) for the next
//                                              gen, yielding now and then, then sleep
//
// One caller at a time: a second thread calling while the pool is busy runs at::parallel_for instead, and a
// nested call (from inside a task or a torch parallel region) runs serially. After fork() the child builds a
// new pool. Tasks must not throw: check arguments before the parallel part, as at::parallel_for asks.
#pragma once
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace radixrt {

// One parallel_for call: chunks [0, chunks) of `chunk` units from `begin`, claimed through `next`.
struct Task {
  void (*run)(const void* f, int64_t b, int64_t e);
  const void* f;
  int64_t begin, end, chunk, chunks;
  std::atomic<int64_t> next{0}, done{0};

  // Claims and runs chunks until none are left.
  void drain() {
    int64_t ran = 0;
    for (int64_t c; (c = next.fetch_add(1)) < chunks; ++ran) {
      const int64_t b = begin + c * chunk;
      run(f, b, std::min(end, b + chunk));
    }
    if (ran) done.fetch_add(ran, std::memory_order_release);
  }
};

class Pool {
 public:
  explicit Pool(int workers) : size_(workers + 1) {
    const char* env = std::getenv("RADIXRT_SPIN_US");
    spin_us_ = env ? std::max(0L, std::atol(env)) : 200;
    for (int i = 0; i < workers; ++i) std::thread([this] { work(); }).detach();  // never torn down
  }
  int size() const { return size_; }
  bool try_acquire() { return !busy_.exchange(true, std::memory_order_acquire); }
  void release() { busy_.store(false, std::memory_order_release); }

  // Runs every chunk of `t` on this thread and whichever workers join; returns when all are done and no
  // worker still holds `t`. The caller holds the pool.
  void run(Task& t) {
    task_.store(&t);
    gen_.fetch_add(1);  // seq_cst, paired with a sleeping worker's (sleepers_ then gen_)
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> g(mu_);
      cv_.notify_all();
    }
    in_task() = true;
    t.drain();
    in_task() = false;
    for (int i = 1; t.done.load(std::memory_order_acquire) < t.chunks; ++i) pause(i);
    task_.store(nullptr);  // seq_cst: a worker that enters after this sees no task (or a later one)
    for (int i = 1; active_.load() > 0; ++i) pause(i);
  }

  static bool& in_task() {
    static thread_local bool flag = false;
    return flag;
  }

 private:
  // A spin step; every 64th yields the core, so that a descheduled thread we wait for gets to run.
  static void pause(int i) {
    if (i % 64 == 0) sched_yield();
    else _mm_pause();
  }

  void work() {
    in_task() = true;  // a kernel called from inside a task runs serially
    uint64_t seen = 0;  // gen_ at construction: a task published before this thread ran is still seen
    for (;;) {
      wait(seen);
      seen = gen_.load();
      active_.fetch_add(1);
      if (Task* t = task_.load()) t->drain();
      active_.fetch_sub(1);
    }
  }

  // Until gen_ moves past `seen`: spin for spin_us_, then sleep on the condvar.
  void wait(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
    for (int i = 1; gen_.load(std::memory_order_acquire) == seen; ++i) {
      pause(i);
      if (i % 256 == 0 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> g(mu_);
        sleepers_.fetch_add(1);
        cv_.wait(g, [&] { return gen_.load() != seen; });
        sleepers_.fetch_sub(1);
        return;
      }
    }
  }

  const int size_;
  int64_t spin_us_ = 200;
  std::atomic<uint64_t> gen_{0};
  std::atomic<Task*> task_{nullptr};
  std::atomic<int> active_{0}, sleepers_{0};
  std::atomic<bool> busy_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

// The process's pool, built at first use with at::get_num_threads() - 1 workers (a fork's child builds its
// own: the parent's worker threads do not exist there, so its pool is dropped).
inline Pool*& pool_slot() {
  static Pool* p = nullptr;
  return p;
}

inline Pool* pool() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { pool_slot() = nullptr; }); });
  if (pool_slot() == nullptr) pool_slot() = new Pool(std::max(1, at::get_num_threads()) - 1);
  return pool_slot();
}

// Chunks per thread: enough that a slow or absent worker's share is picked up by the others, few enough
// that each chunk of a GEMV stays one long sequential read.
constexpr int64_t CHUNKS_PER_THREAD = 4;

template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = end - begin, most = (units + grain - 1) / grain;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), most);
  if (threads <= 1 || Pool::in_task() || at::in_parallel_region()) {
    f(begin, end);
    return;
  }
  Pool* p = pool();
  if (!p->try_acquire()) {  // another thread's kernel holds it
    at::parallel_for(begin, end, grain, f);
    return;
  }
  const int64_t want = std::min<int64_t>(most, std::min<int64_t>(threads, p->size()) * CHUNKS_PER_THREAD);
  const int64_t chunk = (units + want - 1) / want;
  Task t;
  t.run = [](const void* fn, int64_t b, int64_t e) { (*static_cast<const F*>(fn))(b, e); };
  t.f = &f;
  t.begin = begin;
  t.end = end;
  t.chunk = chunk;
  t.chunks = (units + chunk - 1) / chunk;
  p->run(t);
  p->release();
}

}  // namespace radixrt
