#include "dir_watch.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace llm_serving::metrics {

namespace {

constexpr uint32_t kEvents = IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MODIFY |
                             IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR;
// The watch is gone (the directory removed or moved away) or events were dropped.
constexpr uint32_t kBroken = IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF | IN_Q_OVERFLOW;

}  // namespace

DirWatch::~DirWatch() { Close(); }

void DirWatch::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

DirWatch::Change DirWatch::Changed(const std::string& directory) {
  if (fd_ < 0) {
    fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd_ >= 0 && ::inotify_add_watch(fd_, directory.c_str(), kEvents) < 0) Close();
    return Change::kEntries;  // nothing seen before the watch began
  }
  bool changed = false, written = false, broken = false;
  alignas(inotify_event) char buffer[4096];
  for (;;) {
    ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken = broken || n == 0 || errno != EAGAIN;
      break;
    }
    changed = true;
    for (ssize_t at = 0; at < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      broken = broken || (event->mask & kBroken) != 0;
      written = written || (event->mask & IN_MODIFY) != 0;
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
  if (broken) Close();
  if (broken || written) return Change::kContents;
  return changed ? Change::kEntries : Change::kNothing;
}

}  // namespace llm_serving::metrics
