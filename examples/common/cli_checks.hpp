// examples/common/cli_checks.hpp - CLI11 flag checks for strata's programs (gpt2_train,
// strata-plan) whose messages name the bound and the value: "--steps: must be >= 1, got -1",
// "--lr: expected a number, got 'fast'".
#pragma once
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <system_error>

namespace cli_checks {

inline std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// A whole number >= lo.
inline CLI::Validator integer_at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& text) -> std::string {
        long long v = 0;
        const char* end = text.data() + text.size();
        const auto res = std::from_chars(text.data(), end, v);
        if (text.empty() || res.ec != std::errc{} || res.ptr != end) return "expected an integer, got '" + text + "'";
        if (v < lo) return "must be >= " + std::to_string(lo) + ", got " + text;
        return {};
      },
      ">=" + std::to_string(lo));
}

// The whole of `text` as a finite number, or nothing.
inline std::optional<double> parse_real(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) { return std::nullopt; }
  if (used != text.size() || text.empty() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A finite number above lo (or at lo, when inclusive) and at most hi.
inline CLI::Validator real_in(double lo, bool inclusive, double hi = INFINITY) {
  const std::string range = std::isinf(hi)
                                ? std::string(inclusive ? ">= " : "> ") + short_number(lo)
                                : (inclusive ? "in [" : "in (") + short_number(lo) + ", " + short_number(hi) + "]";
  return CLI::Validator(
      [lo, inclusive, hi, range](std::string& text) -> std::string {
        const auto parsed = parse_real(text);
        if (!parsed) return "expected a number, got '" + text + "'";
        const double v = *parsed;
        if ((inclusive ? v < lo : v <= lo) || v > hi) return "must be " + range + ", got " + text;
        return {};
      },
      range);
}

}  // namespace cli_checks
