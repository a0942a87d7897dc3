#include "llm_serving/batch_engine.h"

#include <algorithm>
#include <string>
#include <utility>

#include "llm_serving/bits.h"
#include "llm_serving/errors.h"

namespace llm_serving {
namespace {

// Rows per chunk: several chunks per thread so a slow row does not idle the others, but never
// so few rows that handing a chunk to another thread costs more than filling it.
constexpr std::size_t kChunksPerThread = 4;
constexpr std::size_t kMinRowsPerChunk = 16;
// Logits a masking chunk covers: waking a worker pays only above about a megabyte of floats,
// so a small vocabulary's batch is masked by the calling thread alone.
constexpr std::size_t kMaskFloatsPerChunk = std::size_t{1} << 18;

}  // namespace

BatchEngine::BatchEngine(std::size_t max_batch, int32_t vocab_size, std::size_t num_threads)
    : vocab_size_(vocab_size),
      words_(WordsFor(vocab_size)),
      slots_(max_batch),
      rows_(max_batch),
      seen_(max_batch, 0),
      pool_(std::max<std::size_t>(num_threads, 1)) {
  if (max_batch == 0) throw ConfigError("max_batch must be at least 1");
  if (vocab_size <= 0) throw ConfigError("vocab_size must be positive");
}

BatchEngine::~BatchEngine() {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
}

void BatchEngine::CheckSlot(std::size_t slot, const char* what) const {
  if (slot >= slots_.size()) {
    throw ConfigError(std::string(what) + " " + std::to_string(slot) + " is not in 0.." +
                      std::to_string(slots_.size() - 1));
  }
}

SlotState& BatchEngine::Active(std::size_t slot) {
  CheckSlot(slot, "slot");
  if (!slots_[slot]) {
    throw StateError("slot " + std::to_string(slot) + " holds no constraint");
  }
  return *slots_[slot];
}

void BatchEngine::Add(std::size_t slot, std::shared_ptr<const Constraint> constraint) {
  CheckSlot(slot, "slot");
  if (!constraint) throw ConfigError("constraint is missing");
  if (constraint->vocab_size != vocab_size_) {
    throw ConfigError("the constraint was built for a vocabulary of " +
                      std::to_string(constraint->vocab_size) + ", the engine has " +
                      std::to_string(vocab_size_));
  }
  auto state = std::make_unique<SlotState>(std::move(constraint));
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  slots_[slot] = std::move(state);
}

void BatchEngine::Remove(std::size_t slot) {
  CheckSlot(slot, "slot");
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  slots_[slot].reset();
}

void BatchEngine::Move(std::size_t from, std::size_t to) {
  CheckSlot(from, "move source");
  CheckSlot(to, "move target");
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  if (from == to) return;
  slots_[to] = std::move(slots_[from]);
}

void BatchEngine::Swap(std::size_t a, std::size_t b) {
  CheckSlot(a, "swap slot");
  CheckSlot(b, "swap slot");
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  std::swap(slots_[a], slots_[b]);
}

void BatchEngine::Reset(std::size_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  SlotState& state = Active(slot);
  pool_.Wait();
  state.Reset();
}

void BatchEngine::Advance(std::size_t slot, const int32_t* tokens, std::size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  SlotState& state = Active(slot);
  pool_.Wait();
  for (std::size_t i = 0; i < count; ++i) state.Advance(tokens[i]);
}

void BatchEngine::AdvanceBatch(const int32_t* slots, const int32_t* tokens, std::size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < count; ++i) {
    if (slots[i] < 0) throw ConfigError("slot " + std::to_string(slots[i]) + " is negative");
    Active(static_cast<std::size_t>(slots[i]));
  }
  pool_.Wait();
  for (std::size_t i = 0; i < count; ++i) slots_[static_cast<std::size_t>(slots[i])]->Advance(tokens[i]);
}

void BatchEngine::Stage(int32_t* bitmask, std::size_t num_rows, const int32_t* rows,
                        std::size_t count) {
  pool_.Wait();
  if (count > slots_.size()) {
    throw ConfigError("got " + std::to_string(count) + " rows for a batch of " +
                      std::to_string(slots_.size()));
  }
  std::size_t kept = 0;
  std::size_t i = 0;
  for (; i < count; ++i) {
    const int32_t row = rows[i];
    if (row < 0 || static_cast<std::size_t>(row) >= slots_.size() ||
        static_cast<std::size_t>(row) >= num_rows) {
      break;
    }
    if (seen_[static_cast<std::size_t>(row)] != 0) break;
    seen_[static_cast<std::size_t>(row)] = 1;
    if (slots_[static_cast<std::size_t>(row)]) rows_[kept++] = row;
  }
  for (std::size_t j = 0; j < i; ++j) seen_[static_cast<std::size_t>(rows[j])] = 0;
  if (i < count) {
    const int32_t row = rows[i];
    const bool in_range = row >= 0 && static_cast<std::size_t>(row) < slots_.size() &&
                          static_cast<std::size_t>(row) < num_rows;
    throw ConfigError(in_range ? "row " + std::to_string(row) + " is listed twice"
                               : "row " + std::to_string(row) + " is outside the bitmask's " +
                                     std::to_string(std::min(num_rows, slots_.size())) + " rows");
  }
  bitmask_ = reinterpret_cast<uint32_t*>(bitmask);
  num_fill_rows_ = kept;
  stepping_ = false;
}

void BatchEngine::StageStep(StepPlan plan, int32_t* bitmask, std::size_t num_rows) {
  pool_.Wait();
  const std::size_t count = plan.slots.size();
  if (plan.reset.size() != count || plan.fill.size() != count || plan.begin.size() != count + 1 ||
      plan.begin.back() != plan.tokens.size()) {
    throw ConfigError("inconsistent step plan");
  }
  std::size_t i = 0;
  std::string error;
  bool inactive = false;
  for (; i < count; ++i) {
    const int32_t slot = plan.slots[i];
    if (slot < 0 || static_cast<std::size_t>(slot) >= slots_.size()) {
      error = "slot " + std::to_string(slot) + " is not in 0.." +
              std::to_string(slots_.size() - 1);
      break;
    }
    const auto index = static_cast<std::size_t>(slot);
    if (seen_[index] != 0) {
      error = "slot " + std::to_string(slot) + " is listed twice";
      break;
    }
    if (!slots_[index]) {
      error = "slot " + std::to_string(slot) + " holds no constraint";
      inactive = true;
      break;
    }
    if (plan.fill[i] != 0 && index >= num_rows) {
      error = "row " + std::to_string(slot) + " is outside the bitmask's " +
              std::to_string(num_rows) + " rows";
      break;
    }
    seen_[index] = 1;
  }
  for (std::size_t j = 0; j < i; ++j) seen_[static_cast<std::size_t>(plan.slots[j])] = 0;
  if (inactive) throw StateError(error);
  if (!error.empty()) throw ConfigError(error);
  step_ = std::move(plan);
  stepping_ = true;
  bitmask_ = reinterpret_cast<uint32_t*>(bitmask);
  num_fill_rows_ = count;
}

std::shared_ptr<void> BatchEngine::StepAsync(StepPlan plan, int32_t* bitmask,
                                             std::size_t num_rows,
                                             std::shared_ptr<void> keep_alive) {
  std::lock_guard<std::mutex> lock(mutex_);
  StageStep(std::move(plan), bitmask, num_rows);
  // A single chunk is left to Wait(): a small step costs less than waking a worker, which
  // on a busy core preempts the caller for about as long as the step takes.
  Launch(/*wake_workers=*/false);
  std::swap(keep_alive_, keep_alive);
  return keep_alive;
}

void BatchEngine::Step(StepPlan plan, int32_t* bitmask, std::size_t num_rows) {
  std::lock_guard<std::mutex> lock(mutex_);
  StageStep(std::move(plan), bitmask, num_rows);
  Launch(/*wake_workers=*/false);
  pool_.Wait();
}

uint64_t BatchEngine::RunStep(std::size_t begin, std::size_t end) {
  uint64_t dead_ends = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const auto slot = static_cast<std::size_t>(step_.slots[i]);
    SlotState& state = *slots_[slot];
    if (step_.reset[i] != 0) state.Reset();
    for (std::size_t t = step_.begin[i]; t < step_.begin[i + 1]; ++t) {
      state.Advance(step_.tokens[t]);
    }
    if (step_.fill[i] != 0) dead_ends += FillCounting(state, bitmask_ + slot * words_);
  }
  return dead_ends;
}

void BatchEngine::Launch(bool wake_workers) {
  const std::size_t chunks = pool_.num_threads() * kChunksPerThread;
  const std::size_t chunk = std::max((num_fill_rows_ + chunks - 1) / chunks, kMinRowsPerChunk);
  pool_.Submit(this, num_fill_rows_, chunk, wake_workers);
}

void BatchEngine::Fill(int32_t* bitmask, std::size_t num_rows, const int32_t* rows,
                       std::size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  Stage(bitmask, num_rows, rows, count);
  Launch(/*wake_workers=*/false);
  pool_.Wait();
}

std::shared_ptr<void> BatchEngine::FillAsync(int32_t* bitmask, std::size_t num_rows,
                                             const int32_t* rows, std::size_t count,
                                             std::shared_ptr<void> keep_alive) {
  std::lock_guard<std::mutex> lock(mutex_);
  Stage(bitmask, num_rows, rows, count);
  Launch(/*wake_workers=*/true);
  std::swap(keep_alive_, keep_alive);
  return keep_alive;
}

std::shared_ptr<void> BatchEngine::Wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  return std::move(keep_alive_);
}

void BatchEngine::MaskLogits(float* logits, std::size_t num_rows, std::size_t columns,
                             const int32_t* bitmask, std::size_t bitmask_rows,
                             const int32_t* rows, std::size_t count) {
  if (columns > words_ * 32) {
    throw ConfigError("logits have " + std::to_string(columns) + " columns, the bitmask covers " +
                      std::to_string(words_ * 32) + " tokens");
  }
  std::size_t masked = 0;  // rows before the first one past the logits
  for (std::size_t i = 0; i < count; ++i) {
    if (rows[i] < 0 || static_cast<std::size_t>(rows[i]) >= bitmask_rows) {
      throw ConfigError("row " + std::to_string(rows[i]) + " is outside the bitmask's " +
                        std::to_string(bitmask_rows) + " rows");
    }
    // Increasing rows never share a chunk's row with another chunk.
    if (i > 0 && rows[i] <= rows[i - 1]) throw ConfigError("rows must be strictly increasing");
    if (static_cast<std::size_t>(rows[i]) < num_rows) masked = i + 1;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  mask_task_.logits = logits;
  mask_task_.columns = columns;
  mask_task_.bitmask = reinterpret_cast<const uint32_t*>(bitmask);
  mask_task_.words = words_;
  mask_task_.rows = rows;
  const std::size_t chunk =
      std::max<std::size_t>(kMaskFloatsPerChunk / std::max<std::size_t>(columns, 1), 1);
  pool_.Submit(&mask_task_, masked, chunk, /*wake_workers=*/false);
  pool_.Wait();
}

uint64_t BatchEngine::FillCounting(SlotState& state, uint32_t* row) {
  const uint64_t before = state.dead_ends();
  state.FillRow(row);
  return state.dead_ends() - before;
}

void BatchEngine::RunChunk(std::size_t begin, std::size_t end) noexcept {
  uint64_t dead_ends = 0;
  if (stepping_) {
    dead_ends = RunStep(begin, end);
  } else {
    for (std::size_t i = begin; i < end; ++i) {
      const auto row = static_cast<std::size_t>(rows_[i]);
      dead_ends += FillCounting(*slots_[row], bitmask_ + row * words_);
    }
  }
  if (dead_ends != 0) dead_ends_.fetch_add(dead_ends, std::memory_order_relaxed);
}

bool BatchEngine::active(std::size_t slot) {
  CheckSlot(slot, "slot");
  std::lock_guard<std::mutex> lock(mutex_);
  return slots_[slot] != nullptr;
}

SlotInfo BatchEngine::Info(std::size_t slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  const SlotState& state = Active(slot);
  SlotInfo info;
  info.dead_ends = state.dead_ends();
  info.rejected_tokens = state.rejected_tokens();
  info.finished = state.phase() == Phase::kDone || state.phase() == Phase::kFailed;
  return info;
}

uint64_t BatchEngine::total_dead_ends() {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  return dead_ends_.load(std::memory_order_relaxed);
}

}  // namespace llm_serving
