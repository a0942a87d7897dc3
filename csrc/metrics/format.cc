// Number spelling shared by the reader and the writer, matching CPython and prometheus_client.
#include <charconv>
#include <cmath>
#include <cstring>
#include <string>

#include "metrics.h"

namespace llm_serving::metrics {

namespace {

// Shortest round-trip digits of a positive finite value and the decimal point's position:
// value = 0.DIGITS x 10^decpt.
void ShortestDigits(double value, std::string* digits, int* decpt) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  (void)ec;  // 64 bytes always hold a double
  std::string_view text(buf, end - buf);
  size_t e = text.find('e');
  digits->clear();
  for (size_t i = 0; i < e; ++i) {
    if (text[i] != '.') digits->push_back(text[i]);
  }
  int exponent = 0;
  std::from_chars(text.data() + e + (text[e + 1] == '+' ? 2 : 1), text.data() + text.size(),
                  exponent);
  *decpt = exponent + 1;
}

bool EqualsLower(std::string_view text, const char* word) {
  size_t n = std::strlen(word);
  if (text.size() != n) return false;
  for (size_t i = 0; i < n; ++i) {
    char c = text[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != word[i]) return false;
  }
  return true;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // CPython's repr(): float_repr_style 'short', exponent form when decpt <= -4 or > 16.
  std::string out = std::signbit(value) ? "-" : "";
  double magnitude = std::fabs(value);
  if (magnitude == 0) return out + "0.0";
  std::string digits;
  int decpt = 0;
  ShortestDigits(magnitude, &digits, &decpt);
  int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) out.append(".").append(digits, 1, std::string::npos);
    int exponent = decpt - 1;
    out += exponent < 0 ? "e-" : "e+";
    std::string number = std::to_string(std::abs(exponent));
    if (number.size() < 2) out += '0';
    return out + number;
  }
  if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
  if (decpt >= n) return out + digits + std::string(decpt - n, '0') + ".0";
  return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

void AppendValue(double value, std::string* out) {
  // Integral values (every counter and bucket) print as repr() does, without to_chars.
  if (value == std::floor(value) && std::fabs(value) < 1e15 && value != 0) {
    char buf[24];
    auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<long long>(value));
    (void)ec;
    out->append(buf, end - buf).append(".0");
    return;
  }
  out->append(FormatValue(value));
}

std::string FloatToGoString(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  std::string s = FormatValue(value);
  size_t dot = s.find('.');
  // Go switches to exponents sooner than Python (prometheus_client's comment).
  if (value > 0 && dot != std::string::npos && dot > 6) {
    std::string mantissa = s.substr(0, 1) + "." + s.substr(1, dot - 1) + s.substr(dot + 1);
    while (!mantissa.empty() && (mantissa.back() == '0' || mantissa.back() == '.')) {
      mantissa.pop_back();
    }
    return mantissa + "e+0" + std::to_string(dot - 1);
  }
  return s;
}

bool ParseFloat(std::string_view text, double* out) {
  bool negative = false;
  std::string_view rest = text;
  if (!rest.empty() && (rest[0] == '+' || rest[0] == '-')) {
    negative = rest[0] == '-';
    rest.remove_prefix(1);
  }
  if (EqualsLower(rest, "inf") || EqualsLower(rest, "infinity")) {
    *out = negative ? -HUGE_VAL : HUGE_VAL;
    return true;
  }
  if (EqualsLower(rest, "nan")) {
    *out = negative ? -NAN : NAN;
    return true;
  }
  // digits [. digits] | . digits, then an optional exponent: what float() accepts, less
  // PEP 515 underscores.
  size_t i = 0, int_digits = 0, frac_digits = 0;
  while (i < rest.size() && IsDigit(rest[i])) ++i, ++int_digits;
  if (i < rest.size() && rest[i] == '.') {
    ++i;
    while (i < rest.size() && IsDigit(rest[i])) ++i, ++frac_digits;
  }
  if (int_digits + frac_digits == 0) return false;
  if (i < rest.size() && (rest[i] == 'e' || rest[i] == 'E')) {
    ++i;
    if (i < rest.size() && (rest[i] == '+' || rest[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < rest.size() && IsDigit(rest[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  if (i != rest.size()) return false;
  double value = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (end != rest.data() + rest.size()) return false;
  if (ec == std::errc::result_out_of_range) {
    // from_chars reports over- and underflow; float() gives inf or a (signed) zero.
    bool tiny = false;
    size_t e = rest.find_first_of("eE");
    if (e != std::string_view::npos) tiny = rest.find('-', e) != std::string_view::npos;
    value = tiny ? 0.0 : HUGE_VAL;
  }
  *out = negative ? -value : value;
  return true;
}

bool ValidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    // Expositions are nearly all ASCII: eight bytes at a time while no high bit is set.
    uint64_t word;
    if (end - p >= 8 && (std::memcpy(&word, p, 8), (word & 0x8080808080808080ULL) == 0)) {
      p += 8;
      continue;
    }
    unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      extra = 1, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      extra = 2, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((extra == 2 && cp < 0x800) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return false;
    }
    p += extra + 1;
  }
  return true;
}

}  // namespace llm_serving::metrics
