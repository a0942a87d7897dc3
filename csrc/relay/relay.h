// The port gate's byte relay: one epoll thread moves bytes between each accepted public
// connection and its own upstream connection (small reads copied, bulk data spliced through a
// pipe per direction), so no per-request work ever reaches Python.
#ifndef LLM_SERVING_RELAY_RELAY_H_
#define LLM_SERVING_RELAY_RELAY_H_

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace llm_serving::relay {

// An owned file descriptor (closed on destruction, movable, not copyable).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.Release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int Release();
  void Reset();

 private:
  int fd_ = -1;
};

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

struct Connection;
struct Listener;

// A closed-until-opened TCP relay to one upstream address. Every public method may be called
// from any thread; the ones that touch sockets run on the relay thread and wait for it.
class Relay {
 public:
  // Resolves the upstream address now; `use_splice` false copies bulk data too.
  Relay(const std::string& upstream_host, int upstream_port, bool use_splice);
  ~Relay();
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Binds and listens on every address of `host` (throws std::system_error, e.g. EADDRINUSE);
  // returns the bound port (the one the kernel chose when `port` is 0).
  int Open(const std::string& host, int port, int backlog);
  // Accepts what waits in the backlog, then closes the listening sockets: new connections
  // are refused, relayed ones stay up.
  void StopAccepting();
  // Closes every relayed connection (both of its sockets).
  void CloseConnections();
  // Stops the relay thread after closing everything; later calls throw std::logic_error.
  void Close();

  bool accepting() const { return accepting_.load(); }
  std::size_t connections() const { return connections_count_.load(); }

 private:
  void Loop();
  // Runs `task` on the relay thread and waits for it; rethrows what it threw.
  void Call(std::function<void()> task);
  void RunTasks();
  void Accept(int listener);
  void CloseListeners();
  void Dispatch(Connection& conn, int side, std::uint32_t events);
  // Pumps the chosen directions, then drops the connection if one failed or both finished.
  void Finish(Connection& conn, bool pump_up, bool pump_down);
  // Closes both sockets; with abort they are reset (SO_LINGER 0) rather than closed cleanly.
  void Drop(Connection& conn, bool abort = false);

  Address upstream_;
  bool use_splice_;
  std::vector<char> scratch_;  // the relay thread's copy buffer
  Fd epoll_;
  Fd wake_;
  // Owned by the relay thread, like every socket below.
  std::vector<std::unique_ptr<Listener>> listeners_;
  std::vector<std::unique_ptr<Listener>> dropped_listeners_;
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections_;
  std::vector<std::unique_ptr<Connection>> dropped_;
  Fd spare_upstream_;  // made before each accept, so a client is never accepted without one
  bool starved_ = false;  // an accept ran out of descriptors: retry once a connection closes
  bool quit_ = false;  // set by Close's task, on the relay thread
  std::atomic<bool> accepting_{false};
  std::atomic<std::size_t> connections_count_{0};

  struct Task {
    std::function<void()> run;
    std::exception_ptr error;
    bool done = false;
  };
  std::mutex mutex_;
  std::condition_variable done_;
  std::deque<Task*> tasks_;
  bool stopping_ = false;  // guarded by mutex_
  std::mutex close_mutex_;
  std::thread thread_;
};

}  // namespace llm_serving::relay

#endif  // LLM_SERVING_RELAY_RELAY_H_
