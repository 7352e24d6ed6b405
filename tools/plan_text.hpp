// tools/plan_text.hpp - how strata-plan writes its numbers: counts, bytes, FLOPs, shares, times.
//
// Every report of the tool (the plan's table, the model state, the search's ranking) writes its
// figures through these, so the same quantity reads the same everywhere: bytes in decimal
// gigabytes as the device presets state memory, FLOPs with an SI prefix, times in the unit that
// keeps them short.
#pragma once
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <string>

namespace strata_plan {

inline std::string printf_string(const char* format, ...) __attribute__((format(printf, 1, 2)));
inline std::string printf_string(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

// 124475904 -> "124,475,904".
inline std::string grouped(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// Decimal gigabytes (1 GB = 1e9 bytes, as the device presets state memory).
inline std::string gb(double bytes) {
  const double g = bytes / 1e9;
  if (g == 0) return "0";
  if (std::fabs(g) >= 10) return printf_string("%.1f", g);
  if (std::fabs(g) >= 1) return printf_string("%.2f", g);
  return printf_string("%.3g", g);
}

inline std::string percent(double share) { return printf_string("%.1f%%", 100.0 * share); }

// 3.88e17 -> "388 PFLOP" (unit after an SI prefix).
inline std::string si(double v, const char* unit) {
  static const char* const prefixes[] = {"", "k", "M", "G", "T", "P", "E", "Z"};
  int k = 0;
  while (std::fabs(v) >= 1000 && k < 7) {
    v /= 1000;
    ++k;
  }
  return printf_string("%.3g %s%s", v, prefixes[k], unit);
}

inline std::string seconds_text(double s) {
  if (s >= 1000) return printf_string("%.0f s", s);
  if (s >= 1) return printf_string("%.4g s", s);
  if (s >= 1e-3) return printf_string("%.4g ms", s * 1e3);
  return printf_string("%.3g us", s * 1e6);
}

}  // namespace strata_plan
