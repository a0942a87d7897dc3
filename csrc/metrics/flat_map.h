// Open-addressing hash tables for the lookups each merge makes per series: one array and no
// node per entry (std::unordered_map's node chase was a tenth of a scrape), and string keys
// found by a view without building a std::string (C++17's unordered_map cannot).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

namespace llm_serving::metrics {

struct StringHash {
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct PointerHash {
  size_t operator()(const void* p) const {
    // Allocations are aligned, so the low bits say little: mixed (murmur3's finaliser).
    uint64_t x = reinterpret_cast<uintptr_t>(p);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return static_cast<size_t>(x);
  }
};

// Linear probing at most half full; entries are only added, or all cleared at once. Pointers
// to values stay valid until the next Emplace.
template <typename Key, typename Value, typename Hash>
class FlatMap {
 public:
  explicit FlatMap(size_t expected = 0) { Reserve(expected); }

  size_t size() const { return size_; }

  void Reserve(size_t expected) {
    size_t capacity = kMinCapacity;
    while (capacity < 2 * expected) capacity *= 2;
    if (capacity > slots_.size()) Rehash(capacity);
  }

  void Clear() {
    slots_.assign(kMinCapacity, Slot{});
    size_ = 0;
  }

  template <typename K>
  Value* Find(const K& key) {
    if (slots_.empty()) return nullptr;
    for (size_t i = Hash{}(key) & Mask();; i = (i + 1) & Mask()) {
      Slot& slot = slots_[i];
      if (!slot.used) return nullptr;
      if (slot.key == key) return &slot.value;
    }
  }

  // The value under `key`, and whether it was added (as `value`) by this call.
  template <typename K>
  std::pair<Value*, bool> Emplace(K&& key, Value value) {
    if (2 * (size_ + 1) > slots_.size()) Rehash(slots_.empty() ? kMinCapacity : 2 * slots_.size());
    for (size_t i = Hash{}(key) & Mask();; i = (i + 1) & Mask()) {
      Slot& slot = slots_[i];
      if (!slot.used) {
        slot.key = Key(std::forward<K>(key));
        slot.value = std::move(value);
        slot.used = true;
        ++size_;
        return {&slot.value, true};
      }
      if (slot.key == key) return {&slot.value, false};
    }
  }

 private:
  static constexpr size_t kMinCapacity = 16;
  struct Slot {
    Key key{};
    Value value{};
    bool used = false;
  };

  size_t Mask() const { return slots_.size() - 1; }

  void Rehash(size_t capacity) {
    std::vector<Slot> old(capacity);
    old.swap(slots_);
    for (Slot& slot : old) {
      if (!slot.used) continue;
      for (size_t i = Hash{}(slot.key) & Mask();; i = (i + 1) & Mask()) {
        if (!slots_[i].used) {
          slots_[i] = std::move(slot);
          break;
        }
      }
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace llm_serving::metrics
