// The metrics proxy's per-scrape path: prometheus_client multiprocess .db files merged as
// MultiProcessCollector merges them, Triton's text exposition parsed, and both written, with
// the pod's constant labels, as Prometheus text or OpenMetrics, gzipped or not.
//
// runtime/metrics_proxy/multiproc.py, triton.py, merge.py and exposition.py are the Python
// reference this code is tested against (tests/metrics_proxy/test_metrics_proxy_native.py).
#pragma once

#include <isa-l/igzip_lib.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "flat_map.h"

namespace llm_serving::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// A series' identity: immutable once made, shared by the caches and every family naming it.
struct Series {
  std::string name;  // the full sample name (x_bucket, x_total, ...)
  Labels labels;     // in the order they are written
  uint32_t id = 0;   // dense, among the series of one MultiprocReader (0 elsewhere)
};
using SeriesPtr = std::shared_ptr<const Series>;

struct Sample {
  SeriesPtr series;
  double value = 0;
};

struct Family {
  std::string name;  // the base name (a counter's without _total)
  std::string type;
  std::string help;
  std::vector<Sample> samples;
};

// The multiprocess directory cannot be listed (Python: OSError).
class DirectoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A malformed Triton exposition (Python: ValueError); the message names the line.
class ParseError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct MultiprocResult {
  // Shared with the reader, which writes the next reads' values into it once no caller
  // holds it any more.
  std::shared_ptr<const std::vector<Family>> families;
  int files = 0;                    // files merged
  std::vector<std::string> corrupt; // "name: reason" per file skipped
};

// Merges a PROMETHEUS_MULTIPROC_DIR on every read. Parsed keys are cached per file and
// offset and interned across files; both caches are bounded and rebuilt past their limits.
// prometheus_client never changes a key once written, so a kept file's keys up to its last
// used size are reused unread, unless inotify saw a file written in place (write, truncate)
// or there is no watch: then each is compared byte for byte before reuse. While no file is
// added, removed, replaced or grown, a read replays the last merge on the values (after such
// a write, its keys compared first; without a watch, not).
class MultiprocReader {
 public:
  explicit MultiprocReader(std::string directory);
  ~MultiprocReader();
  MultiprocReader(const MultiprocReader&) = delete;
  MultiprocReader& operator=(const MultiprocReader&) = delete;

  MultiprocResult Read();

 private:
  struct State;
  std::string directory_;
  std::unique_ptr<State> state_;
};

// Parses Prometheus text format 0.0.4 as runtime/metrics_proxy/triton.py does; throws
// ParseError (a bad line, or invalid UTF-8). The series of one endpoint are the same on every
// scrape, so their parsed form is cached by their text (bounded).
class TextParser {
 public:
  std::vector<Family> Parse(std::string_view text);

 private:
  FlatMap<std::string, SeriesPtr, StringHash> series_;
};

// The pod's constant labels and each series' text before its value, cached across bodies.
// Used by one thread at a time (the scrape server's merge thread; the bindings lock it per call).
class Encoder {
 public:
  explicit Encoder(Labels constant_labels);

  struct Prefix {
    SeriesPtr keep;          // keeps the key's address from being reused
    const std::string* text; // shared by every series that renders the same
    uint32_t id;             // dense id of the text: what a body marks as written
  };

 private:
  friend class BodyWriter;
  const Prefix& PrefixFor(const SeriesPtr& series);

  Labels constant_;
  std::unordered_set<std::string> constant_names_;
  FlatMap<const Series*, Prefix, PointerHash> prefixes_;
  std::unordered_map<std::string, uint32_t> texts_;
  int writers_ = 0;  // bodies being written: the cache is trimmed only when none is
  // A finished body's gzip state (ISA-L's igzip, level 1), kept for the next one: its window
  // and hash tables are about 340 KB, too much to allocate on every scrape's path.
  struct Deflater {
    isal_zstream zs{};
    std::vector<uint8_t> level_buf = std::vector<uint8_t>(ISAL_DEF_LVL1_DEFAULT);
    void Start();
  };
  std::unique_ptr<Deflater> idle_deflater_;
};

// Writes one exposition body. Families are added source by source in priority order (after
// Reserve()d names): a family name seen before hides a later family, a sample name owned by
// another family is dropped, and a series (name and labels, after the constant labels are
// applied) is written once. Reserved families keep their names for the sources added later
// and are written by AddReserved(), in any order.
class BodyWriter {
 public:
  BodyWriter(std::shared_ptr<Encoder> encoder, bool openmetrics, bool gzip);
  ~BodyWriter();
  BodyWriter(const BodyWriter&) = delete;
  BodyWriter& operator=(const BodyWriter&) = delete;

  void Reserve(const std::vector<Family>& families);
  // The number of families it hid because an earlier source (or a reserved one) had the name.
  int Add(const std::vector<Family>& families);
  void AddReserved(const std::vector<Family>& families);
  std::string Finish();

 private:
  void Write(const Family& family, const std::vector<const Sample*>& kept);
  void Flush(bool final);

  std::shared_ptr<Encoder> encoder_;
  bool openmetrics_;
  bool gzip_;
  bool finished_ = false;
  // Names point into the families added (the caller keeps them alive until Finish) or into
  // reserved_, this writer's copy of the reserved families.
  std::vector<Family> reserved_;
  FlatMap<std::string_view, bool, StringHash> families_;
  FlatMap<std::string_view, std::string_view, StringHash> owner_;  // sample -> family name
  std::vector<bool> seen_;  // by prefix text id
  std::string text_;  // pending text (all of it when not gzipping)
  std::string out_;   // compressed bytes so far
  std::unique_ptr<Encoder::Deflater> deflater_;  // when gzipping
};

// Python's repr() of a finite float; Go's spelling of inf and NaN (+Inf, -Inf, NaN).
std::string FormatValue(double value);
void AppendValue(double value, std::string* out);
// prometheus_client.utils.floatToGoString.
std::string FloatToGoString(double value);
// Python's float() of a string (no underscores); false if it is not one.
bool ParseFloat(std::string_view text, double* out);
bool ValidUtf8(std::string_view text);

}  // namespace llm_serving::metrics
