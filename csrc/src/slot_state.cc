#include "llm_serving/slot_state.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "llm_serving/bits.h"

namespace llm_serving {

SlotState::SlotState(std::shared_ptr<const Constraint> constraint)
    : constraint_(std::move(constraint)) {
  const ItemListRule& rule = constraint_->item_list;
  if (constraint_->kind == RuleKind::kItemList && rule.unique) {
    available_.resize(rule.available.size());
    root_mask_.resize(rule.root_mask.size());
    // A token completes at most one item per byte it holds.
    if (rule.vocab) locals_.resize(rule.vocab->max_token_length() + 1);
  }
  Reset();
}

void SlotState::Reset() {
  const Constraint& c = *constraint_;
  pos_ = count_ = 0;
  node_ = CatalogTrie::kRoot;
  switch (c.kind) {
    case RuleKind::kItemList:
      phase_ = c.item_list.prefix.empty() ? Phase::kItem : Phase::kPrefix;
      num_available_ = c.item_list.num_available;
      if (c.item_list.unique) {
        std::copy(c.item_list.available.begin(), c.item_list.available.end(), available_.begin());
        std::copy(c.item_list.root_mask.begin(), c.item_list.root_mask.end(), root_mask_.begin());
      }
      break;
    case RuleKind::kMachine:
      phase_ = Phase::kMachine;
      state_ = c.machine.initial_state;
      break;
    case RuleKind::kFree:
      phase_ = Phase::kFree;
      break;
  }
}

const uint64_t* SlotState::available() const {
  return constraint_->item_list.unique ? available_.data() : constraint_->item_list.available.data();
}

bool SlotState::AnyAvailable(uint32_t lo, uint32_t hi) const {
  return NextSetBit(available(), lo, hi) < hi;
}

int32_t SlotState::TerminatorFirst() const {
  const auto& terminator = constraint_->item_list.terminator;
  return terminator.empty() ? constraint_->eos_token_id : terminator[0];
}

SlotState::AfterItem SlotState::After() const {
  const ItemListRule& rule = constraint_->item_list;
  const TrieNode& node = rule.trie->node(node_);
  AfterItem after{};
  const bool terminal = node.item_rank >= 0;
  after.has_children = node_ == CatalogTrie::kRoot
                           ? num_available_ > 0
                           : AnyAvailable(node.lo + (terminal ? 1u : 0u), node.hi);
  after.complete = terminal && TestBit(available(), static_cast<uint32_t>(node.item_rank));
  if (after.complete) {
    const uint32_t k = count_ + 1;
    const uint32_t remaining = num_available_ - (rule.unique ? 1u : 0u);
    after.can_separate = (rule.max_items == 0 || k < rule.max_items) && remaining > 0;
    after.can_terminate = k >= rule.min_items;
  }
  return after;
}

bool SlotState::FillItemRow(uint32_t* row) const {
  const Constraint& c = *constraint_;
  const ItemListRule& rule = c.item_list;
  const CatalogTrie& trie = *rule.trie;
  if (node_ == CatalogTrie::kRoot) {
    const auto& mask = rule.unique ? root_mask_ : rule.root_mask;
    std::memcpy(row, mask.data(), c.words * sizeof(uint32_t));
  } else {
    std::memset(row, 0, c.words * sizeof(uint32_t));
    const TrieNode& node = trie.node(node_);
    const uint64_t* bits = available();
    const uint32_t lo = node.lo + (node.item_rank >= 0 ? 1u : 0u);
    if (AllSet(bits, lo, node.hi)) {
      // Nothing below is used up or left out: the row is every child's token.
      const int32_t* tokens = trie.child_tokens(node);
      for (uint32_t k = 0; k < node.num_children; ++k) SetBit(row, tokens[k]);
    } else {
      uint32_t r = NextSetBit(bits, lo, node.hi);
      while (r < node.hi) {
        const TrieNode& child = trie.node(trie.ChildContaining(node_, r));
        SetBit(row, child.token);
        r = NextSetBit(bits, child.hi, node.hi);
      }
    }
  }
  const AfterItem after = After();
  if (after.can_separate) SetBit(row, rule.separator[0]);
  if (after.can_terminate) SetBit(row, TerminatorFirst());
  if (!after.has_children && !after.can_separate && !after.can_terminate) {
    SetBit(row, TerminatorFirst());
    return true;
  }
  return false;
}

void SlotState::FillRow(uint32_t* row) {
  const Constraint& c = *constraint_;
  const std::size_t words = c.words;
  bool forced = false;
  const bool decoded = c.kind == RuleKind::kItemList && c.item_list.vocab != nullptr &&
                       phase_ != Phase::kDone && phase_ != Phase::kFailed;
  if (decoded) {
    forced = FillDecodedRow(row);
  } else {
    switch (phase_) {
      case Phase::kItem:
        forced = FillItemRow(row);
        break;
      case Phase::kPrefix:
      case Phase::kSeparator:
      case Phase::kTerminator: {
        const ItemListRule& rule = c.item_list;
        const auto& piece = phase_ == Phase::kPrefix      ? rule.prefix
                            : phase_ == Phase::kSeparator ? rule.separator
                                                          : rule.terminator;
        std::memset(row, 0, words * sizeof(uint32_t));
        SetBit(row, piece[pos_]);
        break;
      }
      case Phase::kMachine: {
        const MachineRule& m = c.machine;
        std::memset(row, 0, words * sizeof(uint32_t));
        for (uint32_t k = m.offsets[state_]; k < m.offsets[state_ + 1]; ++k) {
          SetBit(row, m.tokens[k]);
        }
        const bool accepting = m.accepting[state_] != 0;
        if (accepting) SetBit(row, c.eos_token_id);
        if (!accepting && m.offsets[state_] == m.offsets[state_ + 1]) {
          SetBit(row, c.eos_token_id);
          forced = true;
        }
        break;
      }
      case Phase::kFree: {
        std::memset(row, 0xff, words * sizeof(uint32_t));
        const uint32_t tail = static_cast<uint32_t>(c.vocab_size) & 31u;
        if (tail != 0) row[words - 1] = (1u << tail) - 1;
        break;
      }
      case Phase::kEnd:
      case Phase::kDone:
      case Phase::kFailed:
        std::memset(row, 0, words * sizeof(uint32_t));
        SetBit(row, c.eos_token_id);
        break;
    }
  }
  if (!c.not_banned.empty()) {
    uint32_t any = 0;
    const uint32_t* keep = c.not_banned.data();
    for (std::size_t w = 0; w < words; ++w) any |= (row[w] &= keep[w]);
    if (any == 0) {
      SetBit(row, c.eos_token_id);
      forced = true;
    }
  }
  if (forced) ++dead_ends_;
}

void SlotState::Fail() {
  phase_ = Phase::kFailed;
  ++rejected_tokens_;
}

void SlotState::StepPiece(const std::vector<int32_t>& piece, int32_t token, Phase then) {
  if (token != piece[pos_]) return Fail();
  if (++pos_ == piece.size()) {
    pos_ = 0;
    phase_ = then;
    node_ = CatalogTrie::kRoot;
  }
}

void SlotState::Complete(uint32_t rank) {
  ++count_;
  const ItemListRule& rule = constraint_->item_list;
  if (!rule.unique) return;
  available_[rank >> 6] &= ~(uint64_t{1} << (rank & 63u));
  --num_available_;
  const CatalogTrie& trie = *rule.trie;
  const TrieNode& first = trie.node(trie.ChildContaining(CatalogTrie::kRoot, rank));
  if (!AnyAvailable(first.lo, first.hi)) ClearBit(root_mask_.data(), first.token);
}

void SlotState::AdvanceItem(int32_t token) {
  const ItemListRule& rule = constraint_->item_list;
  const CatalogTrie& trie = *rule.trie;
  const uint32_t child = trie.Child(node_, token);
  if (child != CatalogTrie::kNone && AnyAvailable(trie.node(child).lo, trie.node(child).hi)) {
    node_ = child;
    return;
  }
  const AfterItem after = After();
  const int32_t term_first = TerminatorFirst();
  const bool forced = !after.has_children && !after.can_separate && !after.can_terminate;
  if (token == rule.separator[0] && after.can_separate) {
    Complete(static_cast<uint32_t>(trie.node(node_).item_rank));
    phase_ = Phase::kSeparator;
    pos_ = 1;
    if (rule.separator.size() == 1) {
      phase_ = Phase::kItem;
      pos_ = 0;
      node_ = CatalogTrie::kRoot;
    }
  } else if (token == term_first && (after.can_terminate || forced)) {
    if (token == constraint_->eos_token_id) {
      phase_ = Phase::kDone;
      return;
    }
    if (after.complete) Complete(static_cast<uint32_t>(trie.node(node_).item_rank));
    phase_ = Phase::kTerminator;
    pos_ = 1;
    if (rule.terminator.size() == 1) {
      phase_ = Phase::kEnd;
      pos_ = 0;
    }
  } else {
    Fail();
  }
}

void SlotState::Advance(int32_t token) {
  const Constraint& c = *constraint_;
  if (token < 0 || token >= c.vocab_size) return Fail();
  if (c.kind == RuleKind::kItemList && c.item_list.vocab != nullptr &&
      (phase_ == Phase::kPrefix || phase_ == Phase::kItem || phase_ == Phase::kSeparator ||
       phase_ == Phase::kTerminator)) {
    return AdvanceDecoded(token);
  }
  switch (phase_) {
    case Phase::kItem:
      return AdvanceItem(token);
    case Phase::kPrefix:
      return StepPiece(c.item_list.prefix, token, Phase::kItem);
    case Phase::kSeparator:
      return StepPiece(c.item_list.separator, token, Phase::kItem);
    case Phase::kTerminator:
      return StepPiece(c.item_list.terminator, token, Phase::kEnd);
    case Phase::kMachine: {
      const MachineRule& m = c.machine;
      const auto first = m.tokens.begin() + m.offsets[state_];
      const auto last = m.tokens.begin() + m.offsets[state_ + 1];
      const auto it = std::lower_bound(first, last, token);
      if (it != last && *it == token) {
        state_ = m.next_states[static_cast<std::size_t>(it - m.tokens.begin())];
      } else if (token == c.eos_token_id && (m.accepting[state_] != 0 || first == last)) {
        phase_ = Phase::kDone;
      } else {
        Fail();
      }
      return;
    }
    case Phase::kFree:
      if (token == c.eos_token_id) phase_ = Phase::kDone;
      return;
    case Phase::kEnd:
    case Phase::kDone:
    case Phase::kFailed:
      if (token == c.eos_token_id) {
        if (phase_ == Phase::kEnd) phase_ = Phase::kDone;
        return;
      }
      return Fail();
  }
}

bool SlotState::IsLocal(uint32_t rank, const Cursor& c) const {
  for (uint32_t i = 0; i < c.num_local; ++i) {
    if (locals_[i] == rank) return true;
  }
  return false;
}

bool SlotState::AnyAvailableExcept(uint32_t lo, uint32_t hi, const Cursor& c) const {
  const uint64_t* bits = available();
  // Skips at most the items this token completed, so the loop is short.
  for (uint32_t r = NextSetBit(bits, lo, hi); r < hi; r = NextSetBit(bits, r + 1, hi)) {
    if (!IsLocal(r, c)) return true;
  }
  return false;
}

SlotState::AfterItem SlotState::AfterAt(const Cursor& c) const {
  const ItemListRule& rule = constraint_->item_list;
  const TrieNode& node = rule.trie->node(c.node);
  AfterItem after{};
  const auto rank = static_cast<uint32_t>(node.item_rank);
  after.complete = node.item_rank >= 0 && TestBit(available(), rank) && !IsLocal(rank, c);
  if (after.complete) {
    const uint32_t k = c.count + 1;
    const uint32_t remaining = num_available_ - (rule.unique ? c.num_local + 1 : 0u);
    after.can_separate = (rule.max_items == 0 || k < rule.max_items) && remaining > 0;
    after.can_terminate = k >= rule.min_items;
  }
  return after;
}

bool SlotState::StepByte(Cursor& c, uint8_t byte) {
  const ItemListRule& rule = constraint_->item_list;
  switch (c.phase) {
    case Phase::kPrefix:
    case Phase::kSeparator:
    case Phase::kTerminator: {
      const auto& piece = c.phase == Phase::kPrefix      ? rule.prefix
                          : c.phase == Phase::kSeparator ? rule.separator
                                                         : rule.terminator;
      if (piece[c.pos] != byte) return false;
      if (++c.pos == piece.size()) {
        c.phase = c.phase == Phase::kTerminator ? Phase::kEnd : Phase::kItem;
        c.pos = 0;
        c.node = CatalogTrie::kRoot;
      }
      return true;
    }
    case Phase::kItem: {
      const CatalogTrie& trie = *rule.trie;
      const uint32_t child = trie.Child(c.node, byte);
      if (child != CatalogTrie::kNone &&
          AnyAvailableExcept(trie.node(child).lo, trie.node(child).hi, c)) {
        c.node = child;
        return true;
      }
      // Plans refuse pieces whose first byte continues an item, so ending here is the only
      // reading left.
      const AfterItem after = AfterAt(c);
      const bool separate = after.can_separate && byte == rule.separator[0];
      const bool terminate = !separate && after.can_terminate && !rule.terminator.empty() &&
                             byte == rule.terminator[0];
      if (!separate && !terminate) return false;
      if (rule.unique) locals_[c.num_local++] = static_cast<uint32_t>(trie.node(c.node).item_rank);
      ++c.count;
      c.phase = separate ? Phase::kSeparator : Phase::kTerminator;
      c.pos = 0;
      c.node = CatalogTrie::kRoot;
      return StepByte(c, byte);
    }
    default:
      return false;
  }
}

bool SlotState::EndAllowed(const Cursor& c) const {
  if (c.phase == Phase::kEnd) return true;
  if (c.phase != Phase::kItem || !constraint_->item_list.terminator.empty()) return false;
  return AfterAt(c).can_terminate;
}

bool SlotState::WalkByte(uint32_t vnode, const Cursor& c, uint8_t byte, uint32_t* row) {
  const uint32_t child = constraint_->item_list.vocab->Child(vnode, byte);
  if (child == VocabTrie::kNone) return false;
  Cursor next = c;
  if (!StepByte(next, byte)) return false;  // prunes every token under this child
  return Descend(child, next, row);
}

bool SlotState::Descend(uint32_t vchild, const Cursor& next, uint32_t* row) {
  const VocabTrie& vocab = *constraint_->item_list.vocab;
  const VocabNode& child = vocab.node(vchild);
  const int32_t eos = constraint_->eos_token_id;
  const int32_t* tokens = vocab.tokens(child);
  bool found = false;
  for (uint32_t k = 0; k < child.tokens_end - child.tokens_begin; ++k) {
    if (tokens[k] == eos) continue;
    if (row == nullptr) return true;
    SetBit(row, tokens[k]);
    found = true;
  }
  if (child.num_children > 0 && Walk(vchild, next, row)) found = true;
  return found;
}

bool SlotState::Walk(uint32_t vnode, const Cursor& c, uint32_t* row) {
  const ItemListRule& rule = constraint_->item_list;
  switch (c.phase) {
    case Phase::kPrefix:
      return WalkByte(vnode, c, static_cast<uint8_t>(rule.prefix[c.pos]), row);
    case Phase::kSeparator:
      return WalkByte(vnode, c, static_cast<uint8_t>(rule.separator[c.pos]), row);
    case Phase::kTerminator:
      return WalkByte(vnode, c, static_cast<uint8_t>(rule.terminator[c.pos]), row);
    case Phase::kItem:
      break;
    default:
      return false;
  }
  // Only the catalog children that hold an available item are tried (found by scanning the
  // item bitset, skipping whole subtrees), then the separator and terminator.
  const CatalogTrie& trie = *rule.trie;
  const TrieNode& node = trie.node(c.node);
  const uint64_t* bits = available();
  bool found = false;
  uint32_t r = NextSetBit(bits, node.lo + (node.item_rank >= 0 ? 1u : 0u), node.hi);
  const VocabTrie& vocab = *rule.vocab;
  while (r < node.hi) {
    const uint32_t child_id = trie.ChildContaining(c.node, r);
    const TrieNode& child = trie.node(child_id);
    const auto byte = static_cast<uint8_t>(child.token);
    bool hit = false;
    if (!IsLocal(r, c)) {
      // r is available and below the child: StepByte's checks are already answered.
      const uint32_t vchild = vocab.Child(vnode, byte);
      hit = vchild != VocabTrie::kNone &&
            Descend(vchild, Cursor{Phase::kItem, 0, child_id, c.count, c.num_local}, row);
    } else {
      hit = WalkByte(vnode, c, byte, row);
    }
    if (hit) {
      if (row == nullptr) return true;
      found = true;
    }
    r = NextSetBit(bits, child.hi, node.hi);
  }
  const AfterItem after = AfterAt(c);
  if (after.can_separate && WalkByte(vnode, c, static_cast<uint8_t>(rule.separator[0]), row)) {
    if (row == nullptr) return true;
    found = true;
  }
  if (after.can_terminate && !rule.terminator.empty() &&
      WalkByte(vnode, c, static_cast<uint8_t>(rule.terminator[0]), row)) {
    found = true;
  }
  return found;
}

bool SlotState::FillDecodedRow(uint32_t* row) {
  const Constraint& c = *constraint_;
  std::memset(row, 0, c.words * sizeof(uint32_t));
  const Cursor here = Here();
  bool any = Walk(VocabTrie::kRoot, here, row);
  if (EndAllowed(here)) {
    SetBit(row, c.eos_token_id);
    any = true;
  }
  if (!any) SetBit(row, c.eos_token_id);
  return !any;
}

void SlotState::AdvanceDecoded(int32_t token) {
  const Constraint& c = *constraint_;
  Cursor here = Here();
  if (token == c.eos_token_id) {
    // End of sequence where the list may end, or where no token is left (a forced end).
    if (EndAllowed(here) || !Walk(VocabTrie::kRoot, here, nullptr)) {
      phase_ = Phase::kDone;
      return;
    }
    return Fail();
  }
  const VocabTrie& vocab = *c.item_list.vocab;
  const std::size_t length = vocab.length(token);
  if (length == 0) return Fail();
  const uint8_t* bytes = vocab.bytes(token);
  for (std::size_t i = 0; i < length; ++i) {
    if (!StepByte(here, bytes[i])) return Fail();
  }
  for (uint32_t i = 0; i < here.num_local; ++i) {
    const uint32_t rank = locals_[i];
    available_[rank >> 6] &= ~(uint64_t{1} << (rank & 63u));
    --num_available_;
  }
  phase_ = here.phase;
  pos_ = here.pos;
  node_ = here.node;
  count_ = here.count;
}

}  // namespace llm_serving

