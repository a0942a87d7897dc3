// The metrics proxy's scrape path with no Python on it: an HTTP/1.1 server for /metrics and
// /healthz, Triton's endpoint fetched over kept-alive HTTP, the .db files read while Triton
// answers, and the body written. Python keeps the sources' health and the proxy's own families,
// handed over once per merge (runtime/metrics_proxy/app.py).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "metrics.h"

namespace llm_serving::metrics {

// Triton could not be read; `reason` is the error counter's label value.
class FetchError : public std::runtime_error {
 public:
  FetchError(std::string reason, const std::string& message)
      : std::runtime_error(message), reason(std::move(reason)) {}
  std::string reason;
};

// GETs one URL over a kept-alive HTTP/1.1 connection, within a deadline and a size bound. The
// request leaves in Send(), so the server answers while the caller does other work; Receive()
// waits for the answer. A connection the server closed while idle is replaced once.
class HttpFetcher {
 public:
  HttpFetcher(std::string host, int port, std::string path, double timeout_s, size_t max_bytes);
  ~HttpFetcher();
  HttpFetcher(const HttpFetcher&) = delete;
  HttpFetcher& operator=(const HttpFetcher&) = delete;

  void Send();           // never throws: a failure is raised by Receive()
  std::string Receive(); // the body; throws FetchError
  std::string Fetch() {
    Send();
    return Receive();
  }

 private:
  bool Connect();
  bool WriteRequest();
  void Close();
  [[noreturn]] void Fail(const std::string& reason, const std::string& message);
  // The body once `buffer_` holds a whole response; nullopt while more is needed.
  std::optional<std::string> Parse(bool eof);

  std::string host_, url_, request_, timeout_text_;
  int port_;
  std::chrono::nanoseconds timeout_;
  size_t max_bytes_;
  int fd_ = -1;
  bool connecting_ = false;  // connect() in progress: the request is written once it completes
  bool reused_ = false;      // the request went out on a connection kept from an earlier fetch
  bool reusable_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::string buffer_;
  std::optional<FetchError> failed_;  // from Send(), raised by Receive()
};

// What the HTTP code shares: ASCII lowercase, and blanks (space, tab, CR) trimmed both ends.
std::string LowerAscii(std::string_view text);
std::string_view TrimBlanks(std::string_view text);

// Prometheus's content negotiation, as runtime/metrics_proxy/exposition.py: OpenMetrics when its
// q is positive and at least text's; gzip when Accept-Encoding names it with q > 0.
bool WantsOpenMetrics(std::string_view accept);
bool WantsGzip(std::string_view accept_encoding);

// One merge: its sources' families, the proxy's own, and the bodies written from them (by
// format: openmetrics * 2 + gzip).
struct Merged {
  std::shared_ptr<Encoder> encoder;
  std::shared_ptr<const std::vector<Family>> layout;  // the own families' names, reserved
  std::vector<Family> own;
  std::vector<std::shared_ptr<const std::vector<Family>>> sources;
  std::map<int, std::string> bodies;
  std::chrono::steady_clock::time_point finished;

  const std::string* Body(int format) const;
  void Write(int format);  // on the merge thread only: the encoder is not shared
};

// What a merge found about its two sources: what SourceHealth is updated from.
struct Outcome {
  bool triton_ok = false;
  std::string triton_reason, triton_message;
  double triton_seconds = 0;
  bool vllm_ok = false;
  std::string vllm_reason, vllm_message;
  double vllm_seconds = 0;
  int files = 0;
  std::vector<std::string> corrupt;
  int duplicates = 0;  // Triton families hidden by vLLM's complete copies
};

// Each source's health as the proxy reports it: its own families (the same series every
// merge, new values) and /healthz. Apply() and Families() run on the merge thread; Json() on
// any thread.
class SourceHealth {
 public:
  SourceHealth();
  // One merge's outcome applied; the lines worth a warning (a failure that is new or changed,
  // a change in the corrupt files skipped).
  std::vector<std::string> Apply(const Outcome& outcome);
  std::vector<Family> Families() const;
  std::string Json() const;

 private:
  struct Source {
    std::string name;
    std::vector<std::pair<std::string, double>> errors;  // by reason, in exposition order
    bool up = false;
    double seconds = 0;
    std::string last_error;
    std::atomic<bool> reported_up{false};
  };
  void Fail(Source& source, const std::string& reason, const std::string& message,
            std::vector<std::string>* lines);

  Source sources_[2];  // triton, vllm
  int files_ = 0, corrupt_ = 0, duplicates_ = 0;
  std::vector<std::string> corrupt_seen_;
  std::vector<SeriesPtr> series_;  // made once, in Families()' sample order
};

// Reads both sources and writes the bodies asked for. Used by one merge thread.
class Scraper {
 public:
  // `warn` gets each line worth a warning (with the GIL, off the scrape's critical path: after
  // the body is written); `prepare` (may be empty) runs before each read of the directory.
  using Warn = std::function<void(const std::vector<std::string>&)>;
  Scraper(std::unique_ptr<HttpFetcher> fetcher, std::string directory, Labels constant_labels,
          Warn warn, std::function<void()> prepare);

  const SourceHealth& Health() const { return health_; }
  // Warnings of the last merge, for after its scrapes are answered.
  void FlushWarnings();

  // One merge, its first body written as it goes (the others from its families).
  std::shared_ptr<Merged> Merge(const std::vector<int>& formats);

 private:
  std::unique_ptr<HttpFetcher> fetcher_;
  std::string directory_;
  MultiprocReader reader_;
  TextParser parser_;
  std::shared_ptr<Encoder> encoder_;
  SourceHealth health_;  // before layout_, which is made from it
  std::shared_ptr<const std::vector<Family>> layout_;
  Warn warn_;
  std::vector<std::string> warnings_;
  std::function<void()> prepare_;
};

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 9400;
  int backlog = 128;
  double reuse_s = 0.1;          // a merge this recent answers new scrapes too
  double idle_timeout_s = 60;    // a connection with no request in progress this long closes
  size_t max_connections = 512;  // past it, new connections are closed at once
  size_t max_request_bytes = 16 << 10;
};

// The HTTP side: one epoll thread for every connection, one merge thread. Scrapes that arrive
// while a merge runs are all answered by it. `health` (JSON) runs on the epoll thread.
class ScrapeServer {
 public:
  using MergeFn = std::function<std::shared_ptr<Merged>(const std::vector<int>& formats)>;
  using HealthFn = std::function<std::string()>;
  // `after` runs on the merge thread once a merge's scrapes can be answered.
  ScrapeServer(ServerOptions options, MergeFn merge, HealthFn health, std::function<void()> after);
  ~ScrapeServer();
  ScrapeServer(const ScrapeServer&) = delete;
  ScrapeServer& operator=(const ScrapeServer&) = delete;

  int Start();  // binds and starts the threads; the bound port
  // Closes the listener, answers the scrapes in flight for up to `grace_s`, then ends.
  void Stop(double grace_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace llm_serving::metrics
