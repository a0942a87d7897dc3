// An immutable, compact trie over the token sequences of a catalog's items.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace llm_serving {

// Items are ranked in lexicographic order of their token sequences, so every node's subtree
// is the contiguous rank range [lo, hi); an item ending at a node has rank lo.
struct TrieNode {
  uint32_t lo;
  uint32_t hi;
  uint32_t first_child;  // index into the children array
  uint32_t num_children;
  int32_t token;      // token on the edge from the parent (-1 at the root)
  int32_t item_rank;  // rank of the item ending here, or -1
};

class CatalogTrie {
 public:
  static constexpr uint32_t kRoot = 0;
  static constexpr uint32_t kNone = UINT32_MAX;

  // Compiles items given as a flat token array with num_items + 1 offsets. Throws ConfigError
  // on empty items, tokens outside [0, vocab_size), duplicate sequences or bad offsets.
  static std::shared_ptr<const CatalogTrie> Build(const int32_t* tokens, std::size_t num_tokens,
                                                  const int64_t* offsets, std::size_t num_items,
                                                  int32_t vocab_size);

  std::size_t num_items() const { return rank_of_item_.size(); }
  std::size_t num_nodes() const { return nodes_.size(); }
  std::size_t num_tokens() const { return num_tokens_; }
  int32_t vocab_size() const { return vocab_size_; }
  const TrieNode& node(uint32_t index) const { return nodes_[index]; }
  uint32_t rank_of_item(uint32_t item) const { return rank_of_item_[item]; }

  // The tokens on the edges to `n`'s children, in order (n.num_children of them).
  const int32_t* child_tokens(const TrieNode& n) const {
    return child_tokens_.data() + n.first_child;
  }
  // The items' first tokens as a bitmask of ceil(vocab_size / 32) words: the row of a request
  // that allows every item, copied instead of rebuilt per request.
  const std::vector<uint32_t>& first_tokens_mask() const { return first_tokens_mask_; }
  // The child of `node` reached by `token`, or kNone.
  uint32_t Child(uint32_t node, int32_t token) const;
  // The child of `node` whose range holds `rank` (a rank inside a child's subtree).
  uint32_t ChildContaining(uint32_t node, uint32_t rank) const;
  // Bytes held by the compiled trie.
  std::size_t MemoryBytes() const;

 private:
  CatalogTrie() = default;

  std::vector<TrieNode> nodes_;
  std::vector<uint32_t> children_;  // node ids grouped by parent, sorted by token
  // Each child's token and rank range end, beside children_: searching a node's children
  // reads one contiguous run instead of a node record per probe, which a cold step pays for.
  std::vector<int32_t> child_tokens_;
  std::vector<uint32_t> child_hi_;
  std::vector<uint32_t> rank_of_item_;
  std::vector<uint32_t> first_tokens_mask_;
  std::size_t num_tokens_ = 0;
  int32_t vocab_size_ = 0;
};

}  // namespace llm_serving
