// strata/core/init.hpp - the sharding-invariant initializer.
//
// A parameter element's initial value is a pure function of (seed, parameter name, global
// element index): no generator state is carried from one tensor to the next. A rank that
// holds elements [a, b) of a sharded matrix computes exactly the values the serial model
// holds there, so every parallel layout starts bit-identical to the serial run.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

namespace strata {

struct seed {
  std::uint64_t value = 1337;
};

namespace detail {
// splitmix64's finaliser: a bijective mixer with good avalanche, cheap enough per element.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace detail

// FNV-1a over the parameter's name: its identity, the same on every rank and layout.
constexpr std::uint64_t parameter_id(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// 64 random bits for (seed, parameter, element, stream).
constexpr std::uint64_t counter_bits(std::uint64_t seed, std::uint64_t param, std::uint64_t index,
                                     std::uint64_t stream = 0) {
  return detail::mix64(detail::mix64(detail::mix64(seed ^ 0x5eedull) ^ param) ^ (index * 2 + stream));
}

// Uniform in (0, 1): 53 random bits, never exactly 0 so log() is safe.
inline double counter_uniform(std::uint64_t seed, std::uint64_t param, std::uint64_t index, std::uint64_t stream = 0) {
  return (static_cast<double>(counter_bits(seed, param, index, stream) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller on two independent uniforms of the same element.
inline double counter_normal(std::uint64_t seed, std::uint64_t param, std::uint64_t index) {
  double u1 = counter_uniform(seed, param, index, 0);
  double u2 = counter_uniform(seed, param, index, 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// sqrt usable in constant expressions (a layer config's init std, e.g. 0.02/sqrt(2·layers), in a
// constexpr model declaration); at run time it is std::sqrt, so values do not depend on where
// the config was computed beyond the last bit of a constant-evaluated one.
constexpr double constexpr_sqrt(double x) {
  if (!std::is_constant_evaluated()) return std::sqrt(x);
  if (!(x > 0)) return x == 0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  double r = x >= 1 ? x : 1.0;
  for (int i = 0; i < 200; ++i) {
    const double next = 0.5 * (r + x / r);
    if (next == r) break;
    r = next;
  }
  return r;
}

// How a parameter starts. `normal` draws N(0, std^2); `constant` fills `value`.
struct init_rule {
  enum kind_t { normal, constant } kind = constant;
  double std = 0.0;
  double value = 0.0;
  static init_rule normal_with_std(double s) { return {normal, s, 0.0}; }
  static init_rule zeros() { return {constant, 0.0, 0.0}; }
  static init_rule ones() { return {constant, 0.0, 1.0}; }
};

inline double initial_value(const init_rule& rule, std::uint64_t seed, std::uint64_t param,
                            std::uint64_t global_index) {
  if (rule.kind == init_rule::constant) return rule.value;
  return rule.std * counter_normal(seed, param, global_index);
}

}  // namespace strata
