// prometheus_client's multiprocess .db files merged as MultiProcessCollector merges them.
//
// File layout (prometheus_client/mmap_dict.py): a 4-byte used size and 4 bytes of padding,
// then entries of a 4-byte key length, the JSON key padded to 8 bytes, an 8-byte value and an
// 8-byte timestamp. Keys never change once written; values are re-read on every merge.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>

#include "dir_watch.h"
#include "mapping.h"
#include "merge_plan.h"
#include "metrics.h"

namespace llm_serving::metrics {

namespace {

constexpr size_t kHeader = 8;
constexpr size_t kFirstRead = 16 << 10;  // most files' used part; the rest in one more read
// Past these the caches are rebuilt, bounding memory however many files and series appear.
constexpr size_t kKeyLimit = 200'000;
constexpr size_t kSlotLimit = 200'000;
constexpr size_t kOpenLimit = 256;  // files kept open between reads

class CorruptFile : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file descriptor closed on every path.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

class Dir {
 public:
  explicit Dir(const std::string& path) : dir_(::opendir(path.c_str())) {}
  ~Dir() {
    if (dir_ != nullptr) ::closedir(dir_);
  }
  Dir(const Dir&) = delete;
  Dir& operator=(const Dir&) = delete;
  DIR* get() const { return dir_; }

 private:
  DIR* dir_;
};

std::string ErrnoText(int error, const std::string& path) {
  return "[Errno " + std::to_string(error) + "] " + std::strerror(error) + ": '" + path + "'";
}

int32_t ReadInt32(const char* data, size_t pos) {
  int32_t value;
  std::memcpy(&value, data + pos, sizeof value);
  return value;
}

// A file's used bytes, in a buffer kept across files and reads (never zero-filled).
class FileData {
 public:
  const char* data() const { return buf_.get(); }
  size_t size() const { return size_; }

  // Reads `fd`'s used bytes, first as many as `expect` (the size it had last time).
  void Read(int fd, const std::string& path, size_t expect) {
    size_ = 0;
    Append(fd, path, std::max(kFirstRead, expect + kFirstRead / 4));
    if (size_ < kHeader) {
      throw CorruptFile(std::to_string(size_) + " bytes, shorter than the 8-byte header");
    }
    int32_t used = ReadInt32(buf_.get(), 0);
    if (used > 0 && static_cast<size_t>(used) > size_) {
      Append(fd, path, static_cast<size_t>(used) - size_);
    }
    if (used < static_cast<int32_t>(kHeader) || static_cast<size_t>(used) > size_) {
      throw CorruptFile("header says " + std::to_string(used) + " bytes used, file holds " +
                        std::to_string(size_));
    }
    if (used % 8) {
      throw CorruptFile("used size " + std::to_string(used) +
                        " is not a multiple of 8, as every entry is");
    }
    size_ = static_cast<size_t>(used);
  }

 private:
  void Append(int fd, const std::string& path, size_t count) {
    if (int error = Append(fd, count)) throw CorruptFile(ErrnoText(error, path));
  }

  // Appends up to count bytes read at the current end (fewer at the end of the file);
  // returns 0 or the errno of a failed read.
  int Append(int fd, size_t count) {
    if (size_ + count > capacity_) {
      size_t capacity = std::max(size_ + count, 2 * capacity_);
      auto grown = std::make_unique<char[]>(capacity);  // value-initialised once per growth
      if (size_ > 0) std::memcpy(grown.get(), buf_.get(), size_);
      buf_ = std::move(grown);
      capacity_ = capacity;
    }
    size_t done = 0;
    while (done < count) {
      ssize_t n = ::pread(fd, buf_.get() + size_ + done, count - done, size_ + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    size_ += done;
    return 0;
  }

  std::unique_ptr<char[]> buf_;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

// The JSON of mmap_key(): ["metric", "sample", {"label": "value", ...}, "help"].
class KeyParser {
 public:
  explicit KeyParser(std::string_view text) : text_(text) {}

  void Parse(std::string* metric, std::string* sample, Labels* labels, std::string* help) {
    Expect('[');
    *metric = String();
    Expect(',');
    *sample = String();
    Expect(',');
    Expect('{');
    Space();
    if (Peek() != '}') {
      while (true) {
        std::string key = String();
        Expect(':');
        labels->emplace_back(std::move(key), String());
        Space();
        if (Peek() == ',') {
          ++pos_;
          continue;
        }
        break;
      }
    }
    Expect('}');
    Expect(',');
    *help = String();
    Expect(']');
    Space();
    if (pos_ != text_.size()) Bad("trailing data");
  }

 private:
  [[noreturn]] void Bad(const char* what) {
    throw CorruptFile(std::string("undecodable key: ") + what + " at " + std::to_string(pos_));
  }
  void Space() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  char Peek() { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void Expect(char c) {
    Space();
    if (Peek() != c) Bad("unexpected character");
    ++pos_;
  }
  uint32_t Hex4() {
    if (pos_ + 4 > text_.size()) Bad("short \\u escape");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9') {
        cp |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        cp |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        cp |= c - 'A' + 10;
      } else {
        Bad("bad \\u escape");
      }
    }
    return cp;
  }
  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  std::string String() {
    Expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) Bad("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) Bad("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) Bad("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = Hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF && pos_ + 1 < text_.size() && text_[pos_] == '\\' &&
              text_[pos_ + 1] == 'u') {
            pos_ += 2;
            uint32_t low = Hex4();
            if (low < 0xDC00 || low > 0xDFFF) Bad("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            Bad("unpaired surrogate");
          }
          AppendUtf8(cp, &out);
          break;
        }
        default: Bad("bad escape");
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void AppendLabels(const Labels& labels, std::string* out) {
  for (const auto& [k, v] : labels) {
    out->append(k).push_back('\x01');
    out->append(v).push_back('\x01');
  }
}

struct ParsedKey {
  std::string metric, sample, help;
  Labels labels;  // sorted, as the Python reader sorts them
  bool has_le = false;
  double le = 0;
  Labels without_le;
  int metric_id = -1;
  int slot_plain = -1;   // summed slot of this key in a counter/summary file
  int slot_bucket = -1;  // ... in a histogram file (buckets keep their le apart)
  SeriesPtr gauge;       // the series of a min/max/sum/mostrecent gauge
};

struct Slot {
  int metric_id;
  SeriesPtr series;
  bool bucket;
  double le;
  SeriesPtr count;  // the _count series of a bucket's label set (or of a histogram's _sum)
};

struct Entry {
  uint32_t offset;
  const std::string* raw;  // the interned key's map node, stable until the caches reset
  ParsedKey* key;
  SeriesPtr pid_series;  // an all/liveall gauge's series, with this file's pid label
};

// Where the value of the entry at `pos`, of a `len`-byte key, lies; its timestamp follows.
size_t ValueAt(size_t pos, size_t len) { return pos + 4 + len + (8 - (len + 4) % 8); }

bool Live(const std::string& mode, const char* base) {
  return mode == base || mode == std::string("live") + base;
}

}  // namespace

struct MultiprocReader::State {
  std::unordered_map<std::string, std::unique_ptr<ParsedKey>> keys;
  std::unordered_map<std::string, std::vector<Entry>> files;
  std::vector<Slot> slots;
  std::unordered_map<std::string, int> slot_index;
  std::unordered_map<std::string, SeriesPtr> series;  // by name and labels
  std::vector<std::string> metrics;
  std::unordered_map<std::string, int> metric_index;
  FileData data;
  // Files kept open between reads, each checked against its path's inode before use: a
  // file replaced under its name is opened anew. Bounded; past the bound, open per read.
  // Each is mapped too, so that a replay reads its values where they lie, without copying
  // the keys around them (nine bytes in ten) out of the page cache.
  struct OpenFile {
    Fd fd;
    dev_t dev;
    ino_t ino;
    size_t used = 0;
    Mapping map;  // covers `used`, or none (the file could not be mapped)
  };
  std::unordered_map<std::string, OpenFile> open;
  MergePlan plan;

  DirWatch watch;

  // Replays the plan if the directory and its files are as planned (with `keys`, each file's
  // keys too); false if not (or not replayable), `dir` then read in part.
  bool Replay(DIR* dir, bool keys, MultiprocResult* result);
  // Replays the plan's values, each file's used size checked (with `keys`, its keys too):
  // false if one differs.
  bool ReplayValues(bool keys, MultiprocResult* result);
  // Merges every file, caching what it parses, and makes a new plan. With `trust`, the keys
  // ReadFile trusts are reused unread; without, every cached key is compared.
  MultiprocResult ReadFull(const std::string& directory, DIR* dir, bool trust);

  // Whether a planned file's mapping holds, byte for byte, the keys it was planned with.
  // Allocates nothing, so that ReadMapped may abandon it.
  bool KeysMatch(const MergePlan::File& file) const {
    auto found = files.find(file.name);
    if (found == files.end()) return false;
    for (const Entry& entry : found->second) {
      const std::string& raw = *entry.raw;
      if (static_cast<size_t>(ReadInt32(file.map, entry.offset)) != raw.size() ||
          std::memcmp(file.map + entry.offset + 4, raw.data(), raw.size()) != 0) {
        return false;
      }
    }
    return true;
  }

  // Reads `name` into `data`; returns false if the file is gone. `*trusted` is how many
  // leading bytes hold the same keys as at the last read, unless the file was written in
  // place (which the caller learns from its watch): a file kept open is the same inode (an
  // open file's inode number cannot be reused), and prometheus_client only appends keys, so
  // up to its last used size unless that shrank; 0 for any other file.
  // `*kept` is the file kept open that was read, null if it was opened for this read only.
  bool ReadFile(const std::string& directory, const std::string& name, size_t* trusted,
                const OpenFile** kept) {
    *trusted = 0;
    *kept = nullptr;
    std::string path = directory + "/" + name;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      open.erase(name);
      if (errno == ENOENT) return false;
      throw CorruptFile(ErrnoText(errno, path));
    }
    auto found = open.find(name);
    if (found == open.end() || found->second.dev != st.st_dev || found->second.ino != st.st_ino) {
      Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0) {
        if (errno == ENOENT) return false;  // removed since the stat
        throw CorruptFile(ErrnoText(errno, path));
      }
      struct stat opened;
      if (::fstat(fd.get(), &opened) != 0) throw CorruptFile(ErrnoText(errno, path));
      if (found == open.end() && open.size() >= kOpenLimit) {
        data.Read(fd.get(), path, 0);
        return true;
      }
      files.erase(name);  // another inode under the name: its cached keys are not this one's
      OpenFile& file = open[name];
      file.fd = std::move(fd);
      file.dev = opened.st_dev;
      file.ino = opened.st_ino;
      file.used = 0;
      file.map = Mapping();  // the replaced file's
      found = open.find(name);
    }
    size_t last = found->second.used;
    try {
      data.Read(found->second.fd.get(), path, last);
    } catch (const CorruptFile&) {
      open.erase(found);
      throw;
    }
    if (data.size() >= last) *trusted = last;
    OpenFile& file = found->second;
    file.used = data.size();
    if (file.map.size() < file.used) {
      // The whole file: prometheus_client grows it in doublings, rarely enough to remap.
      struct stat now;
      size_t size = ::fstat(file.fd.get(), &now) == 0 ? static_cast<size_t>(now.st_size) : 0;
      file.map.Map(file.fd.get(), std::max(size, file.used));
    }
    *kept = &file;
    return true;
  }

  void ResetIfLarge() {
    if (keys.size() > kKeyLimit || slots.size() > kSlotLimit || series.size() > kSlotLimit) {
      files.clear();
      keys.clear();
      slots.clear();
      slot_index.clear();
      series.clear();
      metrics.clear();
      metric_index.clear();
    }
  }

  SeriesPtr SeriesFor(const std::string& name, const Labels& labels) {
    std::string id = name + '\0';
    AppendLabels(labels, &id);
    auto found = series.find(id);
    if (found == series.end()) {
      auto made = std::make_shared<Series>(Series{name, labels, static_cast<uint32_t>(series.size())});
      found = series.emplace(std::move(id), std::move(made)).first;
    }
    return found->second;
  }

  ParsedKey* Intern(std::string_view raw, const std::string** stored) {
    auto found = keys.find(std::string(raw));
    if (found == keys.end()) {
      if (!ValidUtf8(raw)) throw CorruptFile("undecodable key: invalid UTF-8");
      auto key = std::make_unique<ParsedKey>();
      KeyParser(raw).Parse(&key->metric, &key->sample, &key->labels, &key->help);
      std::sort(key->labels.begin(), key->labels.end());
      for (const auto& kv : key->labels) {
        if (kv.first == "le" && !key->has_le) {
          key->has_le = true;
          if (!ParseFloat(kv.second, &key->le)) throw CorruptFile("undecodable key: bad le");
        } else {
          key->without_le.push_back(kv);
        }
      }
      auto [m, fresh] = metric_index.emplace(key->metric, static_cast<int>(metrics.size()));
      if (fresh) metrics.push_back(key->metric);
      key->metric_id = m->second;
      key->gauge = SeriesFor(key->sample, key->labels);
      found = keys.emplace(std::string(raw), std::move(key)).first;
    }
    *stored = &found->first;
    return found->second.get();
  }

  // Every entry of one file, its keys parsed (or found in the caches); past `trusted`, a
  // cached key is reused only where the file holds it byte for byte.
  const std::vector<Entry>& Entries(const std::string& name, const char* data, size_t used,
                                    size_t trusted, const std::string* pid) {
    std::vector<Entry>& cached = files[name];
    size_t pos = kHeader, index = 0;
    // Entries wholly inside the trusted bytes are the cached ones, unchanged.
    while (index < cached.size() && pos == cached[index].offset) {
      size_t end = ValueAt(pos, cached[index].raw->size()) + 16;
      if (end > trusted) break;
      pos = end;
      ++index;
    }
    while (pos < used) {
      if (pos + 4 > used) throw CorruptFile("entry header cut at byte " + std::to_string(pos));
      int32_t length = ReadInt32(data, pos);
      size_t len = length > 0 ? static_cast<size_t>(length) : 0;
      size_t end = ValueAt(pos, len) + 16;
      if (length <= 0 || end > used) {
        throw CorruptFile("entry at byte " + std::to_string(pos) + " runs past the used size " +
                          std::to_string(used));
      }
      std::string_view raw(data + pos + 4, len);
      if (index >= cached.size() || cached[index].offset != pos || *cached[index].raw != raw) {
        // New or changed from here on (a file replaced under its name): parse the rest.
        cached.resize(index);
        Entry entry{static_cast<uint32_t>(pos), nullptr, nullptr, nullptr};
        entry.key = Intern(raw, &entry.raw);
        if (pid != nullptr) {
          Labels labels = entry.key->labels;
          labels.emplace_back("pid", *pid);
          entry.pid_series = SeriesFor(entry.key->sample, labels);
        }
        cached.push_back(std::move(entry));
      }
      pos = end;
      ++index;
    }
    cached.resize(index);
    return cached;
  }

  int SlotFor(ParsedKey* key, bool histogram) {
    int& cached = histogram ? key->slot_bucket : key->slot_plain;
    if (cached >= 0) return cached;
    bool bucket = histogram && key->has_le;
    Slot slot{key->metric_id, nullptr, bucket, bucket ? key->le : 0.0, nullptr};
    std::string id = key->metric + '\0';
    if (bucket) {
      Labels labels = key->without_le;
      slot.count = SeriesFor(key->metric + "_count", labels);
      labels.emplace_back("le", FloatToGoString(key->le));
      slot.series = SeriesFor(key->metric + "_bucket", labels);
      id.append("b\0").append(slot.series->name).push_back('\0');
      AppendLabels(key->without_le, &id);
      id.append("\0").append(FormatValue(key->le));
    } else {
      slot.series = SeriesFor(key->sample, key->labels);
      id.append("p\0").append(key->sample).push_back('\0');
      AppendLabels(key->labels, &id);
    }
    auto [it, inserted] = slot_index.emplace(id, static_cast<int>(slots.size()));
    if (inserted) slots.push_back(std::move(slot));
    cached = it->second;
    return cached;
  }
};

MultiprocReader::MultiprocReader(std::string directory)
    : directory_(std::move(directory)), state_(std::make_unique<State>()) {}

MultiprocReader::~MultiprocReader() = default;

MultiprocResult MultiprocReader::Read() {
  State& st = *state_;
  MultiprocResult result;
  // Nothing listed or cut since the last read: the files are those planned, at their sizes,
  // so a replay that fails found new keys, which only a full read parses.
  const DirWatch::Change change = st.watch.Changed(directory_);
  const bool quiet = change == DirWatch::Change::kNothing;
  if (quiet && st.plan.replayable && st.ReplayValues(false, &result)) return result;
  Dir dir(directory_);
  if (dir.get() == nullptr) throw DirectoryError(ErrnoText(errno, directory_));
  // A file written in place (not through its mapping) may hold other keys where the cache
  // and the plan have theirs, even at the same size: then both compare them. Without a
  // watch, full reads always do; replays do not (a listing and an fstat per file is all
  // that mode costs them), so a rewrite that keeps the used size waits for a full read.
  const bool written = change == DirWatch::Change::kContents;
  if (!quiet && st.Replay(dir.get(), written, &result)) return result;
  ::rewinddir(dir.get());
  return st.ReadFull(directory_, dir.get(), !written && st.watch.Watching());
}

bool MultiprocReader::State::Replay(DIR* dir, bool keys, MultiprocResult* result) {
  if (!plan.replayable || !plan.Lists(dir)) return false;
  for (const MergePlan::File& file : plan.files) {
    // Past the end of a file its mapping reads zeros (or faults), so the file must still
    // hold the used bytes; one cut after this check faults, which ReadMapped catches.
    struct stat now;
    if (::fstat(file.fd, &now) != 0 || static_cast<size_t>(now.st_size) < file.used) return false;
  }
  return ReplayValues(keys, result);
}

bool MultiprocReader::State::ReplayValues(bool keys, MultiprocResult* result) {
  plan.Start();
  for (const MergePlan::File& file : plan.files) {
    // Another used size is new entries (or a file cut short): a full read parses them.
    bool same = false;
    bool read = ReadMapped([&] {
      same = static_cast<size_t>(ReadInt32(file.map, 0)) == file.used &&
             (!keys || KeysMatch(file)) && plan.Apply(file, file.map, false);
    });
    if (!read || !same) return false;
  }
  if (!plan.AllSet()) return false;
  result->families = plan.Output();
  result->files = static_cast<int>(plan.files.size());
  return true;
}

MultiprocResult MultiprocReader::State::ReadFull(const std::string& directory, DIR* dir,
                                                 bool trust) {
  plan.Clear();  // first: the files it names may be closed below
  struct Listed {
    std::string name;
    ino_t ino;
    uint32_t position;  // in readdir's order
  };
  std::vector<Listed> names;
  while (dirent* item = ::readdir(dir)) {
    if (IsDb(item->d_name)) {
      names.push_back(Listed{item->d_name, item->d_ino, static_cast<uint32_t>(names.size())});
    }
  }
  std::sort(names.begin(), names.end(),
            [](const Listed& a, const Listed& b) { return a.name < b.name; });
  auto is_listed = [&names](const std::string& name) {
    auto it = std::lower_bound(names.begin(), names.end(), name,
                               [](const Listed& l, const std::string& n) { return l.name < n; });
    return it != names.end() && it->name == name;
  };
  ResetIfLarge();
  // Forget files that are gone so the per-file caches stay as large as the directory.
  for (auto it = files.begin(); it != files.end();) {
    it = is_listed(it->first) ? std::next(it) : files.erase(it);
  }
  for (auto it = open.begin(); it != open.end();) {
    it = is_listed(it->first) ? std::next(it) : open.erase(it);
  }

  bool replayable = true;  // every file read, kept open, and under the inode listed
  MultiprocResult result;
  // Per metric id: (type, help) of the first file that has it, as the Python reader keeps.
  std::vector<const std::string*> meta_type(metrics.size(), nullptr);
  std::vector<const std::string*> meta_help(metrics.size(), nullptr);
  std::vector<std::string> types;  // file types seen, addresses stable (reserved)
  types.reserve(names.size());
  std::vector<int> dense_of_slot(slots.size(), -1);  // the plan's summed slot of each slot
  std::vector<int> touched;                          // slots in first-touch order
  std::vector<int> gauge_metrics;                    // gauge families' metrics, in order
  std::vector<int> gauge_of_metric(metrics.size(), -1);
  struct GaugeSeries {
    SeriesPtr series;
    int family;  // in gauge_metrics
  };
  std::vector<GaugeSeries> gauge_series;  // by the plan's gauge series
  // By metric id and series id: a series may be in two families, under two metric names.
  std::unordered_map<uint64_t, uint32_t> gauge_index;
  for (const Listed& item : names) {
    const std::string& name = item.name;
    std::string_view stem = std::string_view(name).substr(0, name.size() - 3);
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      size_t us = stem.find('_', start);
      parts.emplace_back(stem.substr(start, us == std::string_view::npos ? us : us - start));
      if (us == std::string_view::npos) break;
      start = us + 1;
    }
    const std::string& typ = parts.front();
    bool gauge = typ == "gauge";
    std::string mode_name = gauge ? (parts.size() == 3 ? parts[1] : "all") : "";
    Mode mode = !gauge                          ? Mode::kSum
                : Live(mode_name, "mostrecent") ? Mode::kMostRecent
                : Live(mode_name, "min")        ? Mode::kMin
                : Live(mode_name, "max")        ? Mode::kMax
                : Live(mode_name, "sum")        ? Mode::kGaugeSum
                                                : Mode::kAll;
    const std::vector<Entry>* entries;
    const OpenFile* kept;
    try {
      size_t trusted = 0;
      if (!ReadFile(directory, name, &trusted, &kept)) {
        replayable = false;
        continue;
      }
      if (!trust) trusted = 0;
      entries = &Entries(name, data.data(), data.size(), trusted,
                         mode == Mode::kAll ? &parts.back() : nullptr);
    } catch (const CorruptFile& exc) {
      files.erase(name);
      result.corrupt.push_back(name + ": " + exc.what());
      replayable = false;
      continue;
    }
    ++result.files;
    if (meta_type.size() < metrics.size()) {
      meta_type.resize(metrics.size(), nullptr);
      meta_help.resize(metrics.size(), nullptr);
      gauge_of_metric.resize(metrics.size(), -1);
    }
    if (types.empty() || types.back() != typ) types.push_back(typ);
    bool histogram = typ == "histogram";
    MergePlan::File file{name, item.ino, -1, data.size(), nullptr, mode,
                         static_cast<uint32_t>(plan.ops.size()), 0};
    for (const Entry& entry : *entries) {
      ParsedKey& key = *entry.key;
      if (meta_type[key.metric_id] == nullptr) {
        meta_type[key.metric_id] = &types.back();
        meta_help[key.metric_id] = &key.help;
      }
      uint32_t target;
      if (gauge) {
        int& family = gauge_of_metric[key.metric_id];
        if (family < 0) {
          family = static_cast<int>(gauge_metrics.size());
          gauge_metrics.push_back(key.metric_id);
        }
        const SeriesPtr& series = mode == Mode::kAll ? entry.pid_series : key.gauge;
        uint64_t id = static_cast<uint64_t>(key.metric_id) << 32 | series->id;
        auto [it, fresh] = gauge_index.emplace(id, static_cast<uint32_t>(gauge_series.size()));
        if (fresh) {
          gauge_series.push_back(GaugeSeries{series, family});
          plan.AddGauge();
        }
        target = it->second;
      } else {
        size_t slot = static_cast<size_t>(SlotFor(&key, histogram));
        if (slot >= dense_of_slot.size()) dense_of_slot.resize(slots.size(), -1);
        int& dense = dense_of_slot[slot];
        if (dense < 0) {
          dense = static_cast<int>(plan.AddSlot());
          touched.push_back(static_cast<int>(slot));
        }
        target = static_cast<uint32_t>(dense);
      }
      plan.ops.push_back(MergePlan::Op{
          static_cast<uint32_t>(ValueAt(entry.offset, entry.raw->size())), target});
    }
    file.end = static_cast<uint32_t>(plan.ops.size());
    plan.Apply(file, data.data(), true);
    // A file that cannot be mapped (a filesystem without mmap) is read in full every time.
    if (kept != nullptr && kept->ino == item.ino && kept->map.size() >= file.used) {
      file.fd = kept->fd.get();
      file.map = kept->map.data();
      plan.files.push_back(std::move(file));
    } else {
      replayable = false;
    }
  }
  if (meta_type.size() < metrics.size()) {
    meta_type.resize(metrics.size(), nullptr);
    meta_help.resize(metrics.size(), nullptr);
  }

  // Summed slots into families, as MultiProcessCollector._accumulate_metrics orders them:
  // plain samples, then per label set the buckets by le (cumulative), _count, then _sum.
  struct Group {
    const Slot* first;
    std::vector<std::pair<double, int>> buckets;
  };
  struct SumFamily {
    std::vector<int> plain;
    std::vector<Group> groups;
  };
  // By _count series id: its bucket group's position in the family, and its _sum slot.
  std::vector<int> group_of(series.size(), -1), sum_of(series.size(), -1);
  std::vector<int> order;
  std::vector<int> family_of_metric(metrics.size(), -1);
  std::vector<SumFamily> sum_families;
  for (int index : touched) {
    Slot& slot = slots[index];
    int& f = family_of_metric[slot.metric_id];
    if (f < 0) {
      f = static_cast<int>(sum_families.size());
      sum_families.emplace_back();
      order.push_back(slot.metric_id);
    }
    SumFamily& fam = sum_families[f];
    const std::string& metric = metrics[slot.metric_id];
    if (slot.bucket) {
      int& g = group_of[slot.count->id];
      if (g < 0) {
        g = static_cast<int>(fam.groups.size());
        fam.groups.push_back(Group{&slot, {}});
      }
      fam.groups[g].buckets.emplace_back(slot.le, index);
    } else if (*meta_type[slot.metric_id] == "histogram") {
      // Only _sum is kept: _count is the bucket total, as prometheus_client makes it.
      if (slot.series->name.size() == metric.size() + 4 &&
          slot.series->name.compare(0, metric.size(), metric) == 0 &&
          slot.series->name.compare(metric.size(), 4, "_sum") == 0) {
        // Keyed by the matching _count series, which buckets of the same labels share.
        if (slot.count == nullptr) {
          slot.count = SeriesFor(metric + "_count", slot.series->labels);
          if (slot.count->id >= group_of.size()) {
            group_of.resize(series.size(), -1);
            sum_of.resize(series.size(), -1);
          }
        }
        sum_of[slot.count->id] = index;
      }
    } else {
      fam.plain.push_back(index);
    }
  }
  std::vector<Family> families;
  std::vector<std::vector<MergePlan::Fill>> fills;  // per family: gauges may join a summed one
  auto add = [&families, &fills](size_t out, const SeriesPtr& series, MergePlan::Fill::Kind kind,
                                 int index) {
    families[out].samples.push_back(Sample{series, 0.0});
    fills[out].push_back(MergePlan::Fill{kind, static_cast<uint32_t>(index)});
  };
  auto add_family = [&](int metric_id) {
    families.push_back(
        Family{metrics[metric_id], *meta_type[metric_id], *meta_help[metric_id], {}});
    fills.emplace_back();
    return families.size() - 1;
  };
  std::vector<int> out_of_metric(metrics.size(), -1);
  for (size_t f = 0; f < order.size(); ++f) {
    size_t out = add_family(order[f]);
    out_of_metric[order[f]] = static_cast<int>(out);
    SumFamily& sf = sum_families[f];
    for (int index : sf.plain) {
      add(out, slots[index].series, MergePlan::Fill::kTotal, dense_of_slot[index]);
    }
    for (Group& group : sf.groups) {
      std::sort(group.buckets.begin(), group.buckets.end());
      for (size_t b = 0; b < group.buckets.size(); ++b) {
        int index = group.buckets[b].second;
        add(out, slots[index].series,
            b == 0 ? MergePlan::Fill::kFirstBucket : MergePlan::Fill::kBucket,
            dense_of_slot[index]);
      }
      add(out, group.first->count, MergePlan::Fill::kCount, 0);
      int sum = sum_of[group.first->count->id];
      if (sum >= 0) add(out, slots[sum].series, MergePlan::Fill::kTotal, dense_of_slot[sum]);
    }
  }
  // Gauges follow, each family's in the order they were first set.
  std::vector<std::vector<uint32_t>> set_in(gauge_metrics.size());
  for (uint32_t index : plan.set_order) set_in[gauge_series[index].family].push_back(index);
  for (size_t g = 0; g < gauge_metrics.size(); ++g) {
    int& out = out_of_metric[gauge_metrics[g]];
    if (out < 0) out = static_cast<int>(add_family(gauge_metrics[g]));
    for (uint32_t index : set_in[g]) {
      add(static_cast<size_t>(out), gauge_series[index].series, MergePlan::Fill::kGauge,
          static_cast<int>(index));
    }
  }
  for (const auto& family_fills : fills) {
    plan.fills.insert(plan.fills.end(), family_fills.begin(), family_fills.end());
  }

  plan.Finish(std::move(families));
  if (replayable) {
    plan.listed.resize(names.size());
    for (size_t i = 0; i < names.size(); ++i) plan.listed[names[i].position] = i;
    plan.replayable = true;
  }
  result.families = plan.Output();
  return result;
}

}  // namespace llm_serving::metrics
