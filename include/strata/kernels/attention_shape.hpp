// strata/kernels/attention_shape.hpp - the geometry every attention kernel takes: how many
// sequences and tokens, how many query heads share each key/value head, the head size and the
// softmax scale. Plain C++ (host and CUDA kernels, layers and the planner include it).
//
//   qkv  [batch, seq, (heads + 2·kv_heads)·head_dim]   per token: the query heads, then the key
//        heads, then the value heads. Query head h reads key/value head h / (heads / kv_heads)
//        (multi-head: kv_heads = heads; grouped-query: fewer; multi-query: one). K and V are
//        never repeated in memory.
//   out  [batch, seq, heads·head_dim]
//   lse  [batch, heads, seq]  one logsumexp per query row, what backward recomputes from
#pragma once
#include <cmath>
#include <cstdint>

namespace strata::kernels {

struct attention_shape {
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  double scale = 0;  // the softmax scale; 0: 1/sqrt(head_dim)

  // GPT-2's multi-head attention over C channels in NH heads.
  static constexpr attention_shape multi_head(std::int64_t batch, std::int64_t seq, std::int64_t channels,
                                              std::int64_t heads) {
    return {batch, seq, heads, heads, heads > 0 ? channels / heads : 0, 0};
  }
  constexpr std::int64_t group() const { return heads / kv_heads; }  // query heads per key/value head
  constexpr std::int64_t q_width() const { return heads * head_dim; }
  constexpr std::int64_t kv_width() const { return kv_heads * head_dim; }
  constexpr std::int64_t row_width() const { return q_width() + 2 * kv_width(); }  // one token of qkv
  double softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(double(head_dim)); }
  constexpr bool valid() const {
    return batch >= 0 && seq >= 0 && heads > 0 && kv_heads > 0 && head_dim > 0 && heads % kv_heads == 0;
  }
};

}  // namespace strata::kernels
