// strata/core/json_number.hpp - a double as a JSON value, the same way wherever strata writes JSON.
//
//   nlohmann::ordered_json line;
//   line["tokens_per_s"] = strata::json_number(200.0);   // 200
//   line["loss"] = strata::json_number(1.0 / 3.0);       // 0.3333333333333333
//   line["mfu"] = strata::json_number(NAN);              // null
//
// Whole numbers are written whole, as counts are read ("200", not "200.0"); others in the
// shortest form that reads back to the same double, so a reader can compare them bit for bit.
#pragma once
#include <cmath>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace strata {

inline nlohmann::ordered_json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;  // JSON has no NaN or infinity
  // A whole double is exactly an integer; 9.2e18 keeps it within std::int64_t.
  if (v == std::floor(v) && std::fabs(v) < 9.2e18) return static_cast<std::int64_t>(v);
  return v;
}

}  // namespace strata
