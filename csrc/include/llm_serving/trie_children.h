#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace llm_serving {

// Fills each node's first_child/num_children and returns the children array. Both tries
// create nodes depth-first with siblings in key order, so grouping them by parent in creation
// order keeps every child list sorted by key (and, for the catalog, by rank range).
template <typename Node>
std::vector<uint32_t> GroupChildrenByParent(std::vector<Node>& nodes,
                                            const std::vector<uint32_t>& parent) {
  for (std::size_t i = 1; i < nodes.size(); ++i) ++nodes[parent[i]].num_children;
  uint32_t next = 0;
  for (auto& node : nodes) {
    node.first_child = next;
    next += node.num_children;
  }
  std::vector<uint32_t> children(next);
  std::vector<uint32_t> filled(nodes.size(), 0);
  for (std::size_t i = 1; i < nodes.size(); ++i) {
    children[nodes[parent[i]].first_child + filled[parent[i]]++] = static_cast<uint32_t>(i);
  }
  return children;
}

}  // namespace llm_serving
