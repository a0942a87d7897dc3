// MultiprocReader's steady state (multiproc.cc): a merge worked out by a full read of the .db
// files, replayed by the reads after it while the files and their keys stay the same.
#pragma once

#include <dirent.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "metrics.h"

namespace llm_serving::metrics {

// Whether a directory entry is a multiprocess file, as prometheus_client globs them.
bool IsDb(std::string_view name);

// How a file's values merge: summed (counters, histograms, summaries) or by its gauge mode.
enum class Mode : uint8_t { kSum, kAll, kMostRecent, kMin, kMax, kGaugeSum };

// Each entry's value offset and summed slot or gauge series, the families in order (buckets
// sorted by le), and the families themselves, whose values a replay writes in place. Keys
// never change once written, so a replay only re-reads the values.
struct MergePlan {
  struct File {
    std::string name;
    ino_t ino;    // of the file kept open as `fd`
    int fd;       // owned by the reader's open files, which only a full read changes (and
                  // then replans)
    size_t used;  // the used size its entries were planned at
    const char* map;  // the open file's mapping of at least `used` bytes
    Mode mode;
    uint32_t begin, end;  // its ops
  };
  struct Op {
    uint32_t at;      // the value's byte offset
    uint32_t target;  // a summed slot or a gauge series
  };
  struct Gauge {
    double value = 0, stamp = 0;
    bool set = false;
  };
  // Where each output sample's value comes from, in the samples' order.
  struct Fill {
    enum Kind : uint8_t { kTotal, kFirstBucket, kBucket, kCount, kGauge } kind;
    uint32_t index;  // a summed slot or a gauge series (kCount: the buckets before it)
  };

  bool replayable = false;
  std::vector<File> files;       // in name order
  std::vector<uint32_t> listed;  // `files` indexes in readdir's order
  std::vector<Op> ops;
  std::vector<double> totals;    // by summed slot
  std::vector<Gauge> gauges;     // by gauge series
  std::vector<int> rank;         // by gauge series: when it was first set, -1 if never
  std::vector<uint32_t> set_order;
  int sets = 0;  // gauges set so far in this read
  std::vector<Fill> fills;
  // The last reads' families; a caller may hold either (see Output).
  std::shared_ptr<std::vector<Family>> outputs[2];
  int last = 0;

  // A full read starts a new plan, replayable once it has read every file.
  void Clear();
  uint32_t AddSlot();
  uint32_t AddGauge();

  // Whether `dir` lists the planned files, each under the inode planned.
  bool Lists(DIR* dir) const;

  // Before a replay: nothing summed, no gauge set.
  void Start();

  // Merges one file's values into the totals and gauges, as MultiProcessCollector does in
  // file order. The families list gauges in the order they are first set, which depends on
  // timestamps (mostrecent): a full read records it, a replay returns false where it differs.
  // A replay's Apply allocates nothing, so ReadMapped may abandon it midway.
  bool Apply(const File& file, const char* data, bool record);

  // Whether a replay set every gauge the plan's families hold.
  bool AllSet() const { return sets == static_cast<int>(set_order.size()); }

  // The families of a full read, `fills` made alongside: what Output() fills from now on.
  void Finish(std::vector<Family> families);

  // This read's families: the last ones' vectors and series, their values overwritten. A
  // result still held by a caller is never written; when both are held, one is copied.
  std::shared_ptr<const std::vector<Family>> Output();
};

}  // namespace llm_serving::metrics
