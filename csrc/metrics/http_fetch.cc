// HttpFetcher: Triton's /metrics over kept-alive HTTP/1.1, bounded in time and size, and the
// content negotiation of the proxy's own responses.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "scrape.h"

namespace llm_serving::metrics {

namespace {

constexpr char kClosedIdle[] = "closed before a response";

// Splits on `sep`, as Python's str.split(sep).
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  for (size_t start = 0;;) {
    size_t at = text.find(sep, start);
    out.push_back(text.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

bool ParseSize(std::string_view text, int base, size_t* out) {
  text = TrimBlanks(text);
  if (text.empty()) return false;
  size_t value = 0;
  for (char c : text) {
    int digit = c >= '0' && c <= '9'   ? c - '0'
                : base == 16 && c >= 'a' && c <= 'f' ? c - 'a' + 10
                : base == 16 && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                     : -1;
    if (digit < 0) return false;
    if (value > (SIZE_MAX - static_cast<size_t>(digit)) / static_cast<size_t>(base)) return false;
    value = value * static_cast<size_t>(base) + static_cast<size_t>(digit);
  }
  *out = value;
  return true;
}

}  // namespace

std::string LowerAscii(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string_view TrimBlanks(std::string_view text) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  return text;
}

HttpFetcher::HttpFetcher(std::string host, int port, std::string path, double timeout_s,
                         size_t max_bytes)
    : host_(std::move(host)),
      port_(port),
      timeout_(std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::duration<double>(timeout_s))),
      max_bytes_(max_bytes) {
  if (port < 1 || port > 65535) throw std::invalid_argument("port must be in 1..65535");
  std::string netloc = host_ + ":" + std::to_string(port);
  url_ = "http://" + netloc + path;
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", timeout_s);
  timeout_text_ = seconds;
  request_ = "GET " + path + " HTTP/1.1\r\nHost: " + netloc +
             "\r\nAccept: text/plain\r\nUser-Agent: llm-serving-metrics-proxy\r\n\r\n";
}

HttpFetcher::~HttpFetcher() { Close(); }

void HttpFetcher::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connecting_ = reusable_ = false;
}

void HttpFetcher::Fail(const std::string& reason, const std::string& message) {
  Close();
  throw FetchError(reason, url_ + ": " + message);
}

bool HttpFetcher::Connect() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port_);
  int rc = getaddrinfo(host_.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    failed_.emplace("connect", url_ + ": cannot resolve " + host_ + ": " + gai_strerror(rc));
    return false;
  }
  fd_ = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int error = errno;
  if (fd_ >= 0) {
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd_, found->ai_addr, found->ai_addrlen) == 0) {
      connecting_ = false;
    } else if (errno == EINPROGRESS) {
      connecting_ = true;
    } else {
      error = errno;
      ::close(fd_);
      fd_ = -1;
    }
  }
  freeaddrinfo(found);
  if (fd_ < 0) {
    failed_.emplace("connect", url_ + ": " + std::strerror(error));
    return false;
  }
  return true;
}

bool HttpFetcher::WriteRequest() {
  // The request is a few hundred bytes: a fresh socket buffer takes it whole.
  ssize_t n = ::send(fd_, request_.data(), request_.size(), MSG_NOSIGNAL);
  return n == static_cast<ssize_t>(request_.size());
}

void HttpFetcher::Send() {
  failed_.reset();
  buffer_.clear();
  deadline_ = std::chrono::steady_clock::now() + timeout_;
  reused_ = fd_ >= 0 && reusable_;
  if (!reused_) {
    Close();
    if (!Connect()) return;
  }
  reusable_ = false;
  if (!connecting_ && !WriteRequest()) {
    if (!reused_) {
      failed_.emplace("connect", url_ + ": " + std::strerror(errno));
      Close();
      return;
    }
    // The kept connection is gone: Receive() opens another.
    Close();
  }
}

std::string HttpFetcher::Receive() {
  if (failed_) {
    FetchError error = *failed_;
    failed_.reset();
    throw error;
  }
  bool retried = false;
  for (;;) {
    if (fd_ < 0) {
      // Only a reused connection found closed gets here: replace it once.
      if (!Connect()) {
        FetchError error = *failed_;
        failed_.reset();
        throw error;
      }
      reused_ = false;
      if (!connecting_ && !WriteRequest()) Fail("connect", std::strerror(errno));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline_ - std::chrono::steady_clock::now());
    if (left.count() <= 0) Fail("timeout", "did not answer within " + timeout_text_ + " s");
    pollfd p{fd_, static_cast<short>(connecting_ ? POLLOUT : POLLIN), 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the deadline check above ends it
    if (connecting_) {
      int error = 0;
      socklen_t length = sizeof error;
      getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) Fail("connect", std::strerror(error));
      connecting_ = false;
      if (!WriteRequest()) Fail("connect", std::strerror(errno));
      continue;
    }
    char chunk[64 << 10];
    ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      if (reused_ && buffer_.empty() && !retried) {
        retried = true;
        Close();
        continue;
      }
      Fail("connect", std::strerror(errno));
    }
    if (n == 0 && buffer_.empty() && reused_ && !retried) {
      retried = true;  // the server closed the kept connection while it was idle
      Close();
      continue;
    }
    buffer_.append(chunk, static_cast<size_t>(n));
    std::optional<std::string> body = Parse(n == 0);
    if (body) {
      if (!reusable_) Close();
      return std::move(*body);
    }
    if (n == 0) Fail("connect", buffer_.empty() ? kClosedIdle : "closed mid-response");
  }
}

std::optional<std::string> HttpFetcher::Parse(bool eof) {
  size_t end = buffer_.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (buffer_.size() > max_bytes_) {
      Fail("too_large", "sent over " + std::to_string(max_bytes_) + " bytes");
    }
    return std::nullopt;
  }
  std::vector<std::string_view> head = Split(std::string_view(buffer_).substr(0, end), '\n');
  std::string_view status_line = head[0];
  if (!status_line.empty() && status_line.back() == '\r') status_line.remove_suffix(1);
  std::vector<std::string_view> words = Split(status_line, ' ');
  size_t status = 0;
  if (words.size() < 2 || words[0].substr(0, 5) != "HTTP/") {
    Fail("connect", "not an HTTP response: '" + std::string(status_line) + "'");
  }
  if (!ParseSize(words[1], 10, &status)) {
    Fail("connect", "bad status line '" + std::string(status_line) + "'");
  }
  std::string transfer, length_text, connection;
  bool has_length = false;
  for (size_t i = 1; i < head.size(); ++i) {
    std::string_view line = head[i];
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t colon = line.find(':');
    std::string name = LowerAscii(TrimBlanks(line.substr(0, colon)));
    std::string_view value = colon == std::string_view::npos ? "" : TrimBlanks(line.substr(colon + 1));
    if (name == "transfer-encoding") transfer = LowerAscii(value);
    if (name == "connection") connection = LowerAscii(value);
    if (name == "content-length") length_text = value, has_length = true;
  }
  if (status != 200) Fail("http_status", "answered " + std::to_string(status));
  size_t start = end + 4;
  bool keep_alive = words[0] == "HTTP/1.1" && connection != "close";
  std::string body;
  if (transfer.find("chunked") != std::string::npos) {
    size_t pos = start;
    for (;;) {
      size_t eol = buffer_.find("\r\n", pos);
      if (eol == std::string::npos) return std::nullopt;
      size_t length = 0;
      std::string_view size_text = std::string_view(buffer_).substr(pos, eol - pos);
      if (!ParseSize(size_text.substr(0, size_text.find(';')), 16, &length)) {
        Fail("connect", "bad chunk size");
      }
      if (body.size() + length > max_bytes_) {
        Fail("too_large", "sent over " + std::to_string(max_bytes_) + " bytes");
      }
      if (length == 0) {
        // Trailers (rarely any) end with an empty line.
        if (buffer_.find("\r\n\r\n", eol) == std::string::npos) return std::nullopt;
        break;
      }
      if (buffer_.size() < eol + 2 + length + 2) return std::nullopt;
      body.append(buffer_, eol + 2, length);
      pos = eol + 2 + length + 2;
    }
  } else if (has_length) {
    size_t length = 0;
    if (!ParseSize(length_text, 10, &length)) Fail("connect", "bad Content-Length");
    if (length > max_bytes_) {
      Fail("too_large", "sent over " + std::to_string(max_bytes_) + " bytes");
    }
    if (buffer_.size() - start < length) return std::nullopt;
    body = buffer_.substr(start, length);
  } else {  // the body runs to the end of the connection
    keep_alive = false;
    if (buffer_.size() - start > max_bytes_) {
      Fail("too_large", "sent over " + std::to_string(max_bytes_) + " bytes");
    }
    if (!eof) return std::nullopt;
    body = buffer_.substr(start);
  }
  reusable_ = keep_alive && !eof;
  return body;
}

namespace {

// An RFC 9110 qvalue: "0" or "1", then at most three decimals, at most 1. Any other text (a
// typo, 1.5, 0.0001) counts as 0, so that a malformed weight never picks a response the
// client may refuse; what it asks for by default (identity, text) is always acceptable.
double QValue(std::string_view text) {
  if (text.empty() || (text[0] != '0' && text[0] != '1') || text.size() > 5) return 0;
  int thousandths = text[0] == '1' ? 1000 : 0;
  if (text.size() > 1 && text[1] != '.') return 0;
  int scale = 100;
  for (char c : text.substr(std::min<size_t>(2, text.size()))) {
    if (c < '0' || c > '9') return 0;
    thousandths += (c - '0') * scale;
    scale /= 10;
  }
  return thousandths > 1000 ? 0 : thousandths / 1000.0;
}

// The q of one Accept or Accept-Encoding item's parameters (names case-insensitive); 1 if none.
double Quality(const std::vector<std::string_view>& parts) {
  double q = 1.0;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::string_view param = TrimBlanks(parts[i]);
    size_t eq = param.find('=');
    if (LowerAscii(TrimBlanks(param.substr(0, eq))) != "q") continue;
    q = QValue(eq == std::string_view::npos ? "" : TrimBlanks(param.substr(eq + 1)));
  }
  return q;
}

}  // namespace

bool WantsOpenMetrics(std::string_view accept) {
  if (accept.empty()) return false;
  double om = 0, text = 0;
  for (std::string_view item : Split(accept, ',')) {
    std::vector<std::string_view> parts = Split(item, ';');
    std::string media = LowerAscii(TrimBlanks(parts[0]));
    double q = Quality(parts);
    if (media == "application/openmetrics-text") {
      om = std::max(om, q);
    } else if (media == "text/plain" || media == "text/*" || media == "*/*") {
      text = std::max(text, q);
    }
  }
  return om > 0 && om >= text;
}

bool WantsGzip(std::string_view accept_encoding) {
  for (std::string_view item : Split(accept_encoding, ',')) {
    std::vector<std::string_view> parts = Split(item, ';');
    if (LowerAscii(TrimBlanks(parts[0])) == "gzip") return Quality(parts) > 0;
  }
  return false;
}

}  // namespace llm_serving::metrics
