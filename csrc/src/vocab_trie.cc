#include "llm_serving/vocab_trie.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "llm_serving/errors.h"
#include "llm_serving/trie_children.h"

namespace llm_serving {

std::shared_ptr<const VocabTrie> VocabTrie::Build(const uint8_t* bytes, std::size_t num_bytes,
                                                  const int64_t* offsets, int32_t vocab_size) {
  if (vocab_size <= 0) throw ConfigError("vocab_size must be positive");
  if (num_bytes >= std::numeric_limits<uint32_t>::max()) {
    throw ConfigError("the token bytes exceed 4 GiB");
  }
  const auto v = static_cast<std::size_t>(vocab_size);
  if (offsets[0] != 0 || static_cast<std::size_t>(offsets[v]) != num_bytes) {
    throw ConfigError("offsets must start at 0 and end at the number of bytes");
  }
  for (std::size_t t = 0; t < v; ++t) {
    if (offsets[t + 1] < offsets[t]) {
      throw ConfigError("offsets must not decrease (token " + std::to_string(t) + ")");
    }
  }
  std::shared_ptr<VocabTrie> trie(new VocabTrie());
  trie->vocab_size_ = vocab_size;
  trie->bytes_.assign(bytes, bytes + num_bytes);
  trie->offsets_.resize(v + 1);
  for (std::size_t t = 0; t <= v; ++t) trie->offsets_[t] = static_cast<uint32_t>(offsets[t]);

  std::vector<int32_t> order;
  order.reserve(v);
  for (std::size_t t = 0; t < v; ++t) {
    if (offsets[t + 1] > offsets[t]) order.push_back(static_cast<int32_t>(t));
  }
  const uint8_t* data = trie->bytes_.data();
  auto begin_of = [&](int32_t t) { return data + trie->offsets_[t]; };
  auto end_of = [&](int32_t t) { return data + trie->offsets_[t + 1]; };
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const bool less = std::lexicographical_compare(begin_of(a), end_of(a), begin_of(b), end_of(b));
    const bool more = std::lexicographical_compare(begin_of(b), end_of(b), begin_of(a), end_of(a));
    return less || (!more && a < b);
  });
  trie->tokens_ = order;

  auto& nodes = trie->nodes_;
  std::vector<uint32_t> parent{UINT32_MAX};
  nodes.push_back({0, 0, 0, 0, 0});
  std::vector<uint32_t> path{kRoot};  // path[d] is the node at depth d
  const uint8_t* prev_begin = nullptr;
  const uint8_t* prev_end = nullptr;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const int32_t token = order[k];
    const uint8_t* seq = begin_of(token);
    const std::size_t len = static_cast<std::size_t>(end_of(token) - seq);
    trie->max_length_ = std::max(trie->max_length_, len);
    std::size_t common = 0;
    if (prev_begin != nullptr) {
      common = static_cast<std::size_t>(std::mismatch(prev_begin, prev_end, seq, seq + len).first -
                                        prev_begin);
    }
    path.resize(common + 1);
    for (std::size_t d = common; d < len; ++d) {
      parent.push_back(path.back());
      path.push_back(static_cast<uint32_t>(nodes.size()));
      const auto at = static_cast<uint32_t>(k);
      nodes.push_back({0, 0, at, at, seq[d]});
    }
    VocabNode& end = nodes[path.back()];
    if (end.tokens_end != k) end.tokens_begin = static_cast<uint32_t>(k);
    end.tokens_end = static_cast<uint32_t>(k + 1);
    prev_begin = seq;
    prev_end = seq + len;
  }
  trie->children_ = GroupChildrenByParent(nodes, parent);
  trie->root_children_.fill(kNone);
  const VocabNode& root = nodes[kRoot];
  for (uint32_t i = 0; i < root.num_children; ++i) {
    const uint32_t child = trie->children_[root.first_child + i];
    trie->root_children_[nodes[child].byte] = child;
  }
  return trie;
}

uint32_t VocabTrie::Child(uint32_t node, uint8_t byte) const {
  if (node == kRoot) return root_children_[byte];
  const VocabNode& n = nodes_[node];
  const uint32_t* first = children_.data() + n.first_child;
  const uint32_t* last = first + n.num_children;
  const uint32_t* it = std::lower_bound(
      first, last, byte, [this](uint32_t child, uint8_t b) { return nodes_[child].byte < b; });
  return (it != last && nodes_[*it].byte == byte) ? *it : kNone;
}

std::size_t VocabTrie::MemoryBytes() const {
  return sizeof(*this) + nodes_.capacity() * sizeof(VocabNode) +
         children_.capacity() * sizeof(uint32_t) + tokens_.capacity() * sizeof(int32_t) +
         bytes_.capacity() + offsets_.capacity() * sizeof(uint32_t);
}

}  // namespace llm_serving
