#include "llm_serving/constraint.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "llm_serving/bits.h"
#include "llm_serving/errors.h"

namespace llm_serving {
namespace {

void CheckVocab(int32_t eos_token_id, int32_t vocab_size) {
  if (vocab_size <= 0) throw ConfigError("vocab_size must be positive");
  if (eos_token_id < 0 || eos_token_id >= vocab_size) {
    throw ConfigError("eos_token_id " + std::to_string(eos_token_id) +
                      " is outside the vocabulary of " + std::to_string(vocab_size));
  }
}

void CheckToken(const char* what, int32_t token, int32_t vocab_size) {
  if (token < 0 || token >= vocab_size) {
    throw ConfigError(std::string(what) + ": token " + std::to_string(token) +
                      " is outside the vocabulary of " + std::to_string(vocab_size));
  }
}

std::shared_ptr<Constraint> NewConstraint(RuleKind kind, int32_t eos_token_id,
                                          const std::vector<int32_t>& banned,
                                          int32_t vocab_size) {
  CheckVocab(eos_token_id, vocab_size);
  auto c = std::make_shared<Constraint>();
  c->kind = kind;
  c->vocab_size = vocab_size;
  c->eos_token_id = eos_token_id;
  c->words = WordsFor(vocab_size);
  if (!banned.empty()) {
    c->not_banned.assign(c->words, ~uint32_t{0});
    const uint32_t tail = static_cast<uint32_t>(vocab_size) & 31u;
    if (tail != 0) c->not_banned.back() = (1u << tail) - 1;
    for (int32_t token : banned) {
      CheckToken("banned_tokens", token, vocab_size);
      ClearBit(c->not_banned.data(), token);
    }
  }
  return c;
}

void CheckPiece(const char* what, const std::vector<int32_t>& piece, int32_t eos,
                int32_t vocab_size) {
  for (int32_t token : piece) {
    CheckToken(what, token, vocab_size);
    if (token == eos) throw ConfigError(std::string(what) + " contains the end-of-sequence token");
  }
}

void SetAvailable(ItemListRule& rule, const CatalogTrie& trie, uint32_t min_items,
                  uint32_t max_items, const int32_t* allowed, std::size_t num_allowed,
                  bool all_allowed) {
  if (min_items < 1) throw ConfigError("min_items must be at least 1");
  if (max_items != 0 && min_items > max_items) {
    throw ConfigError("min_items (" + std::to_string(min_items) + ") must not exceed max_items (" +
                      std::to_string(max_items) + ")");
  }
  const std::size_t n = trie.num_items();
  rule.available.assign((n + 63) / 64, 0);
  if (all_allowed) {
    // Whole words: this runs for every request, on the engine's loop, over the whole catalog.
    std::fill(rule.available.begin(), rule.available.end(), ~uint64_t{0});
    if ((n & 63u) != 0) rule.available.back() = (uint64_t{1} << (n & 63u)) - 1;
  } else {
    for (std::size_t i = 0; i < num_allowed; ++i) {
      if (allowed[i] < 0 || static_cast<std::size_t>(allowed[i]) >= n) {
        throw ConfigError("allowed item index " + std::to_string(allowed[i]) +
                          " is not in the catalog of " + std::to_string(n) + " items");
      }
      const uint32_t rank = trie.rank_of_item(static_cast<uint32_t>(allowed[i]));
      rule.available[rank >> 6] |= uint64_t{1} << (rank & 63u);
    }
  }
  for (uint64_t word : rule.available) rule.num_available += __builtin_popcountll(word);
}

}  // namespace

std::shared_ptr<const Constraint> MakeItemListConstraint(
    std::shared_ptr<const CatalogTrie> trie, std::vector<int32_t> prefix,
    std::vector<int32_t> separator, std::vector<int32_t> terminator, uint32_t min_items,
    uint32_t max_items, bool unique, const int32_t* allowed, std::size_t num_allowed,
    bool all_allowed, int32_t eos_token_id, const std::vector<int32_t>& banned,
    int32_t vocab_size) {
  auto c = NewConstraint(RuleKind::kItemList, eos_token_id, banned, vocab_size);
  if (!trie) throw ConfigError("catalog is missing");
  if (trie->vocab_size() > vocab_size) {
    throw ConfigError("the catalog was compiled for a vocabulary of " +
                      std::to_string(trie->vocab_size()) + ", larger than " +
                      std::to_string(vocab_size));
  }
  CheckPiece("prefix", prefix, eos_token_id, vocab_size);
  CheckPiece("separator", separator, eos_token_id, vocab_size);
  CheckPiece("terminator", terminator, eos_token_id, vocab_size);
  if (separator.empty()) throw ConfigError("separator must have at least one token");
  const int32_t term_first = terminator.empty() ? eos_token_id : terminator[0];
  if (separator[0] == term_first) {
    throw ConfigError("separator and terminator must start with different tokens");
  }
  ItemListRule& rule = c->item_list;
  SetAvailable(rule, *trie, min_items, max_items, allowed, num_allowed, all_allowed);
  rule.root_mask.assign(c->words, 0);
  if (all_allowed) {
    // The trie's vocabulary is at most the constraint's (checked above): a prefix of the row.
    const auto& first_tokens = trie->first_tokens_mask();
    std::copy(first_tokens.begin(), first_tokens.end(), rule.root_mask.begin());
  } else {
    const auto end = static_cast<uint32_t>(trie->num_items());
    for (uint32_t r = NextSetBit(rule.available.data(), 0, end); r < end;) {
      const TrieNode& child = trie->node(trie->ChildContaining(CatalogTrie::kRoot, r));
      SetBit(rule.root_mask.data(), child.token);
      r = NextSetBit(rule.available.data(), child.hi, end);
    }
  }
  rule.trie = std::move(trie);
  rule.prefix = std::move(prefix);
  rule.separator = std::move(separator);
  rule.terminator = std::move(terminator);
  rule.min_items = min_items;
  rule.max_items = max_items;
  rule.unique = unique;
  return c;
}

std::shared_ptr<const Constraint> MakeDecodedListConstraint(
    std::shared_ptr<const CatalogTrie> trie, std::shared_ptr<const VocabTrie> vocab,
    std::vector<int32_t> prefix, std::vector<int32_t> separator, std::vector<int32_t> terminator,
    uint32_t min_items, uint32_t max_items, bool unique, const int32_t* allowed,
    std::size_t num_allowed, bool all_allowed, int32_t eos_token_id,
    const std::vector<int32_t>& banned, int32_t vocab_size) {
  auto c = NewConstraint(RuleKind::kItemList, eos_token_id, banned, vocab_size);
  if (!trie) throw ConfigError("catalog is missing");
  if (!vocab) throw ConfigError("vocabulary is missing");
  if (trie->vocab_size() != 256) {
    throw ConfigError("decoded matching needs the catalog compiled over bytes (vocab_size 256)");
  }
  if (vocab->vocab_size() != vocab_size) {
    throw ConfigError("the vocabulary has " + std::to_string(vocab->vocab_size()) +
                      " tokens, the constraint " + std::to_string(vocab_size));
  }
  for (const auto* piece : {&prefix, &separator, &terminator}) {
    for (int32_t b : *piece) {
      if (b < 0 || b > 255) throw ConfigError("pieces must be bytes, got " + std::to_string(b));
    }
  }
  if (separator.empty()) throw ConfigError("separator must have at least one byte");
  if (!terminator.empty() && terminator[0] == separator[0]) {
    throw ConfigError("separator and terminator must start with different bytes");
  }
  ItemListRule& rule = c->item_list;
  SetAvailable(rule, *trie, min_items, max_items, allowed, num_allowed, all_allowed);
  rule.trie = std::move(trie);
  rule.vocab = std::move(vocab);
  rule.prefix = std::move(prefix);
  rule.separator = std::move(separator);
  rule.terminator = std::move(terminator);
  rule.min_items = min_items;
  rule.max_items = max_items;
  rule.unique = unique;
  return c;
}

std::shared_ptr<const Constraint> MakeMachineConstraint(
    uint32_t num_states, uint32_t initial_state, const std::vector<uint32_t>& accepting,
    const int32_t* transitions, std::size_t num_transitions, int32_t eos_token_id,
    const std::vector<int32_t>& banned, int32_t vocab_size) {
  auto c = NewConstraint(RuleKind::kMachine, eos_token_id, banned, vocab_size);
  if (num_states == 0) throw ConfigError("num_states must be at least 1");
  if (num_states > kMaxMachineStates) {
    throw ConfigError("num_states " + std::to_string(num_states) + " exceeds the limit of " +
                      std::to_string(kMaxMachineStates));
  }
  if (num_transitions > kMaxMachineTransitions) {
    throw ConfigError(std::to_string(num_transitions) + " transitions exceed the limit of " +
                      std::to_string(kMaxMachineTransitions));
  }
  if (initial_state >= num_states) {
    throw ConfigError("initial_state " + std::to_string(initial_state) +
                      " is not below num_states " + std::to_string(num_states));
  }
  MachineRule& m = c->machine;
  m.initial_state = initial_state;
  m.accepting.assign(num_states, 0);
  for (uint32_t state : accepting) {
    if (state >= num_states) {
      throw ConfigError("accepting state " + std::to_string(state) + " is not below num_states " +
                        std::to_string(num_states));
    }
    m.accepting[state] = 1;
  }
  m.offsets.assign(std::size_t{num_states} + 1, 0);
  for (std::size_t i = 0; i < num_transitions; ++i) {
    const int32_t* row = transitions + 3 * i;
    if (row[0] < 0 || static_cast<uint32_t>(row[0]) >= num_states || row[2] < 0 ||
        static_cast<uint32_t>(row[2]) >= num_states) {
      throw ConfigError("transition " + std::to_string(i) + ": states must be below num_states " +
                        std::to_string(num_states));
    }
    CheckToken("transitions", row[1], vocab_size);
    if (row[1] == eos_token_id) {
      throw ConfigError("transition " + std::to_string(i) + " uses the end-of-sequence token");
    }
    ++m.offsets[static_cast<std::size_t>(row[0]) + 1];
  }
  std::partial_sum(m.offsets.begin(), m.offsets.end(), m.offsets.begin());
  // Rows bucketed by state in one linear pass, then each state's few rows sorted by token: a
  // sort of all rows took most of the build of a million-row machine (in vLLM's engine loop).
  std::vector<uint32_t> order(num_transitions);
  std::vector<uint32_t> next_slot(m.offsets.begin(), m.offsets.end() - 1);
  for (std::size_t i = 0; i < num_transitions; ++i) {
    order[next_slot[static_cast<std::size_t>(transitions[3 * i])]++] = static_cast<uint32_t>(i);
  }
  m.tokens.resize(num_transitions);
  m.next_states.resize(num_transitions);
  const auto by_token = [transitions](uint32_t a, uint32_t b) {
    const int32_t x = transitions[3 * std::size_t{a} + 1];
    const int32_t y = transitions[3 * std::size_t{b} + 1];
    return x != y ? x < y : a < b;
  };
  for (uint32_t state = 0; state < num_states; ++state) {
    const auto first = order.begin() + m.offsets[state];
    const auto last = order.begin() + m.offsets[state + 1];
    std::sort(first, last, by_token);
    for (auto it = first; it != last; ++it) {
      const int32_t* row = transitions + 3 * std::size_t{*it};
      if (it != first && transitions[3 * std::size_t{*(it - 1)} + 1] == row[1]) {
        throw ConfigError("transition " + std::to_string(*it) + ": state " +
                          std::to_string(row[0]) + " already has a transition on token " +
                          std::to_string(row[1]));
      }
      const auto k = static_cast<std::size_t>(it - order.begin());
      m.tokens[k] = row[1];
      m.next_states[k] = static_cast<uint32_t>(row[2]);
    }
  }
  return c;
}

std::shared_ptr<const Constraint> MakeBannedConstraint(int32_t eos_token_id,
                                                       const std::vector<int32_t>& banned,
                                                       int32_t vocab_size) {
  return NewConstraint(RuleKind::kFree, eos_token_id, banned, vocab_size);
}

}  // namespace llm_serving
