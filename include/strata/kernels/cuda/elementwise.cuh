// strata/kernels/cuda/elementwise.cuh - the GPU half of the element-wise building blocks
// (kernels/elementwise.hpp says what they do).
//
// One generated grid-stride kernel per functor: each thread takes one 16-byte pack (8 bf16 / 4
// float) of every operand when every pointer is 16-byte aligned and, for strided operands, the
// row length and every row stride are multiples of the pack width (so no pack crosses a row);
// one element otherwise. Values are widened to float, given to the functor, and rounded to the
// outputs' types (round to nearest even, as on the host). The functor is copied to the device:
// a struct of pointers and numbers with a STRATA_HD call operator (a lambda would need nvcc's
// --extended-lambda).
#pragma once
#include <cstdint>
#include <utility>

#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/host/elementwise.hpp"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

template <int P, class F, class OL, class IL, std::size_t... KO, std::size_t... KI>
__device__ __forceinline__ void elementwise_pack(const F& f, const OL& out, const IL& in, std::int64_t r,
                                                 std::int64_t c, std::int64_t limit, std::index_sequence<KO...>,
                                                 std::index_sequence<KI...>) {
  using elementwise_detail::get;
  float x[sizeof...(KI) + 1][P];
  float y[sizeof...(KO)][P];
  (load_pack(x[KI], get<KI>(in).data + r * get<KI>(in).ld, c, limit), ...);
#pragma unroll
  for (int q = 0; q < P; ++q) f(y[KO][q]..., x[KI][q]...);
  (store_pack(get<KO>(out).data + r * get<KO>(out).ld, c, limit, y[KO]), ...);
}

// Dense: the operands are one run of rows * cols elements. Otherwise row by row (P divides cols).
template <int P, bool Dense, class F, class OL, class IL>
__global__ void elementwise_kernel(F f, OL out, IL in, std::int64_t rows, std::int64_t cols) {
  const std::int64_t n = rows * cols;
  for (std::int64_t k = thread_index(); k * P < n; k += grid_stride()) {
    const std::int64_t e = k * P;
    if constexpr (Dense)
      elementwise_pack<P>(f, out, in, 0, e, n, std::make_index_sequence<OL::size>{},
                          std::make_index_sequence<IL::size>{});
    else
      elementwise_pack<P>(f, out, in, e / cols, e % cols, cols, std::make_index_sequence<OL::size>{},
                          std::make_index_sequence<IL::size>{});
  }
}

template <class F>
__global__ void for_each_index_kernel(F f, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) f(i);
}

// Every operand 16-byte aligned and, unless dense, every row stride a multiple of `width`.
template <bool O, class... T, std::size_t... K>
bool packable(const operand_list<O, T...>& l, bool dense, int width, std::index_sequence<K...>) {
  using elementwise_detail::get;
  return ((gpu::aligned16(get<K>(l).data) && (dense || get<K>(l).ld % width == 0)) && ...);
}

}  // namespace cuda_detail

// For every (r, c) of a [rows, cols] grid: f(outputs (r, c)&..., inputs (r, c)...), in float.
template <bool O, class... TO, bool I, class... TI, class F>
void elementwise(cuda, std::int64_t rows, std::int64_t cols, operand_list<O, TO...> out, operand_list<I, TI...> in,
                 F f) {
  static_assert(O && !I, "elementwise: outputs(...) first, then inputs(...)");
  static_assert(sizeof...(TO) >= 1, "elementwise: at least one output");
  static_assert((cuda_detail::supported_v<TO> && ...) && (cuda_detail::supported_v<std::remove_const_t<TI>> && ...),
                "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(rows >= 0 && cols >= 0, "elementwise: negative extent ", rows, " x ", cols);
  if (rows == 0 || cols == 0) return;
  constexpr auto ko = std::index_sequence_for<TO...>{};
  constexpr auto ki = std::index_sequence_for<TI...>{};
  // Both checked (each refuses a bad stride by name), then combined.
  const bool outputs_dense = elementwise_detail::settle(out, cols, "elementwise", ko);
  const bool inputs_dense = elementwise_detail::settle(in, cols, "elementwise", ki);
  const bool dense = (outputs_dense && inputs_dense) || rows == 1;
  using first = elementwise_detail::element_t<0, operand_list<O, TO...>>;
  constexpr int width = gpu::pack_width<first>;
  const bool packs = (dense || cols % width == 0) && cuda_detail::packable(out, dense, width, ko) &&
                     cuda_detail::packable(in, dense, width, ki);
  const cudaStream_t stream = gpu::current_stream();
  auto launch = [&](auto w, auto d) {
    constexpr int P = decltype(w)::value;
    constexpr bool D = decltype(d)::value;
    const auto g = gpu::elementwise_launch(rows * cols, P);
    cuda_detail::elementwise_kernel<P, D><<<g.grid, g.block, 0, stream>>>(f, out, in, rows, cols);
  };
  // Packs of the first output's width (16 bytes of it; a wider type's pack is two accesses).
  if (packs) {
    if (dense) launch(std::integral_constant<int, width>{}, std::true_type{});
    else launch(std::integral_constant<int, width>{}, std::false_type{});
  } else {
    if (dense) launch(std::integral_constant<int, 1>{}, std::true_type{});
    else launch(std::integral_constant<int, 1>{}, std::false_type{});
  }
  STRATA_CUDA_CHECK_LAUNCH("elementwise");
}

template <bool O, class... TO, bool I, class... TI, class F>
void elementwise(cuda d, std::int64_t n, operand_list<O, TO...> out, operand_list<I, TI...> in, F f) {
  elementwise(d, 1, n, out, in, f);
}

template <class F>
void for_each_index(cuda, std::int64_t n, F f) {
  STRATA_CHECK(n >= 0, "for_each_index: negative length ", n);
  if (n == 0) return;
  const auto g = gpu::elementwise_launch(n, 1);
  cuda_detail::for_each_index_kernel<<<g.grid, g.block, 0, gpu::current_stream()>>>(f, n);
  STRATA_CUDA_CHECK_LAUNCH("for_each_index");
}

}  // namespace strata::kernels
