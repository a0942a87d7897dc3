#include "merge_plan.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace llm_serving::metrics {

namespace {

double ReadDouble(const char* data, size_t pos) {
  double value;
  std::memcpy(&value, data + pos, sizeof value);
  return value;
}

}  // namespace

bool IsDb(std::string_view name) {
  return name.size() >= 3 && name.substr(name.size() - 3) == ".db";
}

void MergePlan::Clear() {
  replayable = false;
  files.clear();
  listed.clear();
  ops.clear();
  totals.clear();
  gauges.clear();
  rank.clear();
  set_order.clear();
  sets = 0;
  fills.clear();
}

uint32_t MergePlan::AddSlot() {
  totals.push_back(0.0);
  return static_cast<uint32_t>(totals.size() - 1);
}

uint32_t MergePlan::AddGauge() {
  gauges.emplace_back();
  rank.push_back(-1);
  return static_cast<uint32_t>(gauges.size() - 1);
}

// readdir's d_ino spares a stat per file: while `fd` holds its inode, no other file can have
// that number. The order is readdir's, which holds while the directory does not change;
// another order only costs a full read.
bool MergePlan::Lists(DIR* dir) const {
  size_t count = 0;
  while (const dirent* item = ::readdir(dir)) {
    if (!IsDb(item->d_name)) continue;
    if (count == listed.size()) return false;
    const File& file = files[listed[count++]];
    if (item->d_ino != file.ino || file.name != item->d_name) return false;
  }
  return count == listed.size();
}

void MergePlan::Start() {
  std::fill(totals.begin(), totals.end(), 0.0);
  std::fill(gauges.begin(), gauges.end(), Gauge{});
  sets = 0;
}

bool MergePlan::Apply(const File& file, const char* data, bool record) {
  if (file.mode == Mode::kSum) {
    for (uint32_t i = file.begin; i < file.end; ++i) {
      totals[ops[i].target] += ReadDouble(data, ops[i].at);
    }
    return true;
  }
  for (uint32_t i = file.begin; i < file.end; ++i) {
    const Op& op = ops[i];
    double value = ReadDouble(data, op.at), stamp = ReadDouble(data, op.at + 8);
    Gauge& g = gauges[op.target];
    // As prometheus_client: a gauge never set (timestamp 0) is not exposed.
    if (file.mode == Mode::kMostRecent && !(stamp > (g.set ? g.stamp : 0.0))) continue;
    if (!g.set) {
      if (record) {
        rank[op.target] = sets;
        set_order.push_back(op.target);
      } else if (rank[op.target] != sets) {
        return false;
      }
      ++sets;
      g = Gauge{value, stamp, true};
      continue;
    }
    switch (file.mode) {
      case Mode::kMin: g.value = std::min(g.value, value), g.stamp = 0; break;
      case Mode::kMax: g.value = std::max(g.value, value), g.stamp = 0; break;
      case Mode::kGaugeSum: g.value += value, g.stamp = 0; break;
      default: g.value = value, g.stamp = stamp;  // all, mostrecent: the later file's
    }
  }
  return true;
}

void MergePlan::Finish(std::vector<Family> families) {
  outputs[0] = std::make_shared<std::vector<Family>>(std::move(families));
  outputs[1].reset();
  last = 0;
}

std::shared_ptr<const std::vector<Family>> MergePlan::Output() {
  std::vector<Family>* out = nullptr;
  for (int k : {last, last ^ 1}) {
    if (outputs[k] != nullptr && outputs[k].use_count() == 1) {
      // Pairs with the release in the callers' last reference drop: their reads of these
      // values happen before the writes below.
      std::atomic_thread_fence(std::memory_order_acquire);
      last = k;
      out = outputs[k].get();
      break;
    }
  }
  if (out == nullptr) {
    last ^= 1;
    outputs[last] = std::make_shared<std::vector<Family>>(*outputs[last ^ 1]);
    out = outputs[last].get();
  }
  const Fill* fill = fills.data();
  double acc = 0;
  for (Family& fam : *out) {
    for (Sample& sample : fam.samples) {
      switch (fill->kind) {
        case Fill::kTotal: sample.value = totals[fill->index]; break;
        case Fill::kFirstBucket: acc = 0; [[fallthrough]];
        case Fill::kBucket: sample.value = acc += totals[fill->index]; break;
        case Fill::kCount: sample.value = acc; break;
        case Fill::kGauge: sample.value = gauges[fill->index].value; break;
      }
      ++fill;
    }
  }
  return outputs[last];
}

}  // namespace llm_serving::metrics
