// tests/cuda/gpu_harness.cuh - the small harness the GPU tests and the GPU benchmarks share:
// host <-> device arrays, deterministic random data, relative error, timing, result rows.
// Needs only the CUDA toolkit and strata's headers (no doctest, no BLAS): the GPU machine
// builds it from the toolkit alone (bench/gpu/CMakeLists.txt).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/kernels/cuda/runtime.cuh"

namespace strata_gpu_test {

namespace gpu = strata::gpu;

// A device copy of a host vector (and back).
template <class T>
struct dvec {
  gpu::device_buffer<T> d;
  std::size_t n = 0;
  dvec() = default;
  explicit dvec(std::size_t count) : d(count), n(count) {}
  explicit dvec(const std::vector<T>& h) : d(h.size()), n(h.size()) {
    if (n) d.upload(h.data(), n);
  }
  T* get() { return d.data(); }
  const T* get() const { return d.data(); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    if (n) d.download(h.data(), n);
    return h;
  }
};

// xorshift64*: the same numbers on every machine.
struct rng {
  std::uint64_t s;
  explicit rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) / float(1ull << 24); }
};

template <class T>
std::vector<T> random_vec(std::size_t n, float lo, float hi, std::uint64_t seed) {
  rng r(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = strata::convert<T>(r.uniform(lo, hi));
  return v;
}

// ||out - ref|| / ||ref|| in double; NaN when anything is NaN (so it never passes).
template <class T>
double rel_error(const std::vector<T>& out, const std::vector<T>& ref) {
  if (out.size() != ref.size()) return NAN;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double o = strata::convert<double>(out[i]), r = strata::convert<double>(ref[i]);
    if (std::isnan(o) || std::isnan(r)) return NAN;
    num += (o - r) * (o - r);
    den += r * r;
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

template <class T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Mean milliseconds of f() over `iters` runs on the current stream (after `warmup` runs).
inline double time_ms(const std::function<void()>& f, int iters = 10, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  gpu::event start(true), stop(true);
  const cudaStream_t s = gpu::current_stream();
  start.record(s);
  for (int i = 0; i < iters; ++i) f();
  stop.record(s);
  stop.synchronize();
  return double(stop.since(start)) / iters;
}

// One line of the result table.
struct result_row {
  std::string section;  // "kernel", "ceiling", "determinism", ...
  std::string name, dtype, shape;
  double rel = NAN, tol = NAN;  // NaN tol: not a precision check
  bool pass = true;
  double perf = NAN;        // GB/s or TFLOP/s
  std::string unit;         // "GB/s" / "TFLOP/s" / ""
  double of_ceiling = NAN;  // perf / ceiling, 0..1
  std::string note;
};

inline std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline void print_table(const std::vector<result_row>& rows, std::FILE* out = stdout) {
  std::fprintf(out, "%-34s %-5s %-26s %10s %8s %-4s %12s %-8s %7s  %s\n", "kernel", "dtype", "shape", "rel.err", "tol",
               "ok", "achieved", "unit", "of ceil", "note");
  for (const auto& r : rows)
    std::fprintf(out, "%-34s %-5s %-26s %10s %8s %-4s %12s %-8s %7s  %s\n", r.name.c_str(), r.dtype.c_str(),
                 r.shape.c_str(), fmt("%.2e", r.rel).c_str(), fmt("%.0e", r.tol).c_str(), r.pass ? "ok" : "FAIL",
                 fmt("%.1f", r.perf).c_str(), r.unit.c_str(), fmt("%.0f%%", 100 * r.of_ceiling).c_str(),
                 r.note.c_str());
}

// Tab-separated rows for scripts/gpu-check (one per line, no header).
inline void write_tsv(const std::vector<result_row>& rows, const char* path) {
  std::FILE* f = std::fopen(path, "w");
  if (!f) return;
  for (const auto& r : rows)
    std::fprintf(f, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.section.c_str(), r.name.c_str(), r.dtype.c_str(),
                 r.shape.c_str(), fmt("%.3e", r.rel).c_str(), fmt("%.0e", r.tol).c_str(), r.pass ? "ok" : "FAIL",
                 fmt("%.2f", r.perf).c_str(), r.unit.c_str(), fmt("%.4f", r.of_ceiling).c_str(), r.note.c_str());
  std::fclose(f);
}

}  // namespace strata_gpu_test
