#include "llm_serving/masking.h"

#include <algorithm>
#include <limits>

namespace llm_serving {
namespace {

constexpr float kMasked = -std::numeric_limits<float>::infinity();

// Sets out[b] to -inf for every set bit b of `masked`.
inline void MaskBits(float* out, uint32_t masked) {
  while (masked != 0) {
    out[__builtin_ctz(masked)] = kMasked;
    masked &= masked - 1;
  }
}

}  // namespace

void MaskRow(float* logits, const uint32_t* bits, std::size_t columns) {
  const std::size_t full = columns / 32;
  for (std::size_t w = 0; w < full; ++w) {
    const uint32_t word = bits[w];
    if (word == ~0u) continue;
    float* out = logits + w * 32;
    // Constrained rows allow few tokens: whole masked words are the common case, and a
    // straight fill of 32 floats vectorizes where the bit loop does not.
    if (word == 0) {
      std::fill(out, out + 32, kMasked);
    } else {
      MaskBits(out, ~word);
    }
  }
  const std::size_t tail = columns % 32;
  if (tail != 0) MaskBits(logits + full * 32, ~bits[full] & ((1u << tail) - 1u));
}

void MaskTask::RunChunk(std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const auto row = static_cast<std::size_t>(rows[i]);
    MaskRow(logits + row * columns, bitmask + row * words, columns);
  }
}

}  // namespace llm_serving
