// Request slots 0..max_batch-1 and the batched, multithreaded next-token bitmask fill.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "llm_serving/constraint.h"
#include "llm_serving/masking.h"
#include "llm_serving/slot_state.h"
#include "llm_serving/worker_pool.h"

namespace llm_serving {

// What slot_info reports about one slot, copied under the engine's lock.
struct SlotInfo {
  uint64_t dead_ends = 0;
  uint64_t rejected_tokens = 0;
  bool finished = false;
};

// One decoding step of listed slots: slot slots[i] is reset when reset[i] != 0, advanced by
// tokens[begin[i], begin[i + 1]), then its bitmask row is written when fill[i] != 0.
struct StepPlan {
  std::vector<int32_t> slots;
  std::vector<uint8_t> reset;
  std::vector<uint8_t> fill;
  std::vector<std::size_t> begin{0};  // slots.size() + 1 offsets into tokens
  std::vector<int32_t> tokens;
};

// Thread-safe: every method takes the engine's lock, so calls from several threads run one at
// a time. A call first waits for a pending fill or step (FillAsync, StepAsync) to finish,
// whoever started it; it never waits for that thread's Wait(), so a thread that never calls it
// cannot stall the others.
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

  // Runs `plan` on the workers (each slot's reset, tokens and row are independent of the
  // others'), returning at once like FillAsync; Step waits for it. The slots must be distinct
  // and active, and filled slots below num_rows: both are checked before anything runs.
  std::shared_ptr<void> StepAsync(StepPlan plan, int32_t* bitmask, std::size_t num_rows,
                                  std::shared_ptr<void> keep_alive);
  void Step(StepPlan plan, int32_t* bitmask, std::size_t num_rows);

  // Sets logits[r, j] to -inf for every r < num_rows in `rows` (strictly increasing, below
  // bitmask_rows) and j < columns where bit j of bitmask[r] is 0; `logits` is
  // [num_rows, columns], `bitmask` [bitmask_rows, words()]. Rows past the logits are skipped
  // (slots can outnumber a step's rows). Waits for a pending fill or step first (it may be
  // writing `bitmask`).
  void MaskLogits(float* logits, std::size_t num_rows, std::size_t columns,
                  const int32_t* bitmask, std::size_t bitmask_rows, const int32_t* rows,
                  std::size_t count);

  bool active(std::size_t slot);
  // These wait for a pending fill: the fill updates the counters.
  SlotInfo Info(std::size_t slot);
  uint64_t total_dead_ends();

 private:
  void RunChunk(std::size_t begin, std::size_t end) noexcept override;
  void CheckSlot(std::size_t slot, const char* what) const;
  SlotState& Active(std::size_t slot);
  void Stage(int32_t* bitmask, std::size_t num_rows, const int32_t* rows, std::size_t count);
  void StageStep(StepPlan plan, int32_t* bitmask, std::size_t num_rows);
  uint64_t RunStep(std::size_t begin, std::size_t end);  // returns the dead ends it forced
  static uint64_t FillCounting(SlotState& state, uint32_t* row);
  void Launch(bool wake_workers);

  // Guards the members below (the sizes never change). Workers read them only during a fill,
  // and a holder waits for a pending fill before changing them.
  std::mutex mutex_;
  int32_t vocab_size_;
  std::size_t words_;
  std::vector<std::unique_ptr<SlotState>> slots_;
  std::vector<int32_t> rows_;  // rows of the fill in flight, preallocated
  std::vector<uint8_t> seen_;  // duplicate-row check, preallocated
  std::size_t num_fill_rows_ = 0;
  StepPlan step_;              // the step in flight; empty while a fill runs
  bool stepping_ = false;      // whether the task in flight is step_ rather than a fill
  uint32_t* bitmask_ = nullptr;
  std::shared_ptr<void> keep_alive_;  // the last FillAsync's, until a Wait hands it back
  // Every fill's dead ends, removed slots' included: a total read without visiting the slots.
  std::atomic<uint64_t> dead_ends_{0};
  MaskTask mask_task_;
  WorkerPool pool_;
};

}  // namespace llm_serving
