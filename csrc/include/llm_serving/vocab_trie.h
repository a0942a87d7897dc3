// An immutable trie over the decoded bytes of every vocabulary token (decoded matching).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace llm_serving {

// Children of a node are contiguous in `children` and sorted by byte; the tokens whose bytes
// end exactly at a node are tokens[tokens_begin, tokens_end).
struct VocabNode {
  uint32_t first_child;
  uint32_t num_children;
  uint32_t tokens_begin;
  uint32_t tokens_end;
  uint8_t byte;  // byte on the edge from the parent (0 at the root)
};

class VocabTrie {
 public:
  static constexpr uint32_t kRoot = 0;
  static constexpr uint32_t kNone = UINT32_MAX;

  // Compiles token t's bytes bytes[offsets[t], offsets[t+1]) for t in [0, vocab_size). Tokens
  // with no bytes (special tokens) are left out. Throws ConfigError on bad offsets.
  static std::shared_ptr<const VocabTrie> Build(const uint8_t* bytes, std::size_t num_bytes,
                                                const int64_t* offsets, int32_t vocab_size);

  int32_t vocab_size() const { return vocab_size_; }
  std::size_t num_nodes() const { return nodes_.size(); }
  std::size_t max_token_length() const { return max_length_; }
  const VocabNode& node(uint32_t index) const { return nodes_[index]; }
  const uint32_t* children(const VocabNode& n) const { return children_.data() + n.first_child; }
  const int32_t* tokens(const VocabNode& n) const { return tokens_.data() + n.tokens_begin; }
  // The child of `node` reached by `byte`, or kNone.
  uint32_t Child(uint32_t node, uint8_t byte) const;
  // The bytes of `token` (empty for special tokens); token must be in [0, vocab_size).
  const uint8_t* bytes(int32_t token) const { return bytes_.data() + offsets_[token]; }
  std::size_t length(int32_t token) const { return offsets_[token + 1] - offsets_[token]; }
  std::size_t MemoryBytes() const;

 private:
  VocabTrie() = default;

  std::array<uint32_t, 256> root_children_{};  // the root's child by byte, or kNone
  std::vector<VocabNode> nodes_;
  std::vector<uint32_t> children_;
  std::vector<int32_t> tokens_;  // token ids sorted by bytes, then id
  std::vector<uint8_t> bytes_;
  std::vector<uint32_t> offsets_;
  std::size_t max_length_ = 0;
  int32_t vocab_size_ = 0;
};

}  // namespace llm_serving
