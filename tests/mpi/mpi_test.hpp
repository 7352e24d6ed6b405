// tests/mpi/mpi_test.hpp - what the MPI tests share: the world, deterministic inputs, tolerances.
//
// Every rank's input is a pure function of (seed, rank, index), so each rank computes every other
// rank's input itself and the fp64 reference of any collective without communicating.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <strata/comm/launch.hpp>
#include <strata/core/memory.hpp>
#include <strata/core/dtype.hpp>
#include <strata/train/corpus.hpp>
#include <strata/train/token_data.hpp>
#include <strata/train/trainer.hpp>

namespace strata_test {

// The world the doctest main created (mpi_main.cpp).
strata::world& world();

// A value in [-1, 1) for (seed, rank, i), rounded to T.
inline double raw_value(std::uint64_t seed, int rank, std::size_t i) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + std::uint64_t(rank) * 0xbf58476d1ce4e5b9ull + i + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}
template <class T>
T input(std::uint64_t seed, int rank, std::size_t i) {
  return strata::convert<T>(raw_value(seed, rank, i));
}
// The same value, as the fp64 the reference is computed in.
template <class T>
double input_d(std::uint64_t seed, int rank, std::size_t i) {
  return strata::convert<double>(input<T>(seed, rank, i));
}

template <class T>
std::vector<T> inputs(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(seed, rank, i);
  return v;
}

// Unit roundoff of T's storage format (half an ulp, relative).
template <class T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, double>) return 0x1.0p-53;
  else if constexpr (std::is_same_v<T, float>) return 0x1.0p-24;
  else if constexpr (std::is_same_v<T, strata::bf16>) return 0x1.0p-8;
  else return 0x1.0p-11;
}

// How far an n-rank reduction of values with sum of magnitudes `abs_sum`, whose exact result is
// `ref`, may land from it: the accumulation type's summation error, then one rounding to T.
template <class T>
double reduction_tolerance(double ref, double abs_sum, int n) {
  using acc = strata::acc_t<T>;
  const double acc_err = 2.0 * n * unit_roundoff<acc>() * abs_sum;
  const double round_err = (std::is_same_v<T, acc> ? 0.0 : unit_roundoff<T>() * (std::fabs(ref) + acc_err));
  const double subnormal = std::is_same_v<T, strata::fp16> ? 0x1.0p-24 : 0.0;
  return acc_err + round_err + subnormal + 1e-300;
}

// Bit-identical values (moves without arithmetic must not change a bit).
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

inline double as_double(float x) { return x; }
inline double as_double(double x) { return x; }
inline double as_double(strata::bf16 x) { return static_cast<float>(x); }
inline double as_double(strata::fp16 x) { return static_cast<float>(x); }

// The layout tests' error measures: max_i |a_i - ref_i| / max_i |ref_i| (weights), and the
// largest per-element relative error (per-step losses).
inline double relative_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size() && i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - ref[i]));
    scale = std::max(scale, std::abs(ref[i]));
  }
  return a.size() == ref.size() ? worst / scale : INFINITY;
}
inline double elementwise_relative_error(const std::vector<double>& a, const std::vector<double>& ref) {
  double worst = a.size() == ref.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < ref.size() && i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - ref[i]) / std::abs(ref[i]));
  return worst;
}

// What the layout-equivalence suites (tests/tp, tests/pp) train with: `steps` steps of warm-up +
// cosine peaking at `lr`, on the generated corpus folded into a vocabulary of `vocab`.
inline strata::trainer_options equivalence_options(double lr, int steps) {
  strata::trainer_options o;
  o.schedule = {lr, lr / 10, 1, steps};
  return o;
}
inline strata::token_stream folded_corpus(std::int64_t vocab) {
  auto tokens = strata::byte_tokens(strata::generate_corpus(20000));
  for (auto& t : tokens) t = static_cast<std::uint16_t>(t % vocab);
  return strata::token_stream(std::move(tokens), 5);
}

// The busiest rank's value of a per-rank figure (collective over the world).
inline std::int64_t busiest(std::int64_t v) {
  double x = double(v);
  world().comm().all_reduce(std::span<double>(&x, 1), strata::reduce_op::max);
  return std::int64_t(x);
}

// What a run's ledger holds after one step on `batch`, by category, and the activation bytes
// its step kept: a pipeline's peak over its micro-batches in flight, or (one stage, whose layers
// keep their forward buffers between steps) what forward left.
struct held_bytes {
  std::int64_t params = 0, grads = 0, master = 0, optimizer = 0, comm = 0, activations = 0;
  std::int64_t model_state() const { return params + grads + master + optimizer; }
};
template <class Run>
held_bytes step_and_measure(Run& run, const strata::token_batch& batch) {
  using mc = strata::memory_category;
  auto& ledger = run.ledger();
  const std::size_t before = ledger.current(mc::activations);
  run.step(batch);
  held_bytes h;
  h.params = std::int64_t(ledger.current(mc::parameters));
  h.grads = std::int64_t(ledger.current(mc::gradients));
  h.master = std::int64_t(ledger.current(mc::master_weights));
  h.optimizer = std::int64_t(ledger.current(mc::optimizer_state));
  h.comm = std::int64_t(ledger.current(mc::communication));
  h.activations = run.model().pipelined() ? std::int64_t(run.model().last_step().peak_activation_bytes)
                                          : std::int64_t(ledger.current(mc::activations) - before);
  return h;
}

}  // namespace strata_test
