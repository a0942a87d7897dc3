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
  RemoveLocked(slot);
  slots_[slot] = std::move(state);
}

void BatchEngine::RemoveLocked(std::size_t slot) {
  if (slots_[slot]) removed_dead_ends_ += slots_[slot]->dead_ends();
  slots_[slot].reset();
}

void BatchEngine::Remove(std::size_t slot) {
  CheckSlot(slot, "slot");
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  RemoveLocked(slot);
}

void BatchEngine::Move(std::size_t from, std::size_t to) {
  CheckSlot(from, "move source");
  CheckSlot(to, "move target");
  std::lock_guard<std::mutex> lock(mutex_);
  pool_.Wait();
  if (from == to) return;
  RemoveLocked(to);
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

void BatchEngine::RunChunk(std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const auto row = static_cast<std::size_t>(rows_[i]);
    slots_[row]->FillRow(bitmask_ + row * words_);
  }
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
  uint64_t total = removed_dead_ends_;
  for (const auto& slot : slots_) {
    if (slot) total += slot->dead_ends();
  }
  return total;
}

}  // namespace llm_serving
