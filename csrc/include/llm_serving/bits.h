// Bit helpers over the int32/uint64 words of bitmasks and item sets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace llm_serving {

inline void SetBit(uint32_t* words, int32_t token) {
  words[static_cast<uint32_t>(token) >> 5] |= 1u << (static_cast<uint32_t>(token) & 31u);
}

inline void ClearBit(uint32_t* words, int32_t token) {
  words[static_cast<uint32_t>(token) >> 5] &= ~(1u << (static_cast<uint32_t>(token) & 31u));
}

inline bool TestBit(const uint64_t* words, uint32_t index) {
  return (words[index >> 6] >> (index & 63u)) & 1u;
}

// The first set bit in [pos, end), or `end` when there is none.
inline uint32_t NextSetBit(const uint64_t* words, uint32_t pos, uint32_t end) {
  if (pos >= end) return end;
  uint32_t w = pos >> 6;
  uint64_t bits = words[w] & (~uint64_t{0} << (pos & 63u));
  const uint32_t last_word = (end - 1) >> 6;
  while (bits == 0) {
    if (++w > last_word) return end;
    bits = words[w];
  }
  const uint32_t found = (w << 6) + static_cast<uint32_t>(__builtin_ctzll(bits));
  return found < end ? found : end;
}

// Whether every bit in [pos, end) is set (true for an empty range).
inline bool AllSet(const uint64_t* words, uint32_t pos, uint32_t end) {
  if (pos >= end) return true;
  const uint32_t first = pos >> 6;
  const uint32_t last = (end - 1) >> 6;
  const uint64_t head = ~uint64_t{0} << (pos & 63u);
  const uint64_t tail = ~uint64_t{0} >> (63u - ((end - 1) & 63u));
  if (first == last) return (words[first] & head & tail) == (head & tail);
  if ((words[first] & head) != head) return false;
  for (uint32_t w = first + 1; w < last; ++w) {
    if (words[w] != ~uint64_t{0}) return false;
  }
  return (words[last] & tail) == tail;
}

inline std::size_t WordsFor(int32_t vocab_size) {
  return (static_cast<std::size_t>(vocab_size) + 31) / 32;
}

}  // namespace llm_serving
