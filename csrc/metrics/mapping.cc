#include "mapping.h"

#include <signal.h>
#include <sys/mman.h>

#include <mutex>

namespace llm_serving::metrics {

Mapping::Mapping(Mapping&& other) noexcept : data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    Unmap();
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

bool Mapping::Map(int fd, size_t size) {
  Unmap();
  if (size == 0) return false;
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) return false;
  data_ = static_cast<const char*>(addr);
  size_ = size;
  return true;
}

void Mapping::Unmap() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

namespace detail {

namespace {

// Signal dispositions are process-wide, so the handler and the one it replaced are too. The
// guard pointer is static TLS: the handler reads it without the dynamic TLS allocator.
__attribute__((tls_model("initial-exec"))) thread_local sigjmp_buf* t_bus_jump = nullptr;
struct sigaction g_previous_bus;

void OnBus(int signo, siginfo_t* info, void*) {
  if (t_bus_jump != nullptr) siglongjmp(*t_bus_jump, 1);
  // Not a guarded read: whatever handled SIGBUS before (the default: a core dump; or
  // Python's faulthandler) handles this one, as if this handler had never been installed.
  ::sigaction(SIGBUS, &g_previous_bus, nullptr);
  if (info->si_code <= 0) ::raise(signo);  // sent by kill(): no fault to run again
}

}  // namespace

sigjmp_buf*& BusJump() { return t_bus_jump; }

void InstallBusHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = OnBus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_bus);
  });
}

}  // namespace detail

}  // namespace llm_serving::metrics
