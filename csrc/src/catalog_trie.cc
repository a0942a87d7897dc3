#include "llm_serving/catalog_trie.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "llm_serving/bits.h"
#include "llm_serving/errors.h"
#include "llm_serving/trie_children.h"

namespace llm_serving {

std::shared_ptr<const CatalogTrie> CatalogTrie::Build(const int32_t* tokens,
                                                      std::size_t num_tokens,
                                                      const int64_t* offsets,
                                                      std::size_t num_items, int32_t vocab_size) {
  if (vocab_size <= 0) throw ConfigError("vocab_size must be positive");
  if (num_items == 0) throw ConfigError("a catalog needs at least one item");
  if (num_items >= kNone / 2) throw ConfigError("too many catalog items");
  if (offsets[0] != 0 || static_cast<std::size_t>(offsets[num_items]) != num_tokens) {
    throw ConfigError("offsets must start at 0 and end at the number of tokens");
  }
  for (std::size_t i = 0; i < num_items; ++i) {
    if (offsets[i + 1] <= offsets[i]) {
      throw ConfigError("catalog item " + std::to_string(i) + " has no tokens");
    }
  }
  for (std::size_t t = 0; t < num_tokens; ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab_size) {
      throw ConfigError("catalog token " + std::to_string(tokens[t]) +
                        " is outside the vocabulary of " + std::to_string(vocab_size));
    }
  }
  auto begin_of = [&](uint32_t item) { return tokens + offsets[item]; };
  auto end_of = [&](uint32_t item) { return tokens + offsets[item + 1]; };
  std::vector<uint32_t> order(num_items);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::lexicographical_compare(begin_of(a), end_of(a), begin_of(b), end_of(b));
  });

  std::shared_ptr<CatalogTrie> trie(new CatalogTrie());
  trie->num_tokens_ = num_tokens;
  trie->vocab_size_ = vocab_size;
  trie->rank_of_item_.resize(num_items);
  auto& nodes = trie->nodes_;
  nodes.reserve(num_tokens + 1);
  std::vector<uint32_t> parent;
  parent.reserve(num_tokens + 1);
  nodes.push_back({0, static_cast<uint32_t>(num_items), 0, 0, -1, -1});
  parent.push_back(kNone);
  std::vector<uint32_t> path{kRoot};  // path[d] is the node at depth d
  const int32_t* prev_begin = nullptr;
  const int32_t* prev_end = nullptr;
  for (uint32_t rank = 0; rank < num_items; ++rank) {
    const uint32_t item = order[rank];
    trie->rank_of_item_[item] = rank;
    const int32_t* seq = begin_of(item);
    const std::size_t len = static_cast<std::size_t>(end_of(item) - seq);
    std::size_t common = 0;
    if (prev_begin != nullptr) {
      const auto mismatch = std::mismatch(prev_begin, prev_end, seq, seq + len);
      common = static_cast<std::size_t>(mismatch.first - prev_begin);
      if (mismatch.first == prev_end && common == len) {
        throw ConfigError("catalog items " + std::to_string(order[rank - 1]) + " and " +
                          std::to_string(item) + " have the same token sequence");
      }
    }
    while (path.size() > common + 1) {
      nodes[path.back()].hi = rank;
      path.pop_back();
    }
    for (std::size_t d = common; d < len; ++d) {
      parent.push_back(path.back());
      path.push_back(static_cast<uint32_t>(nodes.size()));
      nodes.push_back({rank, 0, 0, 0, seq[d], -1});
    }
    nodes[path.back()].item_rank = static_cast<int32_t>(rank);
    prev_begin = seq;
    prev_end = seq + len;
  }
  while (path.size() > 1) {
    nodes[path.back()].hi = static_cast<uint32_t>(num_items);
    path.pop_back();
  }
  trie->children_ = GroupChildrenByParent(nodes, parent);
  trie->child_tokens_.reserve(trie->children_.size());
  trie->child_hi_.reserve(trie->children_.size());
  for (const uint32_t child : trie->children_) {
    trie->child_tokens_.push_back(nodes[child].token);
    trie->child_hi_.push_back(nodes[child].hi);
  }
  nodes.shrink_to_fit();
  trie->first_tokens_mask_.assign((static_cast<std::size_t>(vocab_size) + 31) / 32, 0);
  const TrieNode& root = trie->node(kRoot);
  const int32_t* first_tokens = trie->child_tokens(root);
  for (uint32_t k = 0; k < root.num_children; ++k) {
    SetBit(trie->first_tokens_mask_.data(), first_tokens[k]);
  }
  return trie;
}

uint32_t CatalogTrie::Child(uint32_t node, int32_t token) const {
  const TrieNode& n = nodes_[node];
  const int32_t* first = child_tokens(n);
  const int32_t* last = first + n.num_children;
  const int32_t* it = std::lower_bound(first, last, token);
  return (it != last && *it == token) ? children_[n.first_child + (it - first)] : kNone;
}

uint32_t CatalogTrie::ChildContaining(uint32_t node, uint32_t rank) const {
  const TrieNode& n = nodes_[node];
  const uint32_t* first = child_hi_.data() + n.first_child;
  const uint32_t* last = first + n.num_children;
  // The first child whose range ends after `rank`.
  const uint32_t* it = std::upper_bound(first, last, rank);
  return it == last ? kNone : children_[n.first_child + (it - first)];
}

std::size_t CatalogTrie::MemoryBytes() const {
  return sizeof(*this) + nodes_.capacity() * sizeof(TrieNode) +
         children_.capacity() * sizeof(uint32_t) + child_tokens_.capacity() * sizeof(int32_t) +
         child_hi_.capacity() * sizeof(uint32_t) + rank_of_item_.capacity() * sizeof(uint32_t) +
         first_tokens_mask_.capacity() * sizeof(uint32_t);
}

}  // namespace llm_serving
