// strata/kernels/cached_attention.hpp - causal attention of new tokens over a key/value cache
// (generation): cached_attention_forward.
//
//   cached_attention_forward(device, out, k_cache, v_cache, qkv, shape, pos, capacity)
// writes the n = shape.seq new tokens' keys and values into the caches [batch, capacity,
// kv_heads·head_dim] at positions pos .. pos + n - 1, then attends each new query to positions
// 0 .. its own (kernels/host/cached_attention.hpp has the layouts).
//
// What a layer includes to call this op on any device: the host overload and, under nvcc, the
// CUDA one. There is no CUDA kernel yet: the CUDA overload stops the run with a message naming
// the op, so a model under a cuda policy still compiles and generates without the cache.
#pragma once
#include <cstdint>

#include "strata/core/error.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/host/cached_attention.hpp"
#include "strata/policy/device.hpp"

#if defined(__CUDACC__)
namespace strata::kernels {
template <class T>
void cached_attention_forward(cuda, T*, T*, T*, const T*, const attention_shape&, std::int64_t, std::int64_t) {
  fail(
      "cached_attention_forward: no CUDA kernel for attention over a KV cache yet; generate with the cache "
      "under a host policy (strata::host), or without it (generation::cache = false)");
}
}  // namespace strata::kernels
#endif
