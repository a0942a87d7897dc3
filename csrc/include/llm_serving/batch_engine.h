// Request slots 0..max_batch-1 and the batched, multithreaded next-token bitmask fill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "llm_serving/constraint.h"
#include "llm_serving/slot_state.h"
#include "llm_serving/worker_pool.h"

namespace llm_serving {

// What slot_info reports about one slot, copied under the engine's lock.
struct SlotInfo {
  uint64_t dead_ends = 0;
  uint64_t rejected_tokens = 0;
  bool finished = false;
};

// Thread-safe: every method takes the engine's lock, so calls from several threads run one at
// a time. A call first waits for a pending fill (FillAsync) to finish, whoever started it; it
// never waits for that thread's Wait(), so a thread that never calls it cannot stall the others.
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
  // stay unread until Wait(). The engine holds `keep_alive` (the buffer's owner) until then,
  // and FillAsync and Wait hand back the holder of the fill they finished, for the caller to
  // release (a Python owner needs the GIL, which the engine never takes).
  void Fill(int32_t* bitmask, std::size_t num_rows, const int32_t* rows, std::size_t count);
  std::shared_ptr<void> FillAsync(int32_t* bitmask, std::size_t num_rows, const int32_t* rows,
                                  std::size_t count, std::shared_ptr<void> keep_alive);
  std::shared_ptr<void> Wait();

  bool active(std::size_t slot);
  // These wait for a pending fill: the fill updates the counters.
  SlotInfo Info(std::size_t slot);
  uint64_t total_dead_ends();

 private:
  void RunChunk(std::size_t begin, std::size_t end) noexcept override;
  void CheckSlot(std::size_t slot, const char* what) const;
  SlotState& Active(std::size_t slot);
  void Stage(int32_t* bitmask, std::size_t num_rows, const int32_t* rows, std::size_t count);
  void Launch(bool wake_workers);
  void RemoveLocked(std::size_t slot);

  // Guards the members below (the sizes never change). Workers read them only during a fill,
  // and a holder waits for a pending fill before changing them.
  std::mutex mutex_;
  int32_t vocab_size_;
  std::size_t words_;
  std::vector<std::unique_ptr<SlotState>> slots_;
  std::vector<int32_t> rows_;  // rows of the fill in flight, preallocated
  std::vector<uint8_t> seen_;  // duplicate-row check, preallocated
  std::size_t num_fill_rows_ = 0;
  uint32_t* bitmask_ = nullptr;
  std::shared_ptr<void> keep_alive_;  // the last FillAsync's, until a Wait hands it back
  uint64_t removed_dead_ends_ = 0;
  WorkerPool pool_;
};

}  // namespace llm_serving
