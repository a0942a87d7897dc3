// The decoding state of one request: advances with tokens and writes its bitmask row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "llm_serving/constraint.h"

namespace llm_serving {

enum class Phase : uint8_t {
  kPrefix,
  kItem,
  kSeparator,
  kTerminator,
  kEnd,
  kMachine,
  kFree,
  kDone,
  kFailed,
};

class SlotState {
 public:
  // Allocates the per-request copies (a unique item list owns its available set).
  explicit SlotState(std::shared_ptr<const Constraint> constraint);

  // Back to the state before the first output token; counters are kept.
  void Reset();
  // Consumes one token; a token outside the allowed set fails the request (counted).
  void Advance(int32_t token);
  // Writes the next-token bitmask into `row` (constraint().words words). Never allocates.
  void FillRow(uint32_t* row);

  const Constraint& constraint() const { return *constraint_; }
  Phase phase() const { return phase_; }
  uint64_t dead_ends() const { return dead_ends_; }
  uint64_t rejected_tokens() const { return rejected_tokens_; }

 private:
  struct AfterItem {
    bool has_children;
    bool complete;
    bool can_separate;
    bool can_terminate;
  };

  // A position in decoded matching's byte language; items completed by bytes not yet
  // committed are locals_[0, num_local) (unique lists only).
  struct Cursor {
    Phase phase;
    uint32_t pos;
    uint32_t node;
    uint32_t count;
    uint32_t num_local;
  };

  const uint64_t* available() const;
  bool AnyAvailable(uint32_t lo, uint32_t hi) const;
  AfterItem After() const;
  int32_t TerminatorFirst() const;
  bool FillItemRow(uint32_t* row) const;  // returns whether the terminator was forced
  void AdvanceItem(int32_t token);
  void Complete(uint32_t rank);
  void StepPiece(const std::vector<int32_t>& piece, int32_t token, Phase then);
  void Fail();

  // Decoded matching.
  Cursor Here() const { return {phase_, pos_, node_, count_, 0}; }
  bool IsLocal(uint32_t rank, const Cursor& c) const;
  bool AnyAvailableExcept(uint32_t lo, uint32_t hi, const Cursor& c) const;
  AfterItem AfterAt(const Cursor& c) const;
  bool StepByte(Cursor& c, uint8_t byte);
  bool EndAllowed(const Cursor& c) const;
  // Sets the bit of every token below `vnode` whose bytes `c` accepts; with a null row it
  // stops at the first such token. Returns whether it found one.
  bool Walk(uint32_t vnode, const Cursor& c, uint32_t* row);
  // Walk's step along one byte: the vocabulary child by `byte`, if `c` accepts the byte.
  bool WalkByte(uint32_t vnode, const Cursor& c, uint8_t byte, uint32_t* row);
  // Sets the tokens ending at vocabulary node `vchild` and walks below it from `next`.
  bool Descend(uint32_t vchild, const Cursor& next, uint32_t* row);
  bool FillDecodedRow(uint32_t* row);  // returns whether end of sequence was forced
  void AdvanceDecoded(int32_t token);

  std::shared_ptr<const Constraint> constraint_;
  Phase phase_ = Phase::kFree;
  uint32_t pos_ = 0;
  uint32_t node_ = 0;
  uint32_t count_ = 0;
  uint32_t state_ = 0;
  uint32_t num_available_ = 0;
  std::vector<uint64_t> available_;  // unique lists only
  std::vector<uint32_t> root_mask_;  // unique lists only
  std::vector<uint32_t> locals_;     // decoded unique lists: one entry per byte of a token
  uint64_t dead_ends_ = 0;
  uint64_t rejected_tokens_ = 0;
};

}  // namespace llm_serving
