// WorkerPool (worker_pool.h): one job at a time, chunks claimed under a mutex, workers that
// spin on the job generation for kSpin before blocking on a condition variable.
#include "worker_pool.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace tokenwire {
namespace {

// How long an idle worker spins before it sleeps: longer than the Python work between two
// matmuls of a decode step (~10-30 us), short enough that an idle server's workers sleep.
constexpr auto kSpin = std::chrono::microseconds(100);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

WorkerPool& WorkerPool::instance() {
  static WorkerPool* pool = new WorkerPool();  // leaked on purpose: see the header
  return *pool;
}

void WorkerPool::run(int64_t chunks, int threads, const Chunk& fn) {
  const int workers = static_cast<int>(std::min<int64_t>(threads - 1, chunks - 1));
  std::unique_lock<std::mutex> running(run_mutex_, std::try_to_lock);
  if (workers <= 0 || !running.owns_lock()) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  grow(workers);
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    next_ = 0;
    chunks_ = chunks;
    max_workers_ = workers;
    pending_.store(chunks, std::memory_order_relaxed);
    generation = generation_.fetch_add(1, std::memory_order_release) + 1;
    if (sleepers_ > 0) wake_.notify_all();
  }
  claim_and_run(-1, generation);
  while (pending_.load(std::memory_order_acquire) > 0) cpu_relax();
}

void WorkerPool::grow(int workers) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (; workers_ < workers; ++workers_) std::thread(&WorkerPool::work, this, workers_).detach();
}

void WorkerPool::work(int index) {
  uint64_t seen = 0;
  for (;;) {
    wait_for_job(seen);
    claim_and_run(index, seen);
  }
}

// Claims and runs chunks of job `generation` until none is left (or a newer job replaced
// it). index -1 is the caller, who may always claim.
void WorkerPool::claim_and_run(int index, uint64_t generation) {
  for (;;) {
    int64_t chunk;
    const Chunk* fn;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (generation_.load(std::memory_order_relaxed) != generation || next_ >= chunks_ ||
          index >= max_workers_)
        return;
      chunk = next_++;
      fn = fn_;
    }
    (*fn)(chunk);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

// Returns once the job generation differs from `seen` (and updates it).
void WorkerPool::wait_for_job(uint64_t& seen) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int spins = 0;; ++spins) {
    const uint64_t generation = generation_.load(std::memory_order_acquire);
    if (generation != seen) {
      seen = generation;
      return;
    }
    if (spins % 64 == 63 && std::chrono::steady_clock::now() > until) break;
    cpu_relax();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  ++sleepers_;
  wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
  --sleepers_;
  seen = generation_.load(std::memory_order_relaxed);
}

}  // namespace tokenwire
