#include "llm_serving/masking.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>

namespace llm_serving {
namespace {

static_assert(std::numeric_limits<float>::is_iec559, "masking writes IEEE 754 -inf bits");
constexpr float kMasked = -std::numeric_limits<float>::infinity();
constexpr uint32_t kMaskedBits = 0xff800000u;  // kMasked's IEEE 754 binary32 bits

constexpr std::array<uint32_t, 32> BitTable() {
  std::array<uint32_t, 32> bits{};
  for (std::size_t j = 0; j < bits.size(); ++j) bits[j] = 1u << j;
  return bits;
}
constexpr std::array<uint32_t, 32> kBit = BitTable();

// Keeps out[j] where bit j of `allowed` is set and writes -inf elsewhere, for `count` <= 32
// floats. A branch-free select on the floats' bits, which compilers vectorize for the baseline
// instruction set: one loop for every word, where a loop over the set bits ran once per masked
// token (a word allowing a few tokens of 32 took 30 scattered stores).
inline void MaskWord(float* out, uint32_t allowed, std::size_t count) {
  for (std::size_t j = 0; j < count; ++j) {
    uint32_t value;
    std::memcpy(&value, out + j, sizeof value);
    const uint32_t keep = (allowed & kBit[j]) != 0 ? ~0u : 0u;
    value = (value & keep) | (kMaskedBits & ~keep);
    std::memcpy(out + j, &value, sizeof value);
  }
}

}  // namespace

void MaskRow(float* logits, const uint32_t* bits, std::size_t columns) {
  const std::size_t full = columns / 32;
  for (std::size_t w = 0; w < full; ++w) {
    float* out = logits + w * 32;
    // Banned-token rows allow whole words, which need no write; item lists mask whole words,
    // which need no read (at a vocabulary of 128,256 most of a row is either).
    if (bits[w] == ~0u) continue;
    if (bits[w] == 0) {
      std::fill(out, out + 32, kMasked);
    } else {
      MaskWord(out, bits[w], 32);
    }
  }
  const std::size_t tail = columns % 32;
  if (tail != 0) MaskWord(logits + full * 32, bits[full], tail);
}

void MaskTask::RunChunk(std::size_t begin, std::size_t end) noexcept {
  for (std::size_t i = begin; i < end; ++i) {
    const auto row = static_cast<std::size_t>(rows[i]);
    MaskRow(logits + row * columns, bitmask + row * words, columns);
  }
}

}  // namespace llm_serving
