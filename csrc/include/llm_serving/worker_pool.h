// A persistent pool of worker threads that runs one chunked task at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

namespace llm_serving {

// Work over [0, size) split into chunks; RunChunk must not throw.
class ChunkedTask {
 public:
  virtual ~ChunkedTask() = default;
  virtual void RunChunk(std::size_t begin, std::size_t end) noexcept = 0;
};

class WorkerPool {
 public:
  // Starts num_threads - 1 workers: the thread that waits runs chunks too. Throws
  // std::runtime_error, with no thread left running, when a worker cannot be started.
  explicit WorkerPool(std::size_t num_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Hands `task` to the workers and returns; the task must outlive the next Wait(). With
  // wake_workers false a single-chunk task is left to the thread that calls Wait(), which
  // saves a wake-up when the work is smaller than a context switch.
  void Submit(ChunkedTask* task, std::size_t size, std::size_t chunk, bool wake_workers = true);
  // Runs remaining chunks on the calling thread, then blocks until every chunk is done.
  void Wait();
  bool busy() const { return task_ != nullptr; }
  std::size_t num_threads() const { return workers_.size() + 1; }

 private:
  void WorkerLoop();
  void StopWorkers();  // stops and joins every started worker
  // Runs chunks until none is left; returns how many this thread finished.
  std::size_t Drain();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  ChunkedTask* task_ = nullptr;
  std::size_t size_ = 0;
  std::size_t chunk_ = 1;
  std::size_t num_chunks_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::size_t finished_chunks_ = 0;  // guarded by mutex_
  std::size_t active_workers_ = 0;   // guarded by mutex_
  std::atomic<std::size_t> next_chunk_{0};
};

}  // namespace llm_serving
