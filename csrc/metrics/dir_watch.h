// Whether anything in a multiprocess directory changed between two reads, from inotify, so
// that a read of an unchanged directory skips listing it and checking every file's size.
#pragma once

#include <string>

namespace llm_serving::metrics {

// Entries created, removed or renamed, and files cut or grown by truncate, are events; writes
// through a mapping (all prometheus_client makes once a file exists) are not, which the
// replay's check of each file's used size covers. Where inotify is unavailable (no instance
// left, a filesystem that does not report) every call says "changed".
class DirWatch {
 public:
  DirWatch() = default;
  ~DirWatch();
  DirWatch(const DirWatch&) = delete;
  DirWatch& operator=(const DirWatch&) = delete;

  // Whether `directory` may have changed since the last call (always, on the first one and
  // after the watch broke: the directory removed or replaced, events lost).
  bool Changed(const std::string& directory);

 private:
  void Close();
  int fd_ = -1;
};

}  // namespace llm_serving::metrics
