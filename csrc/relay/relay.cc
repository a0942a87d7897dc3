#include "relay.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace llm_serving::relay {
namespace {

// Bytes moved per splice (a default pipe's capacity).
constexpr std::size_t kChunk = 1 << 16;
// The relay thread's copy buffer: a read that fills it switches its direction to splice.
constexpr std::size_t kScratch = 1 << 14;
constexpr int kMaxEvents = 128;
// epoll tags: 0 is the wake-up eventfd; otherwise an 8-aligned pointer whose bit 1 marks a
// listener and whose bit 0 is the connection side (0 public client, 1 upstream).
constexpr std::uint64_t kWakeTag = 0;
constexpr std::uint64_t kListenerBit = 2;
constexpr std::uint32_t kSocketEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;

[[noreturn]] void ThrowErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// One owned addrinfo list.
struct AddrInfo {
  addrinfo* list = nullptr;
  AddrInfo() = default;
  AddrInfo(const AddrInfo&) = delete;
  AddrInfo& operator=(const AddrInfo&) = delete;
  ~AddrInfo() {
    if (list != nullptr) freeaddrinfo(list);
  }
};

void CheckPort(int port) {
  if (port < 0 || port > 65535) {
    throw std::invalid_argument("port must be in 0..65535, got " + std::to_string(port));
  }
}

void Resolve(const std::string& host, int port, bool passive, AddrInfo& out) {
  CheckPort(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out.list);
  if (rc != 0 || out.list == nullptr) {
    throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                            "cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
}

void SetPort(sockaddr* address, int port) {
  if (address->sa_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (address->sa_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(static_cast<uint16_t>(port));
  }
}

int BoundPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) < 0) {
    ThrowErrno("getsockname");
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

void NoDelay(int fd) {
  int one = 1;
  // Without it, a small gRPC frame waits for the previous one's ACK (Nagle) on each hop.
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void Watch(int epoll, int fd, std::uint32_t events, std::uint64_t tag) {
  epoll_event event{};
  event.events = events;
  event.data.u64 = tag;
  if (epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event) < 0) ThrowErrno("epoll_ctl");
}

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

// Out of descriptors or memory: retried once a relayed connection closes and frees some.
bool IsShortage(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = other.Release();
  }
  return *this;
}

int Fd::Release() { return std::exchange(fd_, -1); }

void Fd::Reset() {
  if (fd_ >= 0) close(std::exchange(fd_, -1));
}

// One direction of a relayed connection. Small reads (gRPC frames, streamed tokens) go through
// the relay thread's scratch buffer straight to `dst`: for a few hundred bytes a copy is cheaper
// than splice's page references. A read that fills the scratch buffer means bulk data: the
// direction then splices through its pipe (zero-copy) until a read comes back short. Bytes `dst`
// cannot take yet wait in the pipe or in `leftover`, and nothing more is read meanwhile: that is
// the back-pressure.
struct Direction {
  int src = -1;
  int dst = -1;
  bool can_splice = false;
  bool bulk = false;
  Fd pipe_read;  // created at the first bulk read
  Fd pipe_write;
  std::vector<char> leftover;
  std::size_t head = 0;
  std::size_t pending = 0;
  bool in_pipe = false;  // whether the pending bytes are in the pipe or in `leftover`
  bool eof = false;      // src sent FIN
  bool shut = false;     // dst got our FIN: this direction is finished
  bool blocked = false;  // dst's send buffer is full; its EPOLLOUT resumes us
  bool src_hangup = false;  // an event reported src's FIN (or an error): read it to the end

  enum class State { kWaiting, kDone, kFailed };

  void StopSplicing() {
    can_splice = false;
    bulk = false;
    pipe_read.Reset();
    pipe_write.Reset();
  }

  bool HasPipe() {
    if (!pipe_read) {
      int fds[2];
      if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0) return false;  // e.g. EMFILE: keep copying
      pipe_read = Fd(fds[0]);
      pipe_write = Fd(fds[1]);
    }
    return true;
  }

  // Moves bytes until a socket would block. A short copy read has emptied src's queue, and
  // anything arriving later raises a new edge, so the EAGAIN read after it is skipped (one
  // syscall in four per relayed message); once src's FIN was reported it is read to the end.
  State Pump(std::vector<char>& scratch) {
    bool drained = false;
    for (;;) {
      if (pending > 0) {
        ssize_t n = in_pipe ? splice(pipe_read.get(), nullptr, dst, nullptr, pending,
                                     SPLICE_F_MOVE | SPLICE_F_NONBLOCK)
                            : send(dst, leftover.data() + head, pending, MSG_NOSIGNAL);
        if (n > 0) {
          pending -= static_cast<std::size_t>(n);
          head += static_cast<std::size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && WouldBlock()) {
          blocked = true;
          return State::kWaiting;
        }
        return State::kFailed;
      }
      blocked = false;
      if (eof) {
        if (!shut) {
          // Half-close: the peer learns that no more bytes come, and may still answer.
          shutdown(dst, SHUT_WR);
          shut = true;
        }
        return State::kDone;
      }
      head = 0;
      ssize_t n;
      if (bulk && !HasPipe()) StopSplicing();
      if (bulk) {
        n = splice(src, nullptr, pipe_write.get(), nullptr, kChunk,
                   SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n < 0 && errno == EINVAL) {
          StopSplicing();  // a socket type without splice support: copy instead
          continue;
        }
        if (n > 0) {
          in_pipe = true;
          pending = static_cast<std::size_t>(n);
          bulk = static_cast<std::size_t>(n) == kChunk;
          continue;
        }
        bulk = false;
      } else {
        if (drained && !src_hangup) return State::kWaiting;
        n = recv(src, scratch.data(), scratch.size(), 0);
        if (n > 0) {
          drained = static_cast<std::size_t>(n) < scratch.size();
          bulk = can_splice && !drained;
          ssize_t sent = send(dst, scratch.data(), static_cast<std::size_t>(n), MSG_NOSIGNAL);
          if (sent < 0 && !WouldBlock() && errno != EINTR) return State::kFailed;
          sent = std::max<ssize_t>(sent, 0);
          if (sent < n) {
            // dst is full: keep the rest; the loop's next write attempt arms EPOLLOUT.
            leftover.assign(scratch.data() + sent, scratch.data() + n);
            in_pipe = false;
            pending = static_cast<std::size_t>(n - sent);
          }
          continue;
        }
      }
      if (n == 0) {
        eof = true;
        continue;
      }
      if (errno == EINTR) continue;
      return WouldBlock() ? State::kWaiting : State::kFailed;
    }
  }
};

struct Connection {
  Fd sockets[2];  // public client, upstream
  Direction directions[2];  // client -> upstream, upstream -> client
  bool connecting = false;
  bool closed = false;

  Connection(Fd client, Fd upstream, bool use_splice) {
    sockets[0] = std::move(client);
    sockets[1] = std::move(upstream);
    for (int side = 0; side < 2; ++side) {
      directions[side].src = sockets[side].get();
      directions[side].dst = sockets[1 - side].get();
      directions[side].can_splice = use_splice;
    }
  }

  std::uint64_t Tag(int side) const { return reinterpret_cast<std::uintptr_t>(this) | side; }
};

struct Listener {
  Fd socket;
  bool closed = false;
};

Relay::Relay(const std::string& upstream_host, int upstream_port, bool use_splice)
    : use_splice_(use_splice), scratch_(kScratch) {
  AddrInfo found;
  Resolve(upstream_host, upstream_port, false, found);
  std::memcpy(&upstream_.storage, found.list->ai_addr, found.list->ai_addrlen);
  upstream_.length = found.list->ai_addrlen;
  epoll_ = Fd(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) ThrowErrno("epoll_create1");
  wake_ = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_) ThrowErrno("eventfd");
  Watch(epoll_.get(), wake_.get(), EPOLLIN, kWakeTag);
  // The relay thread blocks every signal, so SIGTERM and friends reach Python's main thread.
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  try {
    thread_ = std::thread([this] { Loop(); });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

Relay::~Relay() {
  try {
    Close();
  } catch (...) {
    // Nothing sensible to do in a destructor; the process is going away.
  }
}

int Relay::Open(const std::string& host, int port, int backlog) {
  AddrInfo found;
  Resolve(host, port, true, found);
  std::vector<Fd> bound;
  int bound_port = port;
  // An IPv6 listener takes IPv4 clients too (the bare "::" wildcard), unless the host also
  // resolved to IPv4 addresses, which then get listeners of their own.
  bool has_ipv4 = false;
  for (addrinfo* ai = found.list; ai != nullptr; ai = ai->ai_next) {
    has_ipv4 = has_ipv4 || ai->ai_family == AF_INET;
  }
  for (addrinfo* ai = found.list; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) ThrowErrno("socket");
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      const int v6_only = has_ipv4 ? 1 : 0;
      setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &v6_only, sizeof(v6_only));
    }
    // Every address of the host gets the same port, the one chosen for the first.
    SetPort(ai->ai_addr, bound_port);
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) < 0) {
      const int error = errno;  // before building the message, which may allocate
      throw std::system_error(error, std::generic_category(),
                              "cannot bind " + host + ":" + std::to_string(bound_port));
    }
    if (listen(fd.get(), backlog) < 0) ThrowErrno("listen");
    bound_port = BoundPort(fd.get());
    bound.push_back(std::move(fd));
  }
  Call([&] {
    if (!listeners_.empty()) throw std::logic_error("the relay is already accepting");
    for (Fd& fd : bound) {
      auto listener = std::make_unique<Listener>();
      listener->socket = std::move(fd);
      Watch(epoll_.get(), listener->socket.get(), EPOLLIN | EPOLLET,
            reinterpret_cast<std::uintptr_t>(listener.get()) | kListenerBit);
      listeners_.push_back(std::move(listener));
    }
    accepting_ = true;
  });
  return bound_port;
}

void Relay::StopAccepting() {
  Call([this] {
    // A client whose connect() already returned is in the backlog: relay it rather than reset
    // it with the listener. Only a connection completing in the next microseconds is refused.
    for (auto& listener : listeners_) Accept(listener->socket.get());
    CloseListeners();
  });
}

void Relay::CloseConnections() {
  Call([this] {
    while (!connections_.empty()) Drop(*connections_.begin()->second);
  });
}

void Relay::Close() {
  std::lock_guard<std::mutex> closing(close_mutex_);
  if (!thread_.joinable()) return;
  Call([this] {
    CloseListeners();
    while (!connections_.empty()) Drop(*connections_.begin()->second);
    quit_ = true;
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  });
  thread_.join();
}

void Relay::CloseListeners() {
  accepting_ = false;
  for (auto& listener : listeners_) {
    listener->closed = true;
    listener->socket.Reset();
    dropped_listeners_.push_back(std::move(listener));
  }
  listeners_.clear();
  spare_upstream_.Reset();
}

void Relay::Call(std::function<void()> task) {
  Task queued{std::move(task), nullptr, false};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw std::logic_error("the relay is closed");
    tasks_.push_back(&queued);
  }
  std::uint64_t one = 1;
  while (write(wake_.get(), &one, sizeof(one)) < 0 && errno == EINTR) {
  }
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return queued.done; });
  if (queued.error) std::rethrow_exception(queued.error);
}

void Relay::RunTasks() {
  std::deque<Task*> tasks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks.swap(tasks_);
  }
  for (Task* task : tasks) {
    try {
      task->run();
    } catch (...) {
      task->error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    task->done = true;  // the caller may destroy *task as soon as the lock is released
  }
  done_.notify_all();
}

void Relay::Loop() {
  epoll_event events[kMaxEvents];
  for (;;) {
    int n = epoll_wait(epoll_.get(), events, kMaxEvents, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      n = 0;  // cannot happen with a valid epoll fd; fall through to the stop check
    }
    for (int i = 0; i < n; ++i) {
      const std::uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) {
        std::uint64_t count;
        while (read(wake_.get(), &count, sizeof(count)) < 0 && errno == EINTR) {
        }
        RunTasks();
      } else if (tag & kListenerBit) {
        auto* listener = reinterpret_cast<Listener*>(tag & ~kListenerBit);
        if (!listener->closed) Accept(listener->socket.get());
      } else {
        auto* conn = reinterpret_cast<Connection*>(tag & ~std::uint64_t{1});
        if (!conn->closed) Dispatch(*conn, static_cast<int>(tag & 1), events[i].events);
      }
    }
    if (starved_ && !dropped_.empty()) {
      starved_ = false;  // set again if descriptors are still short
      for (auto& listener : listeners_) Accept(listener->socket.get());
    }
    // Closed objects live until the end of the batch: later events may still point at them.
    dropped_.clear();
    dropped_listeners_.clear();
    if (quit_) break;
  }
  // Callers that queued work before the stop get their answer instead of waiting forever.
  RunTasks();
}

void Relay::Accept(int listener) {
  for (;;) {
    // The upstream socket comes first: with one descriptor left, accepting first would take the
    // client out of the backlog only to close it, and so on through the whole backlog.
    if (!spare_upstream_) {
      spare_upstream_ =
          Fd(socket(upstream_.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      if (!spare_upstream_ && IsShortage(errno)) {
        starved_ = true;
        return;
      }
      if (spare_upstream_) NoDelay(spare_upstream_.get());
    }
    Fd client(accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!client) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // EAGAIN: the backlog is empty. Out of descriptors or memory: the connection waits in
      // the backlog, and the loop accepts again once a relayed connection has closed (the
      // edge that announced it has passed), rather than spinning here.
      if (IsShortage(errno)) starved_ = true;
      return;
    }
    NoDelay(client.get());
    Fd upstream = std::move(spare_upstream_);
    if (!upstream) continue;  // socket() failed for another reason: the client sees it closed
    bool connecting = false;
    if (connect(upstream.get(), reinterpret_cast<const sockaddr*>(&upstream_.storage),
                upstream_.length) < 0) {
      if (errno != EINPROGRESS) continue;  // refused: close the client at once
      connecting = true;
    }
    try {
      auto conn = std::make_unique<Connection>(std::move(client), std::move(upstream), use_splice_);
      conn->connecting = connecting;
      Watch(epoll_.get(), conn->sockets[0].get(), kSocketEvents, conn->Tag(0));
      Watch(epoll_.get(), conn->sockets[1].get(), kSocketEvents, conn->Tag(1));
      Connection* key = conn.get();
      connections_.emplace(key, std::move(conn));
      ++connections_count_;
    } catch (const std::exception&) {
      // Out of memory or descriptors for this one connection: it is closed, the rest go on.
    }
  }
}

void Relay::Dispatch(Connection& conn, int side, std::uint32_t events) {
  // Recorded even while connecting: the first pump reads what the client sent meanwhile.
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) conn.directions[side].src_hangup = true;
  if (conn.connecting) {
    if (side == 1 && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(conn.sockets[1].get(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        Drop(conn, /*abort=*/true);  // upstream refused: the client's connection is reset now
        return;
      }
      conn.connecting = false;
      // Bytes the client sent meanwhile were signalled (edge-triggered) but not read yet.
      Finish(conn, true, true);
    } else if (events & (EPOLLERR | EPOLLHUP)) {
      Drop(conn, /*abort=*/true);
    }
    return;
  }
  // Readable (or closed) side: pump what it sends. Writable side: resume what waits for it.
  const bool readable = events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR);
  const bool writable =
      (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) && conn.directions[1 - side].blocked;
  Finish(conn, side == 0 ? readable : writable, side == 0 ? writable : readable);
  if (!conn.closed && (events & EPOLLERR)) Drop(conn, /*abort=*/true);  // ends both sides
}

void Relay::Finish(Connection& conn, bool pump_up, bool pump_down) {
  using State = Direction::State;
  State up = pump_up ? conn.directions[0].Pump(scratch_) : State::kWaiting;
  State down = pump_down ? conn.directions[1].Pump(scratch_) : State::kWaiting;
  if (up == State::kFailed || down == State::kFailed) {
    Drop(conn, /*abort=*/true);
  } else if (conn.directions[0].shut && conn.directions[1].shut) {
    Drop(conn);
  }
}

void Relay::Drop(Connection& conn, bool abort) {
  conn.closed = true;
  if (abort) {
    // A reset or a failed write on one side reaches the other as a reset too: a clean FIN
    // would make a cut stream look complete.
    const linger reset{1, 0};
    for (Fd& side : conn.sockets) {
      if (side) setsockopt(side.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    }
  }
  auto found = connections_.find(&conn);
  if (found != connections_.end()) {
    // Counted down before the close, so a peer that saw the close also sees the count.
    --connections_count_;
    dropped_.push_back(std::move(found->second));
    connections_.erase(found);
  }
  conn.sockets[0].Reset();  // closing removes the sockets from the epoll set
  conn.sockets[1].Reset();
}

}  // namespace llm_serving::relay
