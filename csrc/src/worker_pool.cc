#include "llm_serving/worker_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <system_error>

namespace llm_serving {

WorkerPool::WorkerPool(std::size_t num_threads) {
  const std::size_t workers = num_threads > 1 ? num_threads - 1 : 0;
  workers_.reserve(workers);
  try {
    for (std::size_t i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  } catch (const std::system_error& error) {
    // No destructor runs for a half-built pool: the started workers would still wait on the
    // condition variable being destroyed, and a joinable std::thread terminates the process.
    const std::size_t started = workers_.size();
    StopWorkers();
    throw std::runtime_error("could not start worker thread " + std::to_string(started + 1) +
                             " of " + std::to_string(workers) + " (" + error.what() +
                             "); lower num_threads or LLM_SERVING_ENGINE_THREADS");
  }
}

WorkerPool::~WorkerPool() {
  if (busy()) Wait();
  StopWorkers();
}

void WorkerPool::StopWorkers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void WorkerPool::Submit(ChunkedTask* task, std::size_t size, std::size_t chunk,
                        bool wake_workers) {
  if (busy()) Wait();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = task;
    size_ = size;
    chunk_ = std::max<std::size_t>(chunk, 1);
    num_chunks_ = (size + chunk_ - 1) / chunk_;
    next_chunk_.store(0, std::memory_order_relaxed);
    finished_chunks_ = 0;
    ++generation_;
  }
  if (!workers_.empty() && num_chunks_ > 0 && (wake_workers || num_chunks_ > 1)) {
    start_.notify_all();
  }
}

std::size_t WorkerPool::Drain() {
  std::size_t finished = 0;
  for (;;) {
    const std::size_t index = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (index >= num_chunks_) break;
    const std::size_t begin = index * chunk_;
    task_->RunChunk(begin, std::min(size_, begin + chunk_));
    ++finished;
  }
  return finished;
}

void WorkerPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || (generation_ != seen && task_ != nullptr); });
      if (stopping_) return;
      seen = generation_;
      ++active_workers_;
    }
    const std::size_t finished = Drain();
    std::lock_guard<std::mutex> lock(mutex_);
    finished_chunks_ += finished;
    if (--active_workers_ == 0 && finished_chunks_ == num_chunks_) done_.notify_all();
  }
}

void WorkerPool::Wait() {
  if (!busy()) return;
  const std::size_t finished = Drain();
  std::unique_lock<std::mutex> lock(mutex_);
  finished_chunks_ += finished;
  // Waiting for idle workers too keeps a late worker from reading the next task's fields.
  done_.wait(lock, [&] { return finished_chunks_ == num_chunks_ && active_workers_ == 0; });
  task_ = nullptr;
}

}  // namespace llm_serving
