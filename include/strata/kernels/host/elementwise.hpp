// strata/kernels/host/elementwise.hpp - the host half of the element-wise building blocks
// (kernels/elementwise.hpp says what they do), and the operand lists both devices share.
//
// OpenMP over the elements, static schedule, in parallel above elementwise_parallel_threshold
// elements, as strata's own element-wise kernels. Each output element depends on the inputs'
// elements at the same place only, so the result never depends on the thread count.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/host/vector_math.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

// Element counts above this run in parallel on the host (the library's element-wise kernels' own).
inline constexpr std::int64_t elementwise_parallel_threshold = 65536;

// ---- operands ------------------------------------------------------------------------------
// One operand of an element-wise op over a [rows, cols] grid: element (r, c) is data[r * ld + c].
// A plain pointer is a contiguous operand (ld = cols); strided(p, ld) one whose rows are ld
// elements apart (a half of a fused [rows, 2H] matrix, a column block of a wider one).
template <class T>
struct operand {
  T* data = nullptr;
  std::int64_t ld = -1;  // elements from one row to the next; -1: cols (contiguous)
};
template <class T>
constexpr operand<T> strided(T* data, std::int64_t ld) {
  return {data, ld};
}

namespace elementwise_detail {
template <class T>
constexpr operand<T> make(T* p) {
  return {p, -1};
}
template <class T>
constexpr operand<T> make(operand<T> o) {
  return o;
}
template <class X>
using operand_t = decltype(make(std::declval<X>()));
template <class X>
using const_operand_t = operand<const std::remove_const_t<std::remove_pointer_t<decltype(operand_t<X>::data)>>>;

// A list that nvcc passes to a kernel by value (std::tuple's get is a host function there).
template <std::size_t K, class T>
struct slot {
  operand<T> op;
};
template <class Seq, class... T>
struct slots;
template <std::size_t... K, class... T>
struct slots<std::index_sequence<K...>, T...> : slot<K, T>... {};
}  // namespace elementwise_detail

// The outputs and the inputs of one element-wise call: outputs(y), inputs(a, b). Outputs are
// written, never read; an output may be an input too (each element is read before it is written).
template <bool Output, class... T>
struct operand_list : elementwise_detail::slots<std::index_sequence_for<T...>, T...> {
  static constexpr std::size_t size = sizeof...(T);
};

namespace elementwise_detail {
template <std::size_t K, class T>
STRATA_HD constexpr operand<T>& get(slot<K, T>& s) {
  return s.op;
}
template <std::size_t K, class T>
STRATA_HD constexpr const operand<T>& get(const slot<K, T>& s) {
  return s.op;
}
template <std::size_t K, class L>
using element_t = std::remove_const_t<std::remove_pointer_t<decltype(get<K>(std::declval<L&>()).data)>>;

// ld = cols where it was left to it; true when every operand is contiguous.
template <bool O, class... T, std::size_t... K>
bool settle(operand_list<O, T...>& l, std::int64_t cols, const char* who, std::index_sequence<K...>) {
  bool dense = true;
  (
      [&](auto& op) {
        if (op.ld < 0) op.ld = cols;
        STRATA_CHECK(op.ld >= cols, who, ": an operand's row stride (", op.ld, ") is below the row length (", cols,
                     ")");
        STRATA_CHECK(op.data != nullptr, who, ": a null operand");
        dense = dense && op.ld == cols;
      }(get<K>(l)),
      ...);
  return dense;
}

// The list moved to row r.
template <bool O, class... T, std::size_t... K>
STRATA_HD operand_list<O, T...> at_row(operand_list<O, T...> l, std::int64_t r, std::index_sequence<K...>) {
  ((get<K>(l).data += r * get<K>(l).ld), ...);
  return l;
}

// One element of the host loop: outputs [i] = f(inputs [i]), in A.
template <class A, class F, class OL, class IL, std::size_t... KO, std::size_t... KI>
STRATA_ALWAYS_INLINE inline void element(const F& f, const OL& out, const IL& in, std::int64_t i,
                                         std::index_sequence<KO...>, std::index_sequence<KI...>) {
  A o[sizeof...(KO)];
  f(o[KO]..., convert<A>(get<KI>(in).data[i])...);
  ((get<KO>(out).data[i] = convert<element_t<KO, OL>>(o[KO])), ...);
}
}  // namespace elementwise_detail

template <class... X>
constexpr auto outputs(X... x) {
  return operand_list<true, std::remove_pointer_t<decltype(elementwise_detail::operand_t<X>::data)>...>{
      {{elementwise_detail::make(x)}...}};
}
template <class... X>
constexpr auto inputs(X... x) {
  return operand_list<
      false, const std::remove_const_t<std::remove_pointer_t<decltype(elementwise_detail::operand_t<X>::data)>>...>{
      {{elementwise_detail::const_operand_t<X>{elementwise_detail::make(x).data, elementwise_detail::make(x).ld}}...}};
}

// e^x on either device in code written once (STRATA_HD): exp_fast on the host (vectorises; at
// most 2 ulp in float, std::exp in double), expf / exp on the GPU.
STRATA_HD STRATA_ALWAYS_INLINE inline float hd_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  return exp_fast(x);
#endif
}
STRATA_HD STRATA_ALWAYS_INLINE inline double hd_exp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

// ---- element-wise --------------------------------------------------------------------------
// For every (r, c) of a [rows, cols] grid: f(outputs (r, c)&..., inputs (r, c)...), every value
// in acc_t of the first output's type (float; double for double).
template <bool O, class... TO, bool I, class... TI, class F>
void elementwise(host, std::int64_t rows, std::int64_t cols, operand_list<O, TO...> out, operand_list<I, TI...> in,
                 F f) {
  static_assert(O && !I, "elementwise: outputs(...) first, then inputs(...)");
  static_assert(sizeof...(TO) >= 1, "elementwise: at least one output");
  using A = acc_t<elementwise_detail::element_t<0, operand_list<O, TO...>>>;
  STRATA_CHECK(rows >= 0 && cols >= 0, "elementwise: negative extent ", rows, " x ", cols);
  if (rows == 0 || cols == 0) return;
  constexpr auto ko = std::index_sequence_for<TO...>{};
  constexpr auto ki = std::index_sequence_for<TI...>{};
  // Both checked (each refuses a bad stride by name), then combined.
  const bool outputs_dense = elementwise_detail::settle(out, cols, "elementwise", ko);
  const bool inputs_dense = elementwise_detail::settle(in, cols, "elementwise", ki);
  const bool dense = outputs_dense && inputs_dense;
  if (dense || rows == 1) {
    const std::int64_t n = rows * cols;
#pragma omp parallel for schedule(static) if (n > elementwise_parallel_threshold)
    for (std::int64_t i = 0; i < n; ++i) elementwise_detail::element<A>(f, out, in, i, ko, ki);
  } else {
#pragma omp parallel for schedule(static) if (rows * cols > elementwise_parallel_threshold)
    for (std::int64_t r = 0; r < rows; ++r) {
      const auto o = elementwise_detail::at_row(out, r, ko);
      const auto x = elementwise_detail::at_row(in, r, ki);
      for (std::int64_t c = 0; c < cols; ++c) elementwise_detail::element<A>(f, o, x, c, ko, ki);
    }
  }
}

// The same over n contiguous elements (one row).
template <bool O, class... TO, bool I, class... TI, class F>
void elementwise(host d, std::int64_t n, operand_list<O, TO...> out, operand_list<I, TI...> in, F f) {
  elementwise(d, 1, n, out, in, f);
}

// f(i) for every i in [0, n): the escape hatch for what is not one element from the same place
// of each operand (a gather, a per-row scalar). Calls for different i must not write the same
// element.
template <class F>
void for_each_index(host, std::int64_t n, F f) {
  STRATA_CHECK(n >= 0, "for_each_index: negative length ", n);
#pragma omp parallel for schedule(static) if (n > elementwise_parallel_threshold)
  for (std::int64_t i = 0; i < n; ++i) f(i);
}

}  // namespace strata::kernels
