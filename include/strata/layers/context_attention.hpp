// strata/layers/context_attention.hpp - causal attention over a context-parallel group: each of
// cp ranks holds T/cp tokens of every sequence (layers/context_split.hpp: chunks i and
// 2·cp-1-i of 2·cp), and the result is, row for row, what serial causal attention over the whole
// sequence gives (kernels/attention.hpp), up to summation order. The attention layer calls it in
// place of kernels::attention_forward/backward when cp > 1:
//
//   strata::context_attention<T> core(group_ref(cp), context_split::checked(T, cp, rank),
//                                     context_form::ring, ledger);
//   core.forward(out, qkv, local);                    // qkv [B, T/cp, W], rotary already applied
//   core.backward(dqkv, dout, qkv, out, local);       // writes dqkv [B, T/cp, W] (not read)
//   core.release();                                   // drops what forward kept
//
// with local = the attention_shape of this rank's rows (seq = T/cp). Two forms:
//
//  - ring: the keys and values, packed [B, T/cp, 2·KV·d] in T, go round the group (to rank+1,
//    from rank-1); the next block's send and receive are posted before the current block is
//    computed (two buffers), and each block's partial output is folded into the running one by
//    logsumexp in acc_t (kernels/positioned_attention.hpp), so no T x T state exists anywhere.
//    A block no query row of this rank sees is not computed (with the causal split every block
//    is at least partly seen: the late chunk sees every rank's early one) while the ring keeps
//    moving, so every rank posts the same messages. Backward sends the blocks round again with
//    their dK/dV accumulators (acc_t): each rank adds its share and passes the sum on, and
//    after cp steps each accumulator is home, summed over every rank; dQ stays local. The
//    output and the gradients are rounded to T once. Any head counts.
//  - all_to_all (Ulysses): one all-to-all turns [B, T/cp, all heads] into [B, T, H/cp query heads
//    + KV/cp key/value heads] with every token, the rows put in position order so the serial
//    kernels apply unchanged; a second brings the output back to [B, T/cp, H·d]. Backward is the
//    mirror (dout to heads, serial backward, dqkv back). Needs cp to divide both H and KV, and
//    says so naming the numbers otherwise.
//
// Memory. Kept from forward to backward, in strata::buffer charged to memory_category::activations:
// ring, the logsumexps [B, H, T/cp] (acc_t); all_to_all, the logsumexps of its heads [B, H/cp, T]
// (acc_t), its gathered qkv [B, T, (H + 2·KV)/cp·d] and its output [B, T, H/cp·d] (T), so
// backward moves only dout and dqkv. What travels (ring blocks and accumulators, all-to-all
// send and receive buffers) is charged to memory_category::communication, the acc_t sums and
// other scratch of a call to memory_category::workspace, both released when the call returns.
//
// Device: the host kernels (kernels/positioned_attention.hpp) on memory host code can address,
// which is every strata::host run, emulated device memory included. It keeps positions and
// scratch in host memory and calls the host kernels only, so the attention layer refuses context
// parallelism under a cuda policy at start-up (the CUDA overloads of the kernels exist; this class
// does not call them).
//
// Traffic: context_attention_traffic below gives the bytes each rank sends per layer, forward
// and backward, for either form (what the communicator's counters show: sends for the ring,
// all_to_all for Ulysses). work() counts the score entries (query row, visible key) this rank
// computed, so a test can see that the causal split gives every rank the same share.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/comm/communicator.hpp"
#include "strata/comm/group_ref.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/attention.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/positioned_attention.hpp"
#include "strata/layers/context_split.hpp"  // context_split, context_form
#include "strata/policy/device.hpp"

namespace strata {

// Bytes one rank sends per attention layer.
struct context_traffic {
  std::uint64_t forward = 0, backward = 0;
  bool operator==(const context_traffic&) const = default;
};

// local: this rank's shape (seq = T/cp); elem_bytes: the storage type's size, acc_bytes its
// accumulation type's. With R = B·T/cp rows per rank and P = cp:
//   ring        forward  (P-1) · R·2·KV·d · elem                 the K/V block, P-1 hops
//               backward (P-1) · R·2·KV·d · elem                 the K/V block again
//                        + P · R·2·KV·d · acc                    dK/dV accumulators, P hops (home)
//   all_to_all  forward  (P-1)/P · R·(H + 2·KV)·d · elem         qkv to heads
//                        + (P-1)/P · R·H·d · elem                the output back
//               backward the same (dout to heads, dqkv back)
// Nothing when P = 1.
constexpr context_traffic context_attention_traffic(context_form form, const kernels::attention_shape& local, int cp,
                                                    std::size_t elem_bytes, std::size_t acc_bytes) {
  if (cp <= 1) return {};
  const auto P = static_cast<std::uint64_t>(cp);
  const auto rows = static_cast<std::uint64_t>(local.batch * local.seq);
  const auto d = static_cast<std::uint64_t>(local.head_dim), H = static_cast<std::uint64_t>(local.heads);
  const auto KV = static_cast<std::uint64_t>(local.kv_heads);
  if (form == context_form::ring) {
    const std::uint64_t block = rows * 2 * KV * d;
    return {(P - 1) * block * elem_bytes, (P - 1) * block * elem_bytes + P * block * acc_bytes};
  }
  // Equal blocks of (H + 2·KV)/P and H/P heads: each rank keeps one of its P.
  const std::uint64_t qkv_block = rows * ((H + 2 * KV) / P) * d, out_block = rows * (H / P) * d;
  const std::uint64_t bytes = (P - 1) * (qkv_block + out_block) * elem_bytes;
  return {bytes, bytes};
}

template <class T>
class context_attention {
 public:
  using A = acc_t<T>;

  // cp: the context-parallel group, this rank at split.rank of split.degree.
  context_attention(group_ref cp, context_split split, context_form form, memory_ledger& ledger)
      : cp_(std::move(cp)),
        split_(context_split::checked(split.seq, split.degree, split.rank)),
        form_(form),
        ledger_(&ledger) {
    STRATA_CHECK(cp_.size() == split_.degree && cp_.rank() == split_.rank,
                 "context_attention: the split puts this rank at ", split_.rank, " of ", split_.degree, " but group '",
                 cp_.name(), "' has it at ", cp_.rank(), " of ", cp_.size());
  }

  context_form form() const { return form_; }
  const context_split& split() const { return split_; }

  // The bytes this rank sends per layer (context_attention_traffic for T).
  static constexpr context_traffic traffic(context_form form, const kernels::attention_shape& local, int cp) {
    return context_attention_traffic(form, local, cp, sizeof(T), sizeof(A));
  }
  // Whether the all_to_all form can split these heads over cp ranks.
  static constexpr bool heads_divide(const kernels::attention_shape& s, int cp) {
    return cp >= 1 && s.heads % cp == 0 && s.kv_heads % cp == 0;
  }

  // out [B, T/cp, H·d] (written) from qkv [B, T/cp, (H + 2·KV)·d]: this rank's tokens in split
  // order. Collective over the group. Keeps what backward needs until release() or the next forward.
  void forward(T* out, const T* qkv, const kernels::attention_shape& local) {
    check_local("forward", local);
    release();
    if (form_ == context_form::ring) {
      ring_forward(out, qkv, local);
    } else {
      ulysses_forward(out, qkv, local);
    }
    kept_ = local;
    has_kept_ = true;
  }

  // dqkv [B, T/cp, (H + 2·KV)·d] (written, not read) from dout [B, T/cp, H·d]; qkv and out are
  // this forward's input and output. Collective over the group. The kept state stays.
  void backward(T* dqkv, const T* dout, const T* qkv, const T* out, const kernels::attention_shape& local) {
    check_local("backward", local);
    STRATA_CHECK(has_kept_ && same_shape(kept_, local),
                 "context_attention::backward: no forward of this shape is kept ",
                 "(run forward first; release() drops what it keeps)");
    if (form_ == context_form::ring) {
      ring_backward(dqkv, dout, qkv, out, local);
    } else {
      ulysses_backward(dqkv, dout, local);
    }
  }

  // Drops what forward keeps for backward.
  void release() {
    lse_ = buffer<A>();
    qkv_heads_ = buffer<T>();
    out_heads_ = buffer<T>();
    has_kept_ = false;
  }

  // Score entries (query row, visible key) this rank has computed, forward and backward, since
  // construction or reset_work(): counted by the positioned kernel (ring), from the shape for
  // the serial kernel (all_to_all: B·H/cp·T(T+1)/2 a pass, exactly the entries it computes).
  std::int64_t work() const { return work_; }
  void reset_work() { work_ = 0; }

 private:
  // Message tags of the ring: forward blocks, backward blocks, dK/dV accumulators.
  static constexpr int tag_forward = 3100, tag_backward = 3101, tag_grads = 3102;

  static bool same_shape(const kernels::attention_shape& a, const kernels::attention_shape& b) {
    return a.batch == b.batch && a.seq == b.seq && a.heads == b.heads && a.kv_heads == b.kv_heads &&
           a.head_dim == b.head_dim && a.scale == b.scale;
  }

  void check_local(const char* op, const kernels::attention_shape& s) const {
    STRATA_CHECK(s.valid(), "context_attention::", op,
                 ": need batch >= 0, heads, kv_heads, head_dim > 0 and kv_heads dividing heads, got batch = ", s.batch,
                 ", heads = ", s.heads, ", kv_heads = ", s.kv_heads, ", head_dim = ", s.head_dim);
    STRATA_CHECK(std::isfinite(s.scale), "context_attention::", op, ": the softmax scale must be finite, got ",
                 s.scale);
    STRATA_CHECK(s.seq == split_.local_seq(), "context_attention::", op, ": the local shape has seq = ", s.seq,
                 " rows but rank ", split_.rank, " of cp = ", split_.degree, " holds ", split_.local_seq(),
                 " tokens of a sequence of ", split_.seq);
    STRATA_CHECK(form_ != context_form::all_to_all || heads_divide(s, split_.degree),
                 "context_attention: the all_to_all form (Ulysses) splits the heads over cp = ", split_.degree,
                 " ranks and needs cp to divide both heads = ", s.heads, " and kv_heads = ", s.kv_heads,
                 "; use the ring form");
  }

  // The absolute positions of rank r's rows.
  std::vector<std::int64_t> positions(int r) const {
    std::vector<std::int64_t> p(std::size_t(split_.local_seq()));
    for (std::int64_t i = 0; i < split_.local_seq(); ++i) p[std::size_t(i)] = split_.position_of(r, i);
    return p;
  }
  // Whether some query row sees some key of the block.
  static bool sees(const std::vector<std::int64_t>& q_pos, const std::vector<std::int64_t>& k_pos) {
    return !q_pos.empty() && !k_pos.empty() &&
           *std::min_element(k_pos.begin(), k_pos.end()) <= *std::max_element(q_pos.begin(), q_pos.end());
  }
  int next() const { return (split_.rank + 1) % split_.degree; }
  int prev() const { return (split_.rank + split_.degree - 1) % split_.degree; }

  // ---- ring ---------------------------------------------------------------------------------
  void ring_forward(T* out, const T* qkv, const kernels::attention_shape& s) {
    const int P = split_.degree, r = split_.rank;
    const std::int64_t m = s.seq;
    const std::size_t kv_n = std::size_t(s.batch * m * 2 * s.kv_width()),
                      out_n = std::size_t(s.batch * m * s.q_width());
    const std::size_t lse_n = std::size_t(s.batch * s.heads * m);
    lse_ = buffer<A>(*ledger_, memory_category::activations, lse_n, uninitialized);
    std::fill_n(lse_.data(), lse_n, A(-INFINITY));
    buffer<A> sum(*ledger_, memory_category::workspace, out_n);  // the running output, zeroed
    buffer<A> part(*ledger_, memory_category::workspace, out_n, uninitialized);
    buffer<A> part_lse(*ledger_, memory_category::workspace, lse_n, uninitialized);
    buffer<T> blocks[2] = {buffer<T>(*ledger_, memory_category::communication, kv_n, uninitialized),
                           buffer<T>(*ledger_, memory_category::communication, P > 1 ? kv_n : 0, uninitialized)};
    kernels::attention_kv_pack(host{}, blocks[0].data(), qkv, s);
    const std::vector<std::int64_t> q_pos = positions(r);

    for (int step = 0; step < P; ++step) {
      buffer<T>& current = blocks[step % 2];
      comm_handle sent, received;
      if (step + 1 < P) {  // the next block moves while this one is computed
        sent = cp_.send_async(std::span<const T>(current.data(), kv_n), next(), tag_forward);
        received = cp_.recv_async(std::span<T>(blocks[(step + 1) % 2].data(), kv_n), prev(), tag_forward);
      }
      const std::vector<std::int64_t> k_pos = positions((r - step + P) % P);  // the block's owner
      if (sees(q_pos, k_pos)) {
        work_ += kernels::positioned_attention_forward(host{}, part.data(), part_lse.data(), qkv, q_pos.data(),
                                                       current.data(), k_pos.data(), m, s);
        kernels::attention_merge(host{}, sum.data(), lse_.data(), part.data(), part_lse.data(), s);
      }
      sent.wait();
      received.wait();
    }
    for (std::size_t i = 0; i < out_n; ++i) out[i] = convert<T>(sum[i]);
  }

  void ring_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const kernels::attention_shape& s) {
    const int P = split_.degree, r = split_.rank;
    const std::int64_t m = s.seq, KVW = 2 * s.kv_width();
    const std::size_t kv_n = std::size_t(s.batch * m * KVW), out_n = std::size_t(s.batch * m * s.q_width());
    buffer<A> D(*ledger_, memory_category::workspace, std::size_t(s.batch * s.heads * m), uninitialized);
    kernels::attention_delta(host{}, D.data(), dout, out, s);
    buffer<A> dq(*ledger_, memory_category::workspace, out_n);  // zeroed
    const std::size_t moving = P > 1 ? kv_n : 0;
    buffer<T> blocks[2] = {buffer<T>(*ledger_, memory_category::communication, kv_n, uninitialized),
                           buffer<T>(*ledger_, memory_category::communication, moving, uninitialized)};
    // Two outgoing accumulators (one may still be on its way while the next is summed) and the
    // incoming one.
    buffer<A> grads[2] = {buffer<A>(*ledger_, memory_category::communication, kv_n, uninitialized),
                          buffer<A>(*ledger_, memory_category::communication, moving, uninitialized)};
    buffer<A> incoming(*ledger_, memory_category::communication, moving, uninitialized);
    kernels::attention_kv_pack(host{}, blocks[0].data(), qkv, s);
    const std::vector<std::int64_t> q_pos = positions(r);
    comm_handle grads_sent[2];

    for (int step = 0; step < P; ++step) {
      buffer<T>& current = blocks[step % 2];
      comm_handle sent, received, arrived;
      if (step + 1 < P) {
        sent = cp_.send_async(std::span<const T>(current.data(), kv_n), next(), tag_backward);
        received = cp_.recv_async(std::span<T>(blocks[(step + 1) % 2].data(), kv_n), prev(), tag_backward);
      }
      // This block's accumulator, summed by the ranks before this one, arrives during the compute.
      if (step > 0) arrived = cp_.recv_async(std::span<A>(incoming.data(), kv_n), prev(), tag_grads);
      buffer<A>& g = grads[step % 2];
      grads_sent[step % 2].wait();  // its previous trip has left
      g.zero();
      const std::vector<std::int64_t> k_pos = positions((r - step + P) % P);
      if (sees(q_pos, k_pos))
        work_ += kernels::positioned_attention_backward(host{}, dq.data(), g.data(), dout, lse_.data(), D.data(), qkv,
                                                        q_pos.data(), current.data(), k_pos.data(), m, s);
      if (step > 0) {
        arrived.wait();
        for (std::size_t i = 0; i < kv_n; ++i) g[i] = incoming[i] + g[i];  // ring order: owner first
      }
      if (P > 1) grads_sent[step % 2] = cp_.send_async(std::span<const A>(g.data(), kv_n), next(), tag_grads);
      sent.wait();
      received.wait();
    }
    // The accumulator of this rank's own block comes home from the last rank to add to it.
    const A* home = grads[0].data();
    if (P > 1) {
      cp_.recv_async(std::span<A>(incoming.data(), kv_n), prev(), tag_grads).wait();
      home = incoming.data();
    }
    grads_sent[0].wait();
    grads_sent[1].wait();

    const std::int64_t W = s.row_width(), Q = s.q_width();
    for (std::int64_t row = 0; row < s.batch * m; ++row) {
      T* dst = dqkv + row * W;
      for (std::int64_t j = 0; j < Q; ++j) dst[j] = convert<T>(dq[std::size_t(row * Q + j)]);
      for (std::int64_t j = 0; j < KVW; ++j) dst[Q + j] = convert<T>(home[row * KVW + j]);
    }
  }

  // ---- all_to_all (Ulysses) -----------------------------------------------------------------
  // The shape a rank's heads have once the sequence is gathered.
  kernels::attention_shape gathered(const kernels::attention_shape& s) const {
    const int P = split_.degree;
    return {s.batch, split_.seq, s.heads / P, s.kv_heads / P, s.head_dim, s.scale};
  }
  std::int64_t serial_work(const kernels::attention_shape& g) const {
    return g.batch * g.heads * g.seq * (g.seq + 1) / 2;
  }

  void ulysses_forward(T* out, const T* qkv, const kernels::attention_shape& s) {
    const int P = split_.degree;
    const kernels::attention_shape g = gathered(s);
    const std::int64_t B = s.batch, m = s.seq, W = s.row_width(), Wg = g.row_width();
    const std::int64_t Hd = s.q_width(), KVd = s.kv_width(), Hgd = g.q_width(), KVgd = g.kv_width();
    qkv_heads_ = buffer<T>(*ledger_, memory_category::activations, std::size_t(B * g.seq * Wg), uninitialized);
    {
      // Block j of what this rank sends: rank j's query, key and value heads of this rank's rows.
      const std::size_t n = std::size_t(P * B * m * Wg);
      buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
      buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
      for (int j = 0; j < P; ++j)
        for (std::int64_t row = 0; row < B * m; ++row) {
          const T* src = qkv + row * W;
          T* dst = send.data() + (j * B * m + row) * Wg;
          std::copy_n(src + j * Hgd, Hgd, dst);
          std::copy_n(src + Hd + j * KVgd, KVgd, dst + Hgd);
          std::copy_n(src + Hd + KVd + j * KVgd, KVgd, dst + Hgd + KVgd);
        }
      cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
      // Block i came from rank i: its rows, put at their positions.
      for (int i = 0; i < P; ++i)
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t row = 0; row < m; ++row)
            std::copy_n(recv.data() + ((i * B + b) * m + row) * Wg, Wg,
                        qkv_heads_.data() + (b * g.seq + split_.position_of(i, row)) * Wg);
    }
    lse_ = buffer<A>(*ledger_, memory_category::activations, std::size_t(B * g.heads * g.seq), uninitialized);
    out_heads_ = buffer<T>(*ledger_, memory_category::activations, std::size_t(B * g.seq * Hgd), uninitialized);
    kernels::attention_forward(host{}, out_heads_.data(), lse_.data(), qkv_heads_.data(), g);
    work_ += serial_work(g);

    // Back: block i is rank i's rows of these heads; block j received holds heads of rank j.
    const std::size_t n = std::size_t(P * B * m * Hgd);
    buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
    buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
    for (int i = 0; i < P; ++i)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t row = 0; row < m; ++row)
          std::copy_n(out_heads_.data() + (b * g.seq + split_.position_of(i, row)) * Hgd, Hgd,
                      send.data() + ((i * B + b) * m + row) * Hgd);
    cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
    for (int j = 0; j < P; ++j)
      for (std::int64_t row = 0; row < B * m; ++row)
        std::copy_n(recv.data() + (j * B * m + row) * Hgd, Hgd, out + row * Hd + j * Hgd);
  }

  void ulysses_backward(T* dqkv, const T* dout, const kernels::attention_shape& s) {
    const int P = split_.degree;
    const kernels::attention_shape g = gathered(s);
    const std::int64_t B = s.batch, m = s.seq, W = s.row_width(), Wg = g.row_width();
    const std::int64_t Hd = s.q_width(), KVd = s.kv_width(), Hgd = g.q_width(), KVgd = g.kv_width();
    buffer<T> dqkv_heads(*ledger_, memory_category::workspace, std::size_t(B * g.seq * Wg), uninitialized);
    {
      // dout to heads, as qkv went in forward.
      buffer<T> dout_heads(*ledger_, memory_category::workspace, std::size_t(B * g.seq * Hgd), uninitialized);
      const std::size_t n = std::size_t(P * B * m * Hgd);
      buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
      buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
      for (int j = 0; j < P; ++j)
        for (std::int64_t row = 0; row < B * m; ++row)
          std::copy_n(dout + row * Hd + j * Hgd, Hgd, send.data() + (j * B * m + row) * Hgd);
      cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
      for (int i = 0; i < P; ++i)
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t row = 0; row < m; ++row)
            std::copy_n(recv.data() + ((i * B + b) * m + row) * Hgd, Hgd,
                        dout_heads.data() + (b * g.seq + split_.position_of(i, row)) * Hgd);
      kernels::attention_backward(host{}, dqkv_heads.data(), dout_heads.data(), qkv_heads_.data(), lse_.data(),
                                  out_heads_.data(), g);
      work_ += serial_work(g);
    }
    // dqkv back: block i is rank i's rows; block j received holds rank j's heads of this rank's rows.
    const std::size_t n = std::size_t(P * B * m * Wg);
    buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
    buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
    for (int i = 0; i < P; ++i)
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t row = 0; row < m; ++row)
          std::copy_n(dqkv_heads.data() + (b * g.seq + split_.position_of(i, row)) * Wg, Wg,
                      send.data() + ((i * B + b) * m + row) * Wg);
    cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
    for (int j = 0; j < P; ++j)
      for (std::int64_t row = 0; row < B * m; ++row) {
        const T* src = recv.data() + (j * B * m + row) * Wg;
        T* dst = dqkv + row * W;
        std::copy_n(src, Hgd, dst + j * Hgd);
        std::copy_n(src + Hgd, KVgd, dst + Hd + j * KVgd);
        std::copy_n(src + Hgd + KVgd, KVgd, dst + Hd + KVd + j * KVgd);
      }
  }

  group_ref cp_;
  context_split split_;
  context_form form_;
  memory_ledger* ledger_;
  kernels::attention_shape kept_{};
  bool has_kept_ = false;
  buffer<A> lse_;                    // ring [B, H, T/cp]; all_to_all [B, H/cp, T]
  buffer<T> qkv_heads_, out_heads_;  // all_to_all: its heads, every token, in position order
  std::int64_t work_ = 0;
};

}  // namespace strata
