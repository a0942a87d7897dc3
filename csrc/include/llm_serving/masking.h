// Applying next-token bitmasks to float32 logits: every token whose bit is 0 gets -inf.
#pragma once

#include <cstddef>
#include <cstdint>

#include "llm_serving/worker_pool.h"

namespace llm_serving {

// Sets logits[j] to -inf for every j < columns whose bit (bit j%32 of bits[j/32]) is 0.
void MaskRow(float* logits, const uint32_t* bits, std::size_t columns);

// MaskRow over listed rows: row r of `logits` ([*, columns], C-contiguous) with row r of
// `bitmask` ([*, words]). The fields are set before the task is submitted.
class MaskTask : public ChunkedTask {
 public:
  float* logits = nullptr;
  std::size_t columns = 0;
  const uint32_t* bitmask = nullptr;
  std::size_t words = 0;
  const int32_t* rows = nullptr;

  void RunChunk(std::size_t begin, std::size_t end) noexcept override;
};

}  // namespace llm_serving
