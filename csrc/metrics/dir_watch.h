// Whether anything in a multiprocess directory changed between two reads, from inotify, so
// that a read of an unchanged directory skips listing it and checking every file's size.
#pragma once

#include <string>

namespace llm_serving::metrics {

// Entries created, removed or renamed, and files written or cut or grown by write(2) and
// truncate(2), are events; writes through a mapping (all prometheus_client makes once a file
// exists) are not, which the replay's check of each file's used size covers. Where inotify is
// unavailable (no instance left, a filesystem that does not report) every call says kEntries.
class DirWatch {
 public:
  enum class Change {
    kNothing,
    kEntries,   // entries or sizes may differ: the listing and each file's size tell
    kContents,  // a file was written other than through its mapping, or events were lost:
                // its keys may differ where a replay would read values
  };

  DirWatch() = default;
  ~DirWatch();
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

  // What may have changed in `directory` since the last call (kEntries on the first one,
  // kContents after the watch broke: the directory removed or replaced, events lost).
  Change Changed(const std::string& directory);
  // Whether a watch is in place; where none could be made, kEntries is all Changed() says.
  bool Watching() const { return fd_ >= 0; }

 private:
  void Close();
  int fd_ = -1;
};

}  // namespace llm_serving::metrics
