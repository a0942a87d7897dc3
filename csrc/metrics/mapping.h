// Read-only mappings of the .db files, which a replay reads in place instead of copying them,
// and the guard that turns a file cut short under a mapping into a failed read, not a crash.
#pragma once

#include <csetjmp>
#include <cstddef>

namespace llm_serving::metrics {

// A shared read-only mapping of a file's first bytes, unmapped on every path.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping() { Unmap(); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;

  // Maps `fd`'s first `size` bytes; false (and unmapped) where the file cannot be mapped.
  bool Map(int fd, size_t size);
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Unmap();
  const char* data_ = nullptr;
  size_t size_ = 0;
};

namespace detail {
sigjmp_buf*& BusJump();  // the calling thread's guarded read, if any
void InstallBusHandler();
}  // namespace detail

// Runs `read` and returns true, or false where a file was cut short under a mapping it read
// (SIGBUS). `read` is then abandoned midway, so it must only read mappings and write memory
// that is already allocated: no allocation, no lock, nothing to release. The calling thread
// must not block SIGBUS (a blocked synchronous signal kills the process).
template <typename Read>
bool ReadMapped(Read&& read) {
  detail::InstallBusHandler();
  sigjmp_buf*& guard = detail::BusJump();
  sigjmp_buf jump;
  // No signal mask saved: the handler runs with SA_NODEFER, so nothing is left blocked.
  if (sigsetjmp(jump, 0) != 0) {
    guard = nullptr;
    return false;
  }
  guard = &jump;
  read();
  guard = nullptr;
  return true;
}

}  // namespace llm_serving::metrics
