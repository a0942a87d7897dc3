// One request's compiled constraint: immutable, shared by the slot states that run it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "llm_serving/catalog_trie.h"
#include "llm_serving/vocab_trie.h"

namespace llm_serving {

enum class RuleKind : uint8_t { kFree, kItemList, kMachine };

// prefix item (separator item)* terminator, then end of sequence, over a catalog trie. In
// decoded matching `vocab` is set, the trie and the pieces hold bytes (0..255), and a token is
// allowed when all its bytes are consumed from the current position.
struct ItemListRule {
  std::shared_ptr<const CatalogTrie> trie;
  std::shared_ptr<const VocabTrie> vocab;  // decoded matching only
  std::vector<int32_t> prefix;
  std::vector<int32_t> separator;
  std::vector<int32_t> terminator;  // empty: the list ends with end of sequence
  uint32_t min_items = 1;
  uint32_t max_items = 0;  // 0: no limit
  bool unique = false;
  std::vector<uint64_t> available;  // one bit per item rank
  uint32_t num_available = 0;
  std::vector<uint32_t> root_mask;  // first tokens of the available items (canonical only)
};

// Bounds of a token machine: far above what a request may send, low enough that a state id
// plus one and the uint32 offsets below never wrap.
constexpr uint32_t kMaxMachineStates = uint32_t{1} << 24;
constexpr std::size_t kMaxMachineTransitions = UINT32_MAX;

// A deterministic automaton in compressed rows: state s owns [offsets[s], offsets[s+1]).
struct MachineRule {
  uint32_t initial_state = 0;
  std::vector<uint32_t> offsets;
  std::vector<int32_t> tokens;  // sorted within a state
  std::vector<uint32_t> next_states;
  std::vector<uint8_t> accepting;
};

struct Constraint {
  RuleKind kind = RuleKind::kFree;
  int32_t vocab_size = 0;
  int32_t eos_token_id = 0;
  std::size_t words = 0;              // ceil(vocab_size / 32)
  std::vector<uint32_t> not_banned;   // allowed bits after banning; empty: nothing banned
  ItemListRule item_list;
  MachineRule machine;
};

// Builders validate every argument and throw ConfigError naming the bad one. `allowed` lists
// catalog item indices (file order); null means every item.
std::shared_ptr<const Constraint> MakeItemListConstraint(
    std::shared_ptr<const CatalogTrie> trie, std::vector<int32_t> prefix,
    std::vector<int32_t> separator, std::vector<int32_t> terminator, uint32_t min_items,
    uint32_t max_items, bool unique, const int32_t* allowed, std::size_t num_allowed,
    bool all_allowed, int32_t eos_token_id, const std::vector<int32_t>& banned,
    int32_t vocab_size);

// Decoded matching: `trie` is compiled over the items' UTF-8 bytes (a vocabulary of 256), the
// pieces are bytes, and `vocab` holds the model vocabulary's token bytes.
std::shared_ptr<const Constraint> MakeDecodedListConstraint(
    std::shared_ptr<const CatalogTrie> trie, std::shared_ptr<const VocabTrie> vocab,
    std::vector<int32_t> prefix, std::vector<int32_t> separator, std::vector<int32_t> terminator,
    uint32_t min_items, uint32_t max_items, bool unique, const int32_t* allowed,
    std::size_t num_allowed, bool all_allowed, int32_t eos_token_id,
    const std::vector<int32_t>& banned, int32_t vocab_size);

// `transitions` is num_transitions rows of (state, token, next_state).
std::shared_ptr<const Constraint> MakeMachineConstraint(
    uint32_t num_states, uint32_t initial_state, const std::vector<uint32_t>& accepting,
    const int32_t* transitions, std::size_t num_transitions, int32_t eos_token_id,
    const std::vector<int32_t>& banned, int32_t vocab_size);

std::shared_ptr<const Constraint> MakeBannedConstraint(int32_t eos_token_id,
                                                       const std::vector<int32_t>& banned,
                                                       int32_t vocab_size);

}  // namespace llm_serving
