// One merge of the proxy's two sources (Scraper), and the HTTP/1.1 server that answers scrapes
// from it (ScrapeServer): an epoll thread for the connections, a thread for merges.
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <system_error>
#include <unordered_map>

#include "scrape.h"

namespace llm_serving::metrics {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr const char* kContentType[2] = {
    "text/plain; version=0.0.4; charset=utf-8",
    "application/openmetrics-text; version=1.0.0; charset=utf-8"};

// A thread that takes no signals sent to the process: they stay with Python's main thread.
// Faults stay unblocked: a blocked one kills the process, and a .db file cut short under the
// merge thread's mapping must reach ReadMapped's handler instead.
template <typename F>
std::thread Spawn(F body) {
  sigset_t all, previous;
  sigfillset(&all);
  for (int fault : {SIGBUS, SIGSEGV, SIGFPE, SIGILL}) sigdelset(&all, fault);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  std::thread thread;
  try {
    thread = std::thread(std::move(body));
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return thread;
}

}  // namespace

const std::string* Merged::Body(int format) const {
  auto found = bodies.find(format);
  return found == bodies.end() ? nullptr : &found->second;
}

void Merged::Write(int format) {
  BodyWriter writer(encoder, format >= 2, format % 2 == 1);
  writer.Reserve(*layout);
  for (const auto& source : sources) writer.Add(*source);
  writer.AddReserved(own);
  bodies[format] = writer.Finish();
}

namespace {

// Error counter label values per source, exposed at 0 from the start so rate() works.
const char* const kTritonReasons[] = {"connect", "timeout", "http_status", "too_large", "parse",
                                      "internal"};
const char* const kVllmReasons[] = {"read_dir", "corrupt_file", "internal"};

struct OwnFamily {
  const char* name;
  const char* type;
  const char* help;
};
const OwnFamily kOwn[] = {
    {"metrics_proxy_source_up", "gauge", "1 if the source was read in the last scrape, 0 if not."},
    {"metrics_proxy_source_scrape_duration_seconds", "gauge",
     "Time the last scrape spent reading the source."},
    {"metrics_proxy_source_errors", "counter",
     "Failed reads of a source (corrupt_file: per skipped file), by reason."},
    {"metrics_proxy_multiproc_files", "gauge", "Multiprocess .db files merged in the last scrape."},
    {"metrics_proxy_multiproc_corrupt_files", "gauge",
     "Multiprocess .db files skipped as truncated or corrupt in the last scrape."},
    {"metrics_proxy_duplicate_families", "gauge",
     "Triton families hidden because vLLM's multiprocess files carry them complete."},
};

std::string Join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const std::string& item : items) out.append(out.empty() ? "" : sep).append(item);
  return out;
}

}  // namespace

SourceHealth::SourceHealth() {
  sources_[0].name = "triton";
  sources_[1].name = "vllm";
  for (const char* r : kTritonReasons) sources_[0].errors.emplace_back(r, 0.0);
  for (const char* r : kVllmReasons) sources_[1].errors.emplace_back(r, 0.0);
  auto series = [this](const char* name, Labels labels) {
    series_.push_back(std::make_shared<const Series>(Series{name, std::move(labels)}));
  };
  for (const Source& s : sources_) series("metrics_proxy_source_up", {{"source", s.name}});
  for (const Source& s : sources_) {
    series("metrics_proxy_source_scrape_duration_seconds", {{"source", s.name}});
  }
  for (const Source& s : sources_) {
    for (const auto& e : s.errors) {
      series("metrics_proxy_source_errors_total", {{"source", s.name}, {"reason", e.first}});
    }
  }
  series("metrics_proxy_multiproc_files", {});
  series("metrics_proxy_multiproc_corrupt_files", {});
  series("metrics_proxy_duplicate_families", {});
}

void SourceHealth::Fail(Source& source, const std::string& reason, const std::string& message,
                        std::vector<std::string>* lines) {
  auto counter = std::find_if(source.errors.begin(), source.errors.end(),
                              [&](const auto& e) { return e.first == reason; });
  if (counter == source.errors.end()) {  // a reason of no counter's: counted as a bug
    counter = std::find_if(source.errors.begin(), source.errors.end(),
                           [](const auto& e) { return e.first == "internal"; });
  }
  counter->second += 1;
  if (source.up || message != source.last_error) {
    lines->push_back("metrics source " + source.name + " failed (" + reason + "): " + message);
  }
  source.up = false;
  source.last_error = message;
}

std::vector<std::string> SourceHealth::Apply(const Outcome& o) {
  std::vector<std::string> lines;
  Source& triton = sources_[0];
  Source& vllm = sources_[1];
  if (o.triton_ok) {
    triton.up = true;
    triton.last_error.clear();
    duplicates_ = o.duplicates;
  } else {
    Fail(triton, o.triton_reason, o.triton_message, &lines);
    duplicates_ = 0;
  }
  triton.seconds = o.triton_seconds;
  if (o.vllm_ok) {
    files_ = o.files;
    corrupt_ = static_cast<int>(o.corrupt.size());
    vllm.up = true;
    vllm.last_error.clear();
    vllm.errors[1].second += static_cast<double>(o.corrupt.size());  // corrupt_file
    if (o.corrupt != corrupt_seen_) {  // log changes, not every scrape
      corrupt_seen_ = o.corrupt;
      if (!o.corrupt.empty()) lines.push_back("skipping corrupt files: " + Join(o.corrupt, "; "));
    }
  } else {
    Fail(vllm, o.vllm_reason, o.vllm_message, &lines);
    files_ = corrupt_ = 0;
  }
  vllm.seconds = o.vllm_seconds;
  for (Source& s : sources_) s.reported_up.store(s.up);
  return lines;
}

std::vector<Family> SourceHealth::Families() const {
  std::vector<Family> out;
  for (const OwnFamily& f : kOwn) out.push_back(Family{f.name, f.type, f.help, {}});
  size_t next = 0;
  auto add = [&](Family& fam, double value) { fam.samples.push_back({series_[next++], value}); };
  for (const Source& s : sources_) add(out[0], s.up ? 1.0 : 0.0);
  for (const Source& s : sources_) add(out[1], s.seconds);
  for (const Source& s : sources_) {
    for (const auto& e : s.errors) add(out[2], e.second);
  }
  add(out[3], files_);
  add(out[4], corrupt_);
  add(out[5], duplicates_);
  return out;
}

std::string SourceHealth::Json() const {
  auto up = [this](int i) { return sources_[i].reported_up.load() ? "true" : "false"; };
  return std::string(R"({"status": "ok", "sources": {"triton": )") + up(0) + R"(, "vllm": )" +
         up(1) + "}}";
}

Scraper::Scraper(std::unique_ptr<HttpFetcher> fetcher, std::string directory,
                 Labels constant_labels, Warn warn, std::function<void()> prepare)
    : fetcher_(std::move(fetcher)),
      directory_(directory),
      reader_(std::move(directory)),
      encoder_(std::make_shared<Encoder>(std::move(constant_labels))),
      // Names are all that is reserved: the proxy's own families hide any source's.
      layout_(std::make_shared<const std::vector<Family>>(health_.Families())),
      warn_(std::move(warn)),
      prepare_(std::move(prepare)) {}

void Scraper::FlushWarnings() {
  if (warnings_.empty()) return;
  if (warn_) warn_(warnings_);
  warnings_.clear();
}

std::shared_ptr<Merged> Scraper::Merge(const std::vector<int>& formats) {
  auto merged = std::make_shared<Merged>();
  merged->encoder = encoder_;
  merged->layout = layout_;
  const int first = formats.empty() ? 0 : formats.front();
  BodyWriter writer(encoder_, first >= 2, first % 2 == 1);
  writer.Reserve(*layout_);
  Outcome outcome;

  // The request leaves first: Triton answers while the files are read and written.
  const Clock::time_point triton_start = Clock::now();
  fetcher_->Send();

  const Clock::time_point vllm_start = Clock::now();
  try {
    if (prepare_) prepare_();
    MultiprocResult result = reader_.Read();
    writer.Add(*result.families);
    merged->sources.push_back(result.families);
    outcome.vllm_ok = true;
    outcome.files = result.files;
    outcome.corrupt = std::move(result.corrupt);
  } catch (const DirectoryError& exc) {
    outcome.vllm_reason = "read_dir";
    outcome.vllm_message = directory_ + ": " + exc.what();
  } catch (const std::exception& exc) {  // a bug must cost the source, never the scrape
    outcome.vllm_reason = "internal";
    outcome.vllm_message = exc.what();
  }
  outcome.vllm_seconds = SecondsSince(vllm_start);

  try {
    std::string body = fetcher_->Receive();
    auto families = std::make_shared<const std::vector<Family>>(parser_.Parse(body));
    outcome.duplicates = writer.Add(*families);
    merged->sources.push_back(std::move(families));
    outcome.triton_ok = true;
  } catch (const FetchError& exc) {
    outcome.triton_reason = exc.reason;
    outcome.triton_message = exc.what();
  } catch (const ParseError& exc) {
    outcome.triton_reason = "parse";
    outcome.triton_message = exc.what();
  } catch (const std::exception& exc) {
    outcome.triton_reason = "internal";
    outcome.triton_message = exc.what();
  }
  outcome.triton_seconds = SecondsSince(triton_start);

  warnings_ = health_.Apply(outcome);
  merged->own = health_.Families();
  writer.AddReserved(merged->own);
  merged->bodies[first] = writer.Finish();
  for (int format : formats) {
    if (merged->Body(format) == nullptr) merged->Write(format);
  }
  merged->finished = Clock::now();
  return merged;
}

namespace {

// One client connection, on the epoll thread only.
struct Connection {
  int fd = -1;
  uint64_t id = 0;
  std::string in, out;
  size_t sent = 0;       // bytes of `out` already written
  bool waiting = false;  // a /metrics request waits for a merge
  int format = 0;
  bool head = false, keep_alive = true, closing = false, writable_armed = false;
  Clock::time_point active;
};

struct Request {
  std::string method, path, accept, accept_encoding;
  bool keep_alive = true;
  size_t body = 0;
  bool bad = false;
};

// The request head up to its blank line (excluded), as HTTP/1.1 reads it.
Request ParseHead(std::string_view head) {
  Request r;
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t a = line.find(' '), b = line.rfind(' ');
  if (a == std::string_view::npos || b == a) {
    r.bad = true;
    return r;
  }
  r.method = std::string(line.substr(0, a));
  std::string_view target = line.substr(a + 1, b - a - 1);
  std::string_view version = line.substr(b + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    r.bad = true;
    return r;
  }
  r.path = std::string(target.substr(0, target.find('?')));
  std::string connection;
  bool chunked = false;
  size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
  while (pos < head.size()) {
    size_t end = head.find("\r\n", pos);
    if (end == std::string_view::npos) end = head.size();
    std::string_view field = head.substr(pos, end - pos);
    pos = end + 2;
    size_t colon = field.find(':');
    if (colon == std::string_view::npos) {
      r.bad = true;
      return r;
    }
    std::string name = LowerAscii(TrimBlanks(field.substr(0, colon)));
    std::string_view value = TrimBlanks(field.substr(colon + 1));
    if (name == "accept") {
      r.accept = std::string(value);
    } else if (name == "accept-encoding") {
      r.accept_encoding = std::string(value);
    } else if (name == "connection") {
      connection = LowerAscii(value);
    } else if (name == "transfer-encoding") {
      chunked = true;
    } else if (name == "content-length") {
      size_t length = 0;
      for (char c : value) {
        if (c < '0' || c > '9' || length > (SIZE_MAX - 9) / 10) {
          r.bad = true;
          return r;
        }
        length = length * 10 + static_cast<size_t>(c - '0');
      }
      r.body = length;
    }
  }
  // A request body is only ever discarded here: a chunked one is refused rather than parsed.
  if (chunked) r.bad = true;
  r.keep_alive = version == "HTTP/1.1" ? connection.find("close") == std::string::npos
                                       : connection.find("keep-alive") != std::string::npos;
  return r;
}

constexpr uint64_t kListenTag = 0, kWakeTag = 1;

}  // namespace

struct ScrapeServer::Impl {
  ServerOptions options;
  MergeFn merge;
  HealthFn health;
  std::function<void()> after;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1;
  std::thread io, merger;

  // Shared with the merge thread, under `mutex`.
  std::mutex mutex;
  std::condition_variable cv;
  int wanted = 0;       // formats (bit per format) scrapes asked for since the merge began
  bool start = false;   // a merge is asked for
  bool merging = false;
  bool quit = false;
  bool done = false;    // a merge finished: `latest` is new
  std::shared_ptr<Merged> latest;
  bool stop_requested = false;
  Clock::time_point stop_deadline;

  // The epoll thread's own.
  std::unordered_map<int, std::unique_ptr<Connection>> connections;
  std::deque<std::pair<int, uint64_t>> pending;  // (fd, id) of connections waiting
  std::shared_ptr<Merged> served;
  uint64_t next_id = 1;
  bool stopping = false;

  void Wake() {
    uint64_t one = 1;
    while (::write(wake_fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
  }

  void Arm(Connection& c, bool writable) {
    if (c.writable_armed == writable) return;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | (writable ? static_cast<uint32_t>(EPOLLOUT) : 0u);
    ev.data.u64 = static_cast<uint64_t>(c.fd) + 2;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
    c.writable_armed = writable;
  }

  void Close(int fd) {
    auto found = connections.find(fd);
    if (found == connections.end()) return;
    ::close(fd);  // also leaves the epoll set
    connections.erase(found);
  }

  // Writes what it can of `out`; false once the connection is closed.
  bool Flush(Connection& c) {
    while (c.sent < c.out.size()) {
      ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        Arm(c, true);
        return true;
      }
      Close(c.fd);
      return false;
    }
    c.out.clear();
    c.sent = 0;
    Arm(c, false);
    if (c.closing) {
      Close(c.fd);
      return false;
    }
    return true;
  }

  void Respond(Connection& c, int status, const char* reason, const char* type,
               const std::string& body, bool head, const char* extra = "") {
    bool keep = c.keep_alive && !stopping && !c.closing;
    std::string& out = c.out;
    out.append("HTTP/1.1 ").append(std::to_string(status)).append(" ").append(reason);
    out.append("\r\nContent-Type: ").append(type);
    out.append("\r\nContent-Length: ").append(std::to_string(body.size()));
    out.append("\r\n").append(extra);
    if (!keep) out.append("Connection: close\r\n");
    out.append("\r\n");
    if (!head) out.append(body);
    c.closing = !keep;
    c.active = Clock::now();
  }

  void RespondMetrics(Connection& c, const std::string& body) {
    const char* extra = c.format % 2 == 1
                            ? "Vary: Accept, Accept-Encoding\r\nContent-Encoding: gzip\r\n"
                            : "Vary: Accept, Accept-Encoding\r\n";
    Respond(c, 200, "OK", kContentType[c.format >= 2 ? 1 : 0], body, c.head, extra);
    c.waiting = false;
  }

  void AskMerge(int format) {
    std::lock_guard<std::mutex> lock(mutex);
    wanted |= 1 << format;
    if (!merging) {
      merging = start = true;
      cv.notify_one();
    }
  }

  void Handle(Connection& c, const Request& r) {
    c.keep_alive = r.keep_alive;
    bool get = r.method == "GET", head = r.method == "HEAD";
    if (r.path == "/metrics") {
      if (!get && !head) {
        Respond(c, 405, "Method Not Allowed", "text/plain", "method not allowed: use GET\n",
                false, "Allow: GET, HEAD\r\n");
        return;
      }
      c.head = head;
      c.format = (WantsOpenMetrics(r.accept) ? 2 : 0) + (WantsGzip(r.accept_encoding) ? 1 : 0);
      if (served != nullptr && SecondsSince(served->finished) < options.reuse_s) {
        if (const std::string* body = served->Body(c.format)) {
          RespondMetrics(c, *body);
          return;
        }
      }
      c.waiting = true;
      pending.emplace_back(c.fd, c.id);
      AskMerge(c.format);
    } else if (r.path == "/healthz") {
      if (!get && !head) {
        Respond(c, 405, "Method Not Allowed", "text/plain", "method not allowed: use GET\n",
                false, "Allow: GET, HEAD\r\n");
        return;
      }
      std::string body;
      try {
        body = health();
      } catch (const std::exception& exc) {
        Respond(c, 500, "Internal Server Error", "text/plain", std::string(exc.what()) + "\n",
                head);
        return;
      }
      Respond(c, 200, "OK", "application/json", body, head);
    } else {
      Respond(c, 404, "Not Found", "text/plain", "not found: use /metrics or /healthz\n",
              head);
    }
  }

  // Parses and answers one request of `in`; false if no whole request is there yet.
  bool ServeOne(Connection& c) {
    size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos || end > options.max_request_bytes) {
      if (end == std::string::npos && c.in.size() <= options.max_request_bytes) return false;
      c.keep_alive = false;
      Respond(c, 431, "Request Header Fields Too Large", "text/plain",
              "request head over " + std::to_string(options.max_request_bytes) + " bytes\n",
              false);
      return true;
    }
    Request r = ParseHead(std::string_view(c.in).substr(0, end));
    if (r.bad || r.body > options.max_request_bytes) {
      c.keep_alive = false;
      Respond(c, 400, "Bad Request", "text/plain", "bad request\n", false);
      return true;
    }
    if (c.in.size() < end + 4 + r.body) return false;  // the body (discarded) is still coming
    c.in.erase(0, end + 4 + r.body);
    Handle(c, r);
    return true;
  }

  // Answers the requests in `in` in order, the next one only once the answer before it is
  // written: pipelined scrapes would otherwise queue a body each (a 30 KB burst of GETs
  // queued 150 MB). False once closed.
  bool Serve(Connection& c) {
    for (;;) {
      if (!c.waiting && !c.closing && c.out.empty() && !ServeOne(c)) return Flush(c);
      if (!Flush(c)) return false;
      if (!c.out.empty() || c.waiting || c.closing) return true;
    }
  }

  // The most input a connection holds: one whole request (head, blank line, body).
  size_t InputLimit() const { return 2 * options.max_request_bytes + 4; }

  void Read(Connection& c) {
    char chunk[16 << 10];
    for (;;) {
      ssize_t n = ::recv(c.fd, chunk, sizeof chunk, 0);
      if (n > 0) {
        c.in.append(chunk, static_cast<size_t>(n));
        c.active = Clock::now();
        if (c.in.size() > InputLimit()) break;  // Serve() takes it or refuses it
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // The client closed (or reset): a scrape it waits for is answered to nobody.
      Close(c.fd);
      return;
    }
    if (!Serve(c)) return;
    // Serve() takes no input while a scrape waits for its merge or the connection is closing,
    // and epoll keeps reporting what the client sends meanwhile: past the limit it is a
    // flood, which would otherwise grow without bound.
    if (c.in.size() > InputLimit()) Close(c.fd);
  }

  void Accept() {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;  // EAGAIN, or out of descriptors: the rest wait in the backlog
      }
      if (stopping || connections.size() >= options.max_connections) {
        ::close(fd);
        continue;
      }
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      c->id = next_id++;
      c->active = Clock::now();
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = static_cast<uint64_t>(fd) + 2;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        ::close(fd);
        continue;
      }
      connections.emplace(fd, std::move(c));
    }
  }

  void MergeDone() {
    std::shared_ptr<Merged> merged;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!done) return;
      done = false;
      merged = latest;
    }
    if (merged != nullptr) served = merged;
    // Answering may parse a connection's next request, which can queue it again: take the
    // list first.
    std::deque<std::pair<int, uint64_t>> waiting;
    waiting.swap(pending);
    std::vector<int> again;
    for (auto [fd, id] : waiting) {
      auto found = connections.find(fd);
      if (found == connections.end() || found->second->id != id) continue;
      Connection& c = *found->second;
      if (merged == nullptr) {
        c.waiting = false;
        Respond(c, 500, "Internal Server Error", "text/plain", "the merge failed\n", c.head);
      } else if (const std::string* body = merged->Body(c.format)) {
        RespondMetrics(c, *body);
      } else {
        pending.emplace_back(fd, id);  // a format asked for after the merge was written
        again.push_back(c.format);
        continue;
      }
      Serve(c);
    }
    for (int format : again) AskMerge(format);
  }

  void CloseIdle() {
    std::vector<int> idle;
    for (auto& [fd, c] : connections) {
      bool busy = c->waiting || !c->out.empty();
      if (!busy && (stopping || SecondsSince(c->active) > options.idle_timeout_s)) {
        idle.push_back(fd);
      }
    }
    for (int fd : idle) Close(fd);
  }

  void Loop() {
    epoll_event events[64];
    for (;;) {
      int n = epoll_wait(epoll_fd, events, 64, stopping ? 20 : 1000);
      if (n < 0 && errno != EINTR) break;
      for (int i = 0; i < n; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kListenTag) {
          Accept();
        } else if (tag == kWakeTag) {
          uint64_t count;
          while (::read(wake_fd, &count, sizeof count) < 0 && errno == EINTR) {
          }
          MergeDone();
        } else {
          auto found = connections.find(static_cast<int>(tag - 2));
          if (found == connections.end()) continue;
          Connection& c = *found->second;
          if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
            Read(c);
          } else if (events[i].events & EPOLLOUT) {
            // Written out: the requests it held back are next.
            if (Flush(c) && c.out.empty()) Serve(c);
          }
        }
      }
      Clock::time_point deadline;
      bool stop;
      {
        std::lock_guard<std::mutex> lock(mutex);
        stop = stop_requested;
        deadline = stop_deadline;
      }
      if (stop && !stopping) {
        stopping = true;
        epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
        ::close(listen_fd);
        listen_fd = -1;
      }
      CloseIdle();
      if (stopping && (connections.empty() || Clock::now() >= deadline)) break;
    }
    for (auto& [fd, c] : connections) ::close(fd);
    connections.clear();
  }

  void MergeLoop() {
    for (;;) {
      int formats;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [this] { return start || quit; });
        if (!start) return;
        start = false;
        formats = wanted;
        wanted = 0;
      }
      std::vector<int> list;
      for (int f = 0; f < 4; ++f) {
        if (formats & (1 << f)) list.push_back(f);
      }
      std::shared_ptr<Merged> merged;
      try {
        merged = merge(list);
        // Formats asked for while this merge ran are written from it too.
        int late;
        {
          std::lock_guard<std::mutex> lock(mutex);
          late = std::exchange(wanted, 0);
        }
        for (int f = 0; f < 4; ++f) {
          if ((late & (1 << f)) && merged->Body(f) == nullptr) merged->Write(f);
        }
      } catch (const std::exception&) {
        merged = nullptr;  // the waiting scrapes get a 500; the next merge starts afresh
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        latest = std::move(merged);
        merging = false;
        done = true;
      }
      Wake();
      if (after) after();
    }
  }
};

ScrapeServer::ScrapeServer(ServerOptions options, MergeFn merge, HealthFn health,
                           std::function<void()> after)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->merge = std::move(merge);
  impl_->health = std::move(health);
  impl_->after = std::move(after);
}

ScrapeServer::~ScrapeServer() {
  try {
    Stop(0);
  } catch (...) {
    // The process is going away; nothing sensible to do.
  }
  for (int fd : {impl_->listen_fd, impl_->epoll_fd, impl_->wake_fd}) {
    if (fd >= 0) ::close(fd);
  }
}

int ScrapeServer::Start() {
  Impl& s = *impl_;
  if (s.io.joinable()) throw std::logic_error("the server is already started");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  std::string service = std::to_string(s.options.port);
  int rc = getaddrinfo(s.options.host.empty() ? nullptr : s.options.host.c_str(),
                       service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw std::invalid_argument("cannot resolve host '" + s.options.host +
                                "': " + gai_strerror(rc));
  }
  s.listen_fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (s.listen_fd >= 0) setsockopt(s.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool bound = s.listen_fd >= 0 && ::bind(s.listen_fd, found->ai_addr, found->ai_addrlen) == 0 &&
               ::listen(s.listen_fd, s.options.backlog) == 0;
  const int error = errno;
  freeaddrinfo(found);
  if (!bound) {
    throw std::system_error(error, std::generic_category(),
                            "cannot listen on " + s.options.host + ":" + service);
  }
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  getsockname(s.listen_fd, reinterpret_cast<sockaddr*>(&address), &length);
  int port = ntohs(address.ss_family == AF_INET6
                       ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                       : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
  s.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.epoll_fd < 0 || s.wake_fd < 0) {
    throw std::system_error(errno, std::generic_category(), "epoll/eventfd");
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.listen_fd, &ev);
  ev.data.u64 = kWakeTag;
  epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, s.wake_fd, &ev);
  s.merger = Spawn([&s] { s.MergeLoop(); });
  s.io = Spawn([&s] { s.Loop(); });
  return port;
}

void ScrapeServer::Stop(double grace_s) {
  Impl& s = *impl_;
  if (!s.io.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stop_requested = true;
    s.stop_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(grace_s));
  }
  s.Wake();
  s.io.join();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.quit = true;
    s.start = false;
  }
  s.cv.notify_all();
  s.merger.join();
}

}  // namespace llm_serving::metrics
