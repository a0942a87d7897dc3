// Request slots 0..max_batch-1 and the batched, multithreaded next-token bitmask fill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "llm_serving/constraint.h"
#include "llm_serving/slot_state.h"
#include "llm_serving/worker_pool.h"

namespace llm_serving {

class BatchEngine : private ChunkedTask {
 public:
  BatchEngine(std::size_t max_batch, int32_t vocab_size, std::size_t num_threads);
  ~BatchEngine() override;

  std::size_t max_batch() const { return slots_.size(); }
  int32_t vocab_size() const { return vocab_size_; }
  std::size_t words() const { return words_; }
  std::size_t num_threads() const { return pool_.num_threads(); }

  // Slot operations wait for a pending fill first. Bad slots throw ConfigError.
  void Add(std::size_t slot, std::shared_ptr<const Constraint> constraint);
  void Remove(std::size_t slot);
  void Move(std::size_t from, std::size_t to);  // `to` takes over `from`, which becomes empty
  void Swap(std::size_t a, std::size_t b);
  void Reset(std::size_t slot);
  void Advance(std::size_t slot, const int32_t* tokens, std::size_t count);
  // Advances slots[i] by tokens[i], one token each.
  void AdvanceBatch(const int32_t* slots, const int32_t* tokens, std::size_t count);

  // Writes row r of `bitmask` ([num_rows, words()] int32) for every r in `rows`; rows whose
  // slot holds no constraint are left untouched. FillAsync returns at once: the buffer must
  // stay alive and unread until Wait().
  void Fill(int32_t* bitmask, std::size_t num_rows, const int32_t* rows, std::size_t count);
  void FillAsync(int32_t* bitmask, std::size_t num_rows, const int32_t* rows, std::size_t count);
  void Wait();
  bool pending() const { return pool_.busy(); }

  bool active(std::size_t slot) const;
  const SlotState& state(std::size_t slot) const;
  uint64_t total_dead_ends() const;

 private:
  void RunChunk(std::size_t begin, std::size_t end) noexcept override;
  void CheckSlot(std::size_t slot, const char* what) const;
  SlotState& Active(std::size_t slot);
  void Stage(int32_t* bitmask, std::size_t num_rows, const int32_t* rows, std::size_t count);
  void Launch(bool wake_workers);

  int32_t vocab_size_;
  std::size_t words_;
  std::vector<std::unique_ptr<SlotState>> slots_;
  std::vector<int32_t> rows_;  // rows of the fill in flight, preallocated
  std::vector<uint8_t> seen_;  // duplicate-row check, preallocated
  std::size_t num_fill_rows_ = 0;
  uint32_t* bitmask_ = nullptr;
  uint64_t removed_dead_ends_ = 0;
  WorkerPool pool_;
};

}  // namespace llm_serving
