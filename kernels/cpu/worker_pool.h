// A small pool of spinning worker threads for the quantized matmul's decode-sized calls.
//
// Why not OpenMP (at::parallel_for): the engine steps on its own thread, and there libgomp
// wakes its team for ~30 us per parallel region (50 us with OMP_WAIT_POLICY=PASSIVE, which
// tokenwire serve sets), longer than one decode matmul takes on one core. These workers
// spin for a while after each job, so the next matmul of the same step starts them in
// about a microsecond, then sleep.
//
// Work is split into chunks that the caller and the workers claim one at a time: the
// caller never waits for a worker that has not shown up (say, descheduled by a busy event
// loop); it takes the remaining chunks itself, so a call is never slower than running
// serially by more than the claiming.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

namespace tokenwire {

class WorkerPool {
 public:
  using Chunk = std::function<void(int64_t)>;

  // The process-wide pool, never destroyed (its detached workers end with the process);
  // workers are started on first use and added when more are asked for.
  static WorkerPool& instance();

  // Runs fn(c) for every c in [0, chunks) on the calling thread and up to threads - 1
  // workers; returns when all are done. A call made while another runs is run serially.
  void run(int64_t chunks, int threads, const Chunk& fn);

 private:
  void grow(int workers);
  void work(int index);
  void claim_and_run(int index, uint64_t generation);
  void wait_for_job(uint64_t& seen);

  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;      // the job's fields below, sleepers_ and workers_
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};  // bumped per job; spinning workers watch it
  std::atomic<int64_t> pending_{0};      // chunks of the current job not yet finished
  int sleepers_ = 0;                     // workers blocked on wake_
  int workers_ = 0;
  const Chunk* fn_ = nullptr;
  int64_t next_ = 0, chunks_ = 0;
  int max_workers_ = 0;  // workers with a smaller index may claim chunks of this job
};

}  // namespace tokenwire
