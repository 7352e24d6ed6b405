// strata/kernels/cuda/embedding.cuh - token plus position embedding on the GPU.
//
//   tokens [B, T] (int32),  wte [V, C] token table,  wpe [maxT, C] position table (T <= maxT)
//   out [B, T, C]:  out[b, t] = wte[tokens[b, t]] + wpe[t]
//
// Forward: one thread per pack of a row. A token outside [0, V) writes a zero row and is
// recorded in the device error record (gpu::check_device_errors() throws it, naming the token
// and position, at the next synchronising call).
//
// Backward, deterministic without atomics (the host kernel's method, on the GPU):
//   1. (token, position) pairs sorted by token with CUB's radix sort, which is stable: each
//      token's positions stay in position order;
//   2. one block per sorted index; only the first index of each token's run works: its threads
//      stride over the C channels, each summing the run's rows of dout in order, and add the
//      sum into dwte[token] with one rounding. So every dwte element is one fixed sequential
//      sum, in the same order as the host's.
//   dwpe[t] += sum over b of dout[b, t]: one thread per (t, channel), b in order.
//
// Vocabulary-parallel pieces (tensor parallelism; the host header has the contract): this rank
// holds rows [v_begin, v_begin + Vl) of the token table.
//   embedding_lookup_range       one thread per pack: the local row copied as is, or a zero row
//                                for another rank's token; a token outside [0, V) writes a zero
//                                row and is recorded, as in the forward above
//   position_embedding_add       one thread per pack: out[i] += wpe[(first_token + i) mod T]
//   token_embedding_backward     the backward's dwte half, runs of tokens outside the range
//                                skipped (embedding_backward is this with the whole vocabulary)
//   position_embedding_backward  the backward's dwpe half
#pragma once
#include <cub/device/device_radix_sort.cuh>

#include <cstdint>
#include <limits>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/kernels/cuda/common.cuh"
#include "strata/policy/device.hpp"

namespace strata::kernels {

namespace cuda_detail {

template <class T, int P>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* tokens, const T* wte, const T* wpe,
                                         std::int64_t count, std::int64_t T_, std::int64_t C, std::int64_t V,
                                         gpu::device_error_record* errors) {
  const std::int64_t packs_per_row = (C + P - 1) / P;
  for (std::int64_t k = thread_index(); k < count * packs_per_row; k += grid_stride()) {
    const std::int64_t i = k / packs_per_row, c = (k % packs_per_row) * P;
    const std::int32_t tok = tokens[i];
    float x[P], y[P];
    if (tok < 0 || tok >= V) {
      if (c == 0) gpu::record_device_error(errors, gpu::device_error_code::token_out_of_range, i, tok, V);
#pragma unroll
      for (int j = 0; j < P; ++j) x[j] = 0.0f;
    } else {
      load_pack(x, wte + std::int64_t(tok) * C, c, C);
      load_pack(y, wpe + (i % T_) * C, c, C);
#pragma unroll
      for (int j = 0; j < P; ++j) x[j] += y[j];
    }
    store_pack(out + i * C, c, C, x);
  }
}

// Copies base[i .. i+P) as stored (no rounding); one vector access for a full pack.
template <int P, class T>
__device__ __forceinline__ void copy_pack(T* dst, const T* src, std::int64_t i, std::int64_t n) {
  if (i + P <= n) {
    *reinterpret_cast<pack<T, P>*>(dst + i) = *reinterpret_cast<const pack<T, P>*>(src + i);
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j)
      if (i + j < n) dst[i + j] = src[i + j];
  }
}

template <class T, int P>
__global__ void embedding_lookup_range_kernel(T* out, const std::int32_t* tokens, const T* wte_local,
                                              std::int64_t count, std::int64_t C, std::int64_t v_begin, std::int64_t Vl,
                                              std::int64_t V, gpu::device_error_record* errors) {
  const std::int64_t packs_per_row = (C + P - 1) / P;
  for (std::int64_t k = thread_index(); k < count * packs_per_row; k += grid_stride()) {
    const std::int64_t i = k / packs_per_row, c = (k % packs_per_row) * P;
    const std::int32_t tok = tokens[i];
    const bool bad = tok < 0 || tok >= V;
    if (bad && c == 0) gpu::record_device_error(errors, gpu::device_error_code::token_out_of_range, i, tok, V);
    const std::int64_t local = std::int64_t(tok) - v_begin;
    if (!bad && local >= 0 && local < Vl) {
      copy_pack<P>(out + i * C, wte_local + local * C, c, C);
    } else {
      float z[P];
#pragma unroll
      for (int j = 0; j < P; ++j) z[j] = 0.0f;
      store_pack(out + i * C, c, C, z);
    }
  }
}

template <class T, int P>
__global__ void position_embedding_add_kernel(T* out, const T* wpe, std::int64_t count, std::int64_t T_,
                                              std::int64_t first_token, std::int64_t C) {
  const std::int64_t packs_per_row = (C + P - 1) / P;
  for (std::int64_t k = thread_index(); k < count * packs_per_row; k += grid_stride()) {
    const std::int64_t i = k / packs_per_row, c = (k % packs_per_row) * P;
    float x[P], y[P];
    load_pack(x, out + i * C, c, C);
    load_pack(y, wpe + ((first_token + i) % T_) * C, c, C);
#pragma unroll
    for (int j = 0; j < P; ++j) x[j] += y[j];
    store_pack(out + i * C, c, C, x);
  }
}

static __global__ void iota_kernel(std::int32_t* x, std::int64_t n) {
  for (std::int64_t i = thread_index(); i < n; i += grid_stride()) x[i] = std::int32_t(i);
}

// grid: one block per sorted index j. keys: sorted token ids, pos: their positions. Only tokens
// in [v_begin, v_begin + Vl) are summed, into dwte row (token - v_begin).
template <class T>
__global__ void embedding_backward_wte_kernel(T* dwte, const T* dout, const std::int32_t* keys, const std::int32_t* pos,
                                              std::int64_t count, std::int64_t C, std::int64_t v_begin, std::int64_t Vl,
                                              gpu::device_error_record* errors) {
  const std::int64_t j = blockIdx.x;
  if (j >= count) return;
  const std::int32_t tok = keys[j];
  if (j > 0 && keys[j - 1] == tok) return;  // not the first of its run
  if (tok < 0) {
    if (threadIdx.x == 0) gpu::record_device_error(errors, gpu::device_error_code::negative_token, pos[j], tok, 0);
    return;
  }
  const std::int64_t local = std::int64_t(tok) - v_begin;
  if (local < 0 || local >= Vl) return;  // another rank's row
  std::int64_t end = j + 1;
  while (end < count && keys[end] == tok) ++end;
  for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.0f;
    for (std::int64_t r = j; r < end; ++r) s += widen(dout[std::int64_t(pos[r]) * C + c]);
    T* w = dwte + local * C + c;
    *w = narrow<T>(widen(*w) + s);
  }
}

template <class T>
__global__ void embedding_backward_wpe_kernel(T* dwpe, const T* dout, std::int64_t B, std::int64_t T_, std::int64_t C) {
  for (std::int64_t k = thread_index(); k < T_ * C; k += grid_stride()) {
    const std::int64_t t = k / C, c = k % C;
    float s = 0.0f;
    for (std::int64_t b = 0; b < B; ++b) s += widen(dout[(b * T_ + t) * C + c]);
    dwpe[k] = narrow<T>(widen(dwpe[k]) + s);
  }
}

}  // namespace cuda_detail

template <class T>
void embedding_forward(cuda, T* out, const std::int32_t* tokens, const T* wte, const T* wpe, std::int64_t B,
                       std::int64_t T_, std::int64_t C, std::int64_t V) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0 && V > 0, "embedding_forward: need B, T, C >= 0 and V > 0, got B = ", B,
               ", T = ", T_, ", C = ", C, ", V = ", V);
  const std::int64_t count = B * T_;
  if (count == 0 || C == 0) return;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {out, wte, wpe}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(count * gpu::ceil_div(C, P), 1);
    cuda_detail::embedding_forward_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(out, tokens, wte, wpe, count, T_, C, V, ctx.errors());
  });
  STRATA_CUDA_CHECK_LAUNCH("embedding_forward");
}

// Vocabulary-parallel lookup: out[i] = wte_local[tokens[i] - v_begin] for tokens in
// [v_begin, v_begin + Vl), a zero row for the others. Every token id is checked against the real
// vocabulary V (on the device: recorded, reported by gpu::check_device_errors()).
template <class T>
void embedding_lookup_range(cuda, T* out, const std::int32_t* tokens, const T* wte_local, std::int64_t count,
                            std::int64_t C, std::int64_t v_begin, std::int64_t Vl, std::int64_t V) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(count >= 0 && C >= 0 && V > 0 && Vl >= 0 && v_begin >= 0,
               "embedding_lookup_range: bad sizes count = ", count, ", C = ", C, ", V = ", V, ", Vl = ", Vl);
  if (count == 0 || C == 0) return;
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {out, wte_local}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(count * gpu::ceil_div(C, P), 1);
    cuda_detail::embedding_lookup_range_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(out, tokens, wte_local, count, C, v_begin, Vl, V, ctx.errors());
  });
  STRATA_CUDA_CHECK_LAUNCH("embedding_lookup_range");
}

// out[i] += wpe[(first_token + i) mod T] for `count` tokens of [B, T] flattened.
template <class T>
void position_embedding_add(cuda, T* out, const T* wpe, std::int64_t count, std::int64_t T_, std::int64_t first_token,
                            std::int64_t C) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(count >= 0 && T_ > 0 && C >= 0 && first_token >= 0, "position_embedding_add: bad sizes count = ", count,
               ", T = ", T_, ", C = ", C);
  if (count == 0 || C == 0) return;
  const cudaStream_t stream = gpu::current_stream();
  cuda_detail::with_pack<T>(gpu::rows_vectorized<T>(C, {out, wpe}), [&](auto w) {
    constexpr int P = decltype(w)::value;
    const auto d = gpu::elementwise_launch(count * gpu::ceil_div(C, P), 1);
    cuda_detail::position_embedding_add_kernel<T, P>
        <<<d.grid, d.block, 0, stream>>>(out, wpe, count, T_, first_token, C);
  });
  STRATA_CUDA_CHECK_LAUNCH("position_embedding_add");
}

// Accumulates (+=) into dwte rows [v_begin, v_begin + Vl) (dwte points at row v_begin) the rows
// of dout whose token falls there; other tokens are skipped, negative ones recorded.
template <class T>
void token_embedding_backward(cuda, T* dwte, const T* dout, const std::int32_t* tokens, std::int64_t count,
                              std::int64_t C, std::int64_t v_begin, std::int64_t Vl) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(count >= 0 && C >= 0, "token_embedding_backward: negative size count = ", count, ", C = ", C);
  if (count == 0 || C == 0) return;
  STRATA_CHECK(count < (std::int64_t(1) << 31), "token_embedding_backward: ", count, " tokens exceed 2^31 - 1");
  gpu::context& ctx = gpu::this_context();
  const cudaStream_t stream = ctx.stream();

  gpu::scratch<std::int32_t> idx(std::size_t(count) * 3);
  std::int32_t* pos_in = idx.get();
  std::int32_t* keys_out = idx.get() + count;
  std::int32_t* pos_out = idx.get() + 2 * count;
  {
    const auto d = gpu::elementwise_launch(count, 1);
    cuda_detail::iota_kernel<<<d.grid, d.block, 0, stream>>>(pos_in, count);
    STRATA_CUDA_CHECK_LAUNCH("token_embedding_backward (iota)");
  }
  std::size_t temp_bytes = 0;
  STRATA_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, keys_out, pos_in, pos_out, count, 0, 32, stream));
  {
    gpu::scratch<unsigned char> temp(temp_bytes);
    STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, tokens, keys_out, pos_in, pos_out, count,
                                                      0, 32, stream));
  }
  cuda_detail::embedding_backward_wte_kernel<T>
      <<<unsigned(count), 256, 0, stream>>>(dwte, dout, keys_out, pos_out, count, C, v_begin, Vl, ctx.errors());
  STRATA_CUDA_CHECK_LAUNCH("token_embedding_backward (dwte)");
}

// Accumulates (+=) into dwpe rows 0 .. T-1: dwpe[t] gets every batch row's dout[b, t], b in order.
template <class T>
void position_embedding_backward(cuda, T* dwpe, const T* dout, std::int64_t B, std::int64_t T_, std::int64_t C) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0, "position_embedding_backward: negative size B = ", B, ", T = ", T_,
               ", C = ", C);
  if (T_ == 0 || C == 0) return;
  const auto d = gpu::elementwise_launch(T_ * C, 1);
  cuda_detail::embedding_backward_wpe_kernel<T><<<d.grid, d.block, 0, gpu::current_stream()>>>(dwpe, dout, B, T_, C);
  STRATA_CUDA_CHECK_LAUNCH("position_embedding_backward");
}

// Accumulates (+=) into dwte [V, C] (rows of the tokens present) and dwpe [maxT, C] (rows 0 .. T-1).
template <class T>
void embedding_backward(cuda, T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, std::int64_t B,
                        std::int64_t T_, std::int64_t C) {
  static_assert(cuda_detail::supported_v<T>, "strata CUDA kernels take float, bf16 or fp16");
  STRATA_CHECK(B >= 0 && T_ >= 0 && C >= 0, "embedding_backward: negative size B = ", B, ", T = ", T_, ", C = ", C);
  const std::int64_t count = B * T_;
  if (count == 0 || C == 0) return;
  STRATA_CHECK(count < (std::int64_t(1) << 31), "embedding_backward: B * T = ", count, " exceeds 2^31 - 1");
  token_embedding_backward(cuda{}, dwte, dout, tokens, count, C, 0, std::numeric_limits<std::int64_t>::max());
  position_embedding_backward(cuda{}, dwpe, dout, B, T_, C);
}

}  // namespace strata::kernels
