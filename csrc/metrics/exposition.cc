// Triton's text exposition parsed, and the merged body written (text or OpenMetrics, gzip).
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "metrics.h"

namespace llm_serving::metrics {

namespace {

constexpr const char* kSuffixes[] = {"_total", "_bucket", "_sum", "_count", "_created"};

// Only spaces and tabs separate tokens, as in Prometheus's own parsers: any other character,
// Unicode whitespace too, belongs to a token (and no name, value or timestamp holds one).
bool IsBlank(char c) { return c == ' ' || c == '\t'; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

size_t SkipBlanks(std::string_view s, size_t pos) {
  while (pos < s.size() && IsBlank(s[pos])) ++pos;
  return pos;
}

size_t SkipToken(std::string_view s, size_t pos) {
  while (pos < s.size() && !IsBlank(s[pos])) ++pos;
  return pos;
}

// The first blank-separated token of `s` (empty if none); `s` is left after it.
std::string_view NextToken(std::string_view* s) {
  size_t start = SkipBlanks(*s, 0);
  size_t stop = SkipToken(*s, start);
  std::string_view token = s->substr(start, stop - start);
  s->remove_prefix(stop);
  return token;
}

// `s` without leading blanks, nor trailing blanks and "\r" (which ends a CRLF line).
std::string_view TrimBlanks(std::string_view s) {
  s.remove_prefix(SkipBlanks(s, 0));
  while (!s.empty() && (IsBlank(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string Unescape(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    if (value[i] == '\\' && i + 1 < value.size()) {
      char next = value[++i];
      if (next == 'n') {
        out += '\n';
      } else if (next == '\\' || next == '"') {
        out += next;
      } else {
        out += '\\';
        out += next;
      }
    } else {
      out += value[i];
    }
  }
  return out;
}

[[noreturn]] void Fail(size_t lineno, const char* what, std::string_view line) {
  throw ParseError("line " + std::to_string(lineno) + ": " + what + " in " + std::string(line));
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// [a-zA-Z_:][a-zA-Z0-9_:]*: Prometheus refuses a whole scrape over one name outside it.
bool ValidMetricName(std::string_view name) {
  if (name.empty() || !(IsNameStart(name[0]) || name[0] == ':')) return false;
  for (char c : name) {
    if (!IsNameChar(c) && c != ':') return false;
  }
  return true;
}

// The types Prometheus's text parser takes; any other word fails its whole scrape.
bool KnownType(std::string_view type) {
  return type == "counter" || type == "gauge" || type == "histogram" || type == "summary" ||
         type == "untyped";
}

// An optionally signed integer in int64's range: Go's strconv.ParseInt, as prometheus/common's
// TextParser reads a timestamp.
bool ValidTimestamp(std::string_view text) {
  size_t sign = !text.empty() && (text[0] == '+' || text[0] == '-') ? 1 : 0;
  if (text.size() == sign) return false;
  for (char c : text.substr(sign)) {
    if (c < '0' || c > '9') return false;
  }
  if (text[0] == '+') text.remove_prefix(1);  // from_chars takes a '-', not a '+'
  int64_t value = 0;
  return std::from_chars(text.data(), text.data() + text.size(), value).ec == std::errc();
}

// name{labels}: returns the position after the closing brace.
size_t ParseSeries(std::string_view line, size_t brace, size_t lineno, Series* sample) {
  sample->name = std::string(line.substr(0, brace));
  if (!ValidMetricName(sample->name)) Fail(lineno, "bad metric name", line);
  size_t pos = brace + 1;
  if (pos < line.size() && line[pos] == '}') return pos + 1;
  while (true) {
    // [ \t]*NAME[ \t]*=[ \t]*"VALUE"[ \t]*(,|})
    auto skip = [&] { pos = SkipBlanks(line, pos); };
    skip();
    size_t start = pos;
    if (pos >= line.size() || !IsNameStart(line[pos])) Fail(lineno, "bad labels", line);
    while (pos < line.size() && IsNameChar(line[pos])) ++pos;
    std::string_view label = line.substr(start, pos - start);
    // Names starting with __ are Prometheus's own; a repeated one fails the whole scrape.
    if (label.substr(0, 2) == "__") Fail(lineno, "reserved label name", line);
    for (const auto& kv : sample->labels) {
      if (kv.first == label) Fail(lineno, "repeated label name", line);
    }
    skip();
    if (pos >= line.size() || line[pos] != '=') Fail(lineno, "bad labels", line);
    ++pos;
    skip();
    if (pos >= line.size() || line[pos] != '"') Fail(lineno, "bad labels", line);
    start = ++pos;
    while (pos < line.size() && line[pos] != '"') {
      if (line[pos] == '\\') {
        if (pos + 1 >= line.size()) Fail(lineno, "bad labels", line);
        ++pos;
      }
      ++pos;
    }
    if (pos >= line.size()) Fail(lineno, "bad labels", line);
    std::string_view value = line.substr(start, pos - start);
    ++pos;
    skip();
    if (pos >= line.size() || (line[pos] != ',' && line[pos] != '}')) {
      Fail(lineno, "bad labels", line);
    }
    sample->labels.emplace_back(std::string(label), Unescape(value));
    if (line[pos++] == '}') return pos;
  }
}

constexpr size_t kSeriesCacheLimit = 50'000;

// The cached series of a line's text before its value, made by `make` on a miss.
template <typename Make>
const SeriesPtr& CachedSeries(FlatMap<std::string, SeriesPtr, StringHash>* cache,
                              std::string_view text, Make make) {
  if (SeriesPtr* found = cache->Find(text)) return *found;
  SeriesPtr series = make();
  if (cache->size() >= kSeriesCacheLimit) cache->Clear();
  return *cache->Emplace(text, std::move(series)).first;
}

Sample ParseSample(std::string_view line, size_t lineno,
                   FlatMap<std::string, SeriesPtr, StringHash>* cache) {
  Sample sample;
  size_t brace = line.find('{');
  size_t space = line.find(' ');
  std::string_view rest;
  if (brace != std::string_view::npos && (space == std::string_view::npos || brace < space)) {
    // The value and timestamp never hold a brace, so the last one closes the labels.
    size_t last = line.rfind('}');
    size_t end = last == std::string_view::npos ? 0 : last + 1;
    sample.series = CachedSeries(cache, line.substr(0, end), [&] {
      auto series = std::make_shared<Series>();
      if (ParseSeries(line, brace, lineno, series.get()) != end) Fail(lineno, "bad labels", line);
      return series;
    });
    rest = line.substr(end);
  } else {
    // Cached by the bare name, which no labelled series' text (it holds a brace) can equal.
    std::string_view name = line.substr(0, SkipToken(line, 0));
    sample.series = CachedSeries(cache, name, [&] {
      if (!ValidMetricName(name)) Fail(lineno, "bad metric name", line);
      auto series = std::make_shared<Series>();
      series->name = std::string(name);
      return series;
    });
    rest = line.substr(name.size());
  }
  rest = TrimBlanks(rest);
  std::string_view value = NextToken(&rest);
  if (value.empty()) Fail(lineno, "no value", line);
  if (!ParseFloat(value, &sample.value)) Fail(lineno, "bad value", line);
  std::string_view timestamp = NextToken(&rest);
  if (!timestamp.empty() && !ValidTimestamp(timestamp)) Fail(lineno, "bad timestamp", line);
  if (!NextToken(&rest).empty()) Fail(lineno, "text after the timestamp", line);
  return sample;
}

}  // namespace

std::vector<Family> TextParser::Parse(std::string_view text) {
  if (!ValidUtf8(text)) throw ParseError("invalid UTF-8");
  std::vector<Family> families;
  std::unordered_map<std::string, size_t> by_base;
  std::unordered_map<std::string, std::pair<std::string, std::string>> declared;
  Family* current = nullptr;
  size_t lineno = 0, start = 0;
  while (start <= text.size()) {
    // Only "\n" ends a line: label values and help may hold "\r" raw.
    size_t nl = text.find('\n', start);
    size_t stop = nl == std::string_view::npos ? text.size() : nl;
    std::string_view line = text.substr(start, stop - start);
    start = stop + 1;
    ++lineno;
    while (!line.empty() && (line[0] == ' ' || line[0] == '\t')) line.remove_prefix(1);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (line[0] == '#') {
      // "#", keyword and metric name, each after a run of blanks; the rest follows one blank.
      size_t key_at = SkipBlanks(line, 1), key_end = SkipToken(line, key_at);
      size_t name_at = SkipBlanks(line, key_end), name_end = SkipToken(line, name_at);
      std::string_view keyword = line.substr(key_at, key_end - key_at);
      std::string_view rest =
          name_end < line.size() ? line.substr(name_end + 1) : std::string_view();
      // A comment naming no valid metric declares nothing: no sample can take its name.
      if (key_at > 1 && name_at > key_end && (keyword == "HELP" || keyword == "TYPE") &&
          ValidMetricName(line.substr(name_at, name_end - name_at))) {
        std::string name(line.substr(name_at, name_end - name_at));
        auto found = declared.find(name);
        std::pair<std::string, std::string> entry =
            found == declared.end() ? std::make_pair(std::string("untyped"), std::string())
                                    : found->second;
        if (keyword == "HELP") {
          entry.second = Unescape(rest);
        } else {
          std::string_view type = TrimBlanks(rest);
          if (!type.empty() && !KnownType(type)) Fail(lineno, "unknown type", line);
          entry.first = type.empty() ? "untyped" : std::string(type);
        }
        declared[name] = std::move(entry);
      }
      continue;
    }
    Sample sample = ParseSample(line, lineno, &series_);
    const std::string& sample_name = sample.series->name;
    bool same = false;
    if (current != nullptr) {
      if (sample_name == current->name) {
        same = true;
      } else if (sample_name.compare(0, current->name.size(), current->name) == 0) {
        std::string_view tail = std::string_view(sample_name).substr(current->name.size());
        for (const char* suffix : kSuffixes) same = same || tail == suffix;
      }
    }
    if (!same) {
      std::vector<std::string> candidates = {sample_name};
      for (const char* suffix : kSuffixes) {
        if (EndsWith(sample_name, suffix)) {
          candidates.push_back(sample_name.substr(0, sample_name.size() - strlen(suffix)));
        }
      }
      std::string typ = "untyped", help, base = sample_name;
      for (const auto& name : candidates) {
        auto found = declared.find(name);
        if (found == declared.end()) continue;
        typ = found->second.first;
        help = found->second.second;
        // `_total` alone keeps its name: an empty family name is no valid exposition.
        base = typ == "counter" && name.size() > 6 && EndsWith(name, "_total")
                   ? name.substr(0, name.size() - 6)
                   : name;
        break;
      }
      auto [it, inserted] = by_base.emplace(base, families.size());
      if (inserted) families.push_back(Family{base, typ, help, {}});
      current = &families[it->second];
    }
    current->samples.push_back(std::move(sample));
  }
  return families;
}

namespace {

// Appends `text` with backslash and newline escaped; double quotes too where asked (label
// values, OpenMetrics help).
void AppendEscaped(std::string_view text, bool quotes, std::string* out) {
  while (!text.empty()) {
    size_t plain = text.find_first_of(quotes ? "\\\n\"" : "\\\n");
    out->append(text.substr(0, plain));
    if (plain == std::string_view::npos) return;
    char c = text[plain];
    out->append(c == '\\' ? "\\\\" : c == '\n' ? "\\n" : "\\\"");
    text.remove_prefix(plain + 1);
  }
}

constexpr size_t kFlushAt = 64 << 10;

}  // namespace

constexpr size_t kPrefixCacheLimit = 100'000;

Encoder::Encoder(Labels constant_labels) : constant_(std::move(constant_labels)) {
  for (const auto& kv : constant_) constant_names_.insert(kv.first);
}

const Encoder::Prefix& Encoder::PrefixFor(const SeriesPtr& series) {
  if (const Prefix* found = prefixes_.Find(series.get())) return *found;
  std::string text = series->name;
  bool any = false;
  auto label = [&](const std::string& k, const std::string& v) {
    text.append(any ? "," : "{").append(k).append("=\"");
    AppendEscaped(v, true, &text);
    text += '"';
    any = true;
  };
  // The pod's identity wins over a source's label of the same name.
  for (const auto& kv : series->labels) {
    if (constant_names_.count(kv.first) == 0) label(kv.first, kv.second);
  }
  for (const auto& kv : constant_) label(kv.first, kv.second);
  text.append(any ? "} " : " ");
  auto [t, fresh] = texts_.emplace(std::move(text), static_cast<uint32_t>(texts_.size()));
  (void)fresh;
  return *prefixes_.Emplace(series.get(), Prefix{series, &t->first, t->second}).first;
}

BodyWriter::BodyWriter(std::shared_ptr<Encoder> encoder, bool openmetrics, bool gzip)
    : encoder_(std::move(encoder)), openmetrics_(openmetrics), gzip_(gzip) {
  if (encoder_->writers_ == 0 && encoder_->prefixes_.size() > kPrefixCacheLimit) {
    encoder_->prefixes_.Clear();
    encoder_->texts_.clear();
  }
  text_.reserve(kFlushAt + (kFlushAt >> 2));
  if (gzip_) {
    deflater_ = std::move(encoder_->idle_deflater_);
    if (deflater_ == nullptr) deflater_ = std::make_unique<Encoder::Deflater>();
    deflater_->Start();
  }
  ++encoder_->writers_;
}

BodyWriter::~BodyWriter() {
  --encoder_->writers_;
  if (deflater_ != nullptr) encoder_->idle_deflater_ = std::move(deflater_);
}

void Encoder::Deflater::Start() {
  // One gzip member at igzip's level 1: as small as zlib's level 1 makes these bodies, at a
  // third of its time (zlib's fastest level was most of a scrape's compression cost).
  isal_deflate_init(&zs);
  zs.gzip_flag = IGZIP_GZIP;
  zs.level = 1;
  zs.level_buf = level_buf.data();
  zs.level_buf_size = static_cast<uint32_t>(level_buf.size());
}

void BodyWriter::Reserve(const std::vector<Family>& families) {
  size_t first = reserved_.size();
  reserved_.insert(reserved_.end(), families.begin(), families.end());
  for (size_t i = first; i < reserved_.size(); ++i) {
    const Family& fam = reserved_[i];
    families_.Emplace(std::string_view(fam.name), true);
    for (const auto& s : fam.samples) owner_.Emplace(std::string_view(s.series->name), fam.name);
  }
}

int BodyWriter::Add(const std::vector<Family>& families) {
  std::vector<const Sample*> kept;
  int hidden = 0;
  for (const auto& fam : families) {
    if (families_.Find(std::string_view(fam.name)) != nullptr) {  // an earlier source has it
      ++hidden;
      continue;
    }
    kept.clear();
    const std::string* last = nullptr;
    bool last_kept = false;
    for (const auto& s : fam.samples) {
      const std::string& name = s.series->name;
      if (last == nullptr || *last != name) {  // a family's samples mostly share names
        auto [owner, added] = owner_.Emplace(std::string_view(name), fam.name);
        last_kept = added || *owner == fam.name;
        last = &name;
      }
      if (last_kept) kept.push_back(&s);
    }
    // A family whose every sample another one owns is left out, and does not take its name.
    if (!kept.empty() || fam.samples.empty()) {
      families_.Emplace(std::string_view(fam.name), true);
      Write(fam, kept);
    }
  }
  // Compress the source now: the vLLM part is added while Triton is still answering.
  if (gzip_ && !text_.empty()) Flush(false);
  return hidden;
}

void BodyWriter::AddReserved(const std::vector<Family>& families) {
  std::vector<const Sample*> kept;
  for (const auto& fam : families) {
    kept.clear();
    for (const auto& s : fam.samples) kept.push_back(&s);
    Write(fam, kept);
  }
}

void BodyWriter::Write(const Family& fam, const std::vector<const Sample*>& kept) {
  std::string_view name = fam.name, typ = fam.type;
  bool has_total = false;
  if (typ == "counter") {
    has_total = true;
    for (const Sample* s : kept) {
      const std::string& n = s->series->name;
      has_total = has_total && n.size() > fam.name.size() &&
                  n.compare(0, fam.name.size(), fam.name) == 0 &&
                  (n.compare(fam.name.size(), std::string::npos, "_total") == 0 ||
                   n.compare(fam.name.size(), std::string::npos, "_created") == 0);
    }
  }
  if (openmetrics_) {
    if (typ == "untyped") {
      typ = "unknown";
    } else if (typ == "counter" && !has_total) {
      // OpenMetrics counters must end in _total; Triton's do not. Declaring them `unknown`
      // keeps the series names the queries use and the output valid.
      typ = "unknown";
      if (!kept.empty()) name = kept.front()->series->name;
    }
  } else if (typ == "unknown") {
    typ = "untyped";
  }
  std::string_view total = !openmetrics_ && has_total ? "_total" : "";
  text_.append("# HELP ").append(name).append(total).append(" ");
  AppendEscaped(fam.help, openmetrics_, &text_);
  text_.append("\n# TYPE ").append(name).append(total).append(" ").append(typ).append("\n");
  for (const Sample* s : kept) {
    if (!openmetrics_ && EndsWith(s->series->name, "_created")) continue;
    const Encoder::Prefix& prefix = encoder_->PrefixFor(s->series);
    if (prefix.id >= seen_.size()) seen_.resize(encoder_->texts_.size() + 1024, false);
    if (seen_[prefix.id]) continue;
    seen_[prefix.id] = true;
    text_.append(*prefix.text);
    AppendValue(s->value, &text_);
    text_ += '\n';
  }
  if (gzip_ && text_.size() >= kFlushAt) Flush(false);
}

void BodyWriter::Flush(bool final) {
  isal_zstream& zs = deflater_->zs;
  zs.next_in = reinterpret_cast<uint8_t*>(text_.data());
  zs.avail_in = static_cast<uint32_t>(text_.size());
  zs.end_of_stream = final ? 1 : 0;
  zs.flush = NO_FLUSH;
  while (true) {
    // Room for the input stored uncompressed at worst, plus block and gzip framing.
    size_t used = out_.size();
    out_.resize(used + zs.avail_in + (zs.avail_in >> 4) + 1024);
    zs.next_out = reinterpret_cast<uint8_t*>(out_.data() + used);
    zs.avail_out = static_cast<uint32_t>(out_.size() - used);
    int rc = isal_deflate(&zs);
    out_.resize(out_.size() - zs.avail_out);
    if (rc != COMP_OK) throw std::runtime_error("igzip deflate failed: " + std::to_string(rc));
    if (final ? zs.internal_state.state == ZSTATE_END : zs.avail_in == 0) break;
  }
  text_.clear();
}

std::string BodyWriter::Finish() {
  if (finished_) throw std::logic_error("BodyWriter::Finish called twice");
  finished_ = true;
  if (openmetrics_) text_.append("# EOF\n");
  if (!gzip_) return std::move(text_);
  Flush(true);
  return std::move(out_);
}

}  // namespace llm_serving::metrics
