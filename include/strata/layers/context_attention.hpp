// strata/layers/context_attention.hpp - causal attention over a context-parallel group: each of
// cp ranks holds T/cp tokens of every sequence (layers/context_split.hpp: chunks i and
// 2·cp-1-i of 2·cp), and the result is, row for row, what serial causal attention over the whole
// sequence gives (kernels/attention.hpp), up to summation order. The attention layer calls it in
// place of kernels::attention_forward/backward when cp > 1:
//
//   strata::context_attention<T, Device> core(group_ref(cp), context_split::checked(T, cp, rank),
//                                             context_form::ring, ledger);
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
//    mirror (dout and the output to heads, serial backward, dqkv back). Needs cp to divide both H
//    and KV, and says so naming the numbers otherwise.
//
// Memory. Kept from forward to backward, in strata::buffer charged to memory_category::activations:
// ring, the logsumexps [B, H, T/cp] (acc_t); all_to_all, the logsumexps of its heads [B, H/cp, T]
// (acc_t) and its gathered qkv [B, T, (H + 2·KV)/cp·d] (T). The all-to-all form's backward reads
// neither the local qkv (reads_local_qkv() says so: the caller may let it go, and the gathered
// copy takes its place) nor a kept copy of its heads' output: it gathers the local output again
// beside dout, one all-to-all of H·d per row, so that each rank keeps a 1/cp share of cp 1's
// bytes in either form. What travels (ring blocks and accumulators, all-to-all send and receive
// buffers) is charged to memory_category::communication, the acc_t sums and other scratch of a
// call to memory_category::workspace, both released when the call returns.
//
// Device: context_attention<T, Device> runs on strata::host (memory host code can address, the
// emulated device space included) or strata::cuda (device memory): the kernels of
// kernels/positioned_attention.hpp and kernels/attention.hpp for Device, and the copies, sums and
// roundings as for_each_index functors (kernels/elementwise.hpp), so both devices run the same
// steps. The positions the kernels read are uploaded into the ledger's memory for each call
// (workspace: T int64, every rank's). The ring posts each step's messages as one p2p
// group in the same order on every rank, which is what an engine without message tags (NCCL)
// needs to pair them. On a GPU the cp group works on a stream of its own (comm/gpu_groups.cuh):
// a transfer starts after the kernels enqueued before it and runs beside the block's attention;
// its handle's wait() returns once the transfer is done, before anything reads what arrived.
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
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/communicator.hpp"
#include "strata/comm/group_ref.hpp"
#include "strata/core/config.hpp"
#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/attention.hpp"
#include "strata/kernels/attention_shape.hpp"
#include "strata/kernels/elementwise.hpp"
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
//               backward (P-1)/P · R·2·H·d · elem                dout and the output to heads
//                        + (P-1)/P · R·(H + 2·KV)·d · elem       dqkv back
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
  const std::uint64_t forward = (P - 1) * (qkv_block + out_block) * elem_bytes;
  return {forward, forward + (P - 1) * out_block * elem_bytes};
}

namespace context_detail {

// The copies and sums of context attention, written once for both devices (kernels/elementwise.hpp).

// p[i] = v.
template <class A>
struct fill_with {
  A* p;
  A v;
  STRATA_HD void operator()(std::int64_t i) const { p[i] = v; }
};

// sum[i] = a[i] + sum[i]: the incoming (earlier ranks') part first, as the ring orders it.
template <class A>
struct add_into {
  A* sum;
  const A* a;
  STRATA_HD void operator()(std::int64_t i) const { sum[i] = a[i] + sum[i]; }
};

// to[i] = from[i] rounded to T.
template <class T, class A>
struct round_to {
  T* to;
  const A* from;
  STRATA_HD void operator()(std::int64_t i) const { to[i] = convert<T>(from[i]); }
};

// The functors below move rows of several elements. Called per row (by_rows: the host, where the
// inner loops vectorise) or per element (the GPU, where neighbouring threads then touch
// neighbouring elements); for_each_index gets rows or elements accordingly.

// dqkv [R, W] (T) from dq [R, Q] and dkv [R, W - Q] (acc_t): each row's q part, then its k/v part.
template <class T, class A>
struct join_rows {
  T* dqkv;
  const A* dq;
  const A* dkv;
  std::int64_t W, Q;
  bool by_rows;
  STRATA_HD void operator()(std::int64_t i) const {
    if (by_rows) {
      for (std::int64_t j = 0; j < Q; ++j) dqkv[i * W + j] = convert<T>(dq[i * Q + j]);
      for (std::int64_t j = Q; j < W; ++j) dqkv[i * W + j] = convert<T>(dkv[i * (W - Q) + (j - Q)]);
      return;
    }
    const std::int64_t row = i / W, j = i % W;
    dqkv[i] = convert<T>(j < Q ? dq[row * Q + j] : dkv[row * (W - Q) + (j - Q)]);
  }
};

// Rows [R, W] holding every head <-> P blocks [P, R, Wg] holding one rank's heads each. A row is
// up to three segments (q, k, v) of widths width[s] · P at offset[s]; block j takes the j-th
// width[s] of each segment. to_blocks: rows -> blocks; else blocks -> rows. By rows, call i is
// row i % R of block i / R.
template <class T>
struct heads_of_rows {
  const T* from;
  T* to;
  std::int64_t R, W, Wg;
  std::int64_t width[3], offset[3];
  bool to_blocks, by_rows;
  STRATA_HD void move(std::int64_t k, std::int64_t p) const {
    if (to_blocks) {
      to[k] = from[p];
    } else {
      to[p] = from[k];
    }
  }
  STRATA_HD void operator()(std::int64_t i) const {
    if (by_rows) {
      const std::int64_t row = i % R, j = i / R;
      std::int64_t k = i * Wg;
      for (int s = 0; s < 3; ++s) {
        const std::int64_t p = row * W + offset[s] + j * width[s];
        for (std::int64_t c = 0; c < width[s]; ++c) move(k + c, p + c);
        k += width[s];
      }
      return;
    }
    std::int64_t c = i % Wg;
    const std::int64_t row = (i / Wg) % R, j = i / (Wg * R);
    int s = 0;
    while (s < 2 && c >= width[s]) c -= width[s++];
    move(i, row * W + offset[s] + j * width[s] + c);
  }
};

// P blocks [P, B, T/P, w] of every rank's rows in split order <-> sequences [B, T, w] in position
// order. to_positions: blocks -> sequences; else sequences -> blocks. By rows, call i is block
// row i.
template <class T>
struct rows_by_position {
  const T* from;
  T* to;
  context_split split;
  std::int64_t B, w;
  bool to_positions, by_rows;
  STRATA_HD void operator()(std::int64_t i) const {
    const std::int64_t m = split.local_seq();
    const std::int64_t r = by_rows ? i : i / w, c0 = by_rows ? 0 : i % w, n = by_rows ? w : 1;
    const std::int64_t row = r % m, b = (r / m) % B, owner = r / (m * B);
    const std::int64_t k = r * w + c0, p = (b * split.seq + split.position_of(int(owner), row)) * w + c0;
    for (std::int64_t c = 0; c < n; ++c) {
      if (to_positions) {
        to[p + c] = from[k + c];
      } else {
        to[k + c] = from[p + c];
      }
    }
  }
};

}  // namespace context_detail

template <class T, class Device = host>
class context_attention {
  static_assert(is_device_v<Device>, "context_attention: Device must be strata::host or strata::cuda");
  // The copies go a row per call on the host, an element per call on the GPU (context_detail).
  static constexpr bool by_rows = !std::is_base_of_v<cuda, Device>;

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
  // Whether backward reads the local qkv given to forward (the ring), or only what forward kept
  // (all-to-all: the gathered heads).
  bool reads_local_qkv() const { return form_ == context_form::ring; }
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
  // this forward's input and output (qkv unread, and may be null, unless reads_local_qkv()).
  // Collective over the group. The kept state stays.
  void backward(T* dqkv, const T* dout, const T* qkv, const T* out, const kernels::attention_shape& local) {
    check_local("backward", local);
    STRATA_CHECK(has_kept_ && same_shape(kept_, local),
                 "context_attention::backward: no forward of this shape is kept ",
                 "(run forward first; release() drops what it keeps)");
    if (form_ == context_form::ring) {
      ring_backward(dqkv, dout, qkv, out, local);
    } else {
      ulysses_backward(dqkv, dout, out, local);
    }
  }

  // Drops what forward keeps for backward.
  void release() {
    lse_ = buffer<A>();
    qkv_heads_ = buffer<T>();
    has_kept_ = false;
  }

  // Score entries (query row, visible key) this rank has computed, forward and backward, since
  // construction or reset_work(): counted by the positioned kernel (ring), from the shape for
  // the serial kernel (all_to_all: B·H/cp·T(T+1)/2 a pass, exactly the entries it computes).
  std::int64_t work() const { return work_; }
  void reset_work() { work_ = 0; }

 private:
  // Message tags of the ring: forward blocks, backward blocks, dK/dV accumulators (for the
  // engines that match by tag; NCCL matches by posting order, which the ring keeps the same on
  // every rank).
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

  // Every rank's absolute positions, rank r's m rows at r·m: on the host for the ring's choices,
  // and in the ledger's memory (the device's) for the kernels, for the length of one call.
  std::vector<std::int64_t> host_positions() const {
    const std::int64_t m = split_.local_seq();
    std::vector<std::int64_t> p(std::size_t(split_.degree * m));
    for (int r = 0; r < split_.degree; ++r)
      for (std::int64_t i = 0; i < m; ++i) p[std::size_t(r * m + i)] = split_.position_of(r, i);
    return p;
  }
  buffer<std::int64_t> device_positions(const std::vector<std::int64_t>& host_copy) const {
    buffer<std::int64_t> p(*ledger_, memory_category::workspace, host_copy.size(), uninitialized);
    p.upload(host_copy.data(), host_copy.size());
    return p;
  }
  // Whether some query row of rank q sees some key of rank k's block.
  bool sees(const std::vector<std::int64_t>& pos, int q, int k) const {
    const std::int64_t m = split_.local_seq();
    if (m == 0) return false;
    const auto q_pos = pos.begin() + q * m, k_pos = pos.begin() + k * m;
    return *std::min_element(k_pos, k_pos + m) <= *std::max_element(q_pos, q_pos + m);
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
    kernels::for_each_index(Device{}, std::int64_t(lse_n), context_detail::fill_with<A>{lse_.data(), A(-INFINITY)});
    buffer<A> sum(*ledger_, memory_category::workspace, out_n);  // the running output, zeroed
    buffer<A> part(*ledger_, memory_category::workspace, out_n, uninitialized);
    buffer<A> part_lse(*ledger_, memory_category::workspace, lse_n, uninitialized);
    buffer<T> blocks[2] = {buffer<T>(*ledger_, memory_category::communication, kv_n, uninitialized),
                           buffer<T>(*ledger_, memory_category::communication, P > 1 ? kv_n : 0, uninitialized)};
    kernels::attention_kv_pack(Device{}, blocks[0].data(), qkv, s);
    const std::vector<std::int64_t> pos = host_positions();
    const buffer<std::int64_t> dpos = device_positions(pos);

    for (int step = 0; step < P; ++step) {
      buffer<T>& current = blocks[step % 2];
      comm_handle moving;
      if (step + 1 < P) {  // the next block moves while this one is computed
        const p2p_op ops[2] = {send_to(next(), std::span<const T>(current.data(), kv_n), tag_forward),
                               recv_from(prev(), std::span<T>(blocks[(step + 1) % 2].data(), kv_n), tag_forward)};
        moving = cp_.p2p_async(ops);
      }
      const int owner = (r - step + P) % P;  // whose block this is
      if (sees(pos, r, owner)) {
        work_ += kernels::positioned_attention_forward(Device{}, part.data(), part_lse.data(), qkv, dpos.data() + r * m,
                                                       current.data(), dpos.data() + owner * m, m, s);
        kernels::attention_merge(Device{}, sum.data(), lse_.data(), part.data(), part_lse.data(), s);
      }
      moving.wait();
    }
    kernels::for_each_index(Device{}, std::int64_t(out_n), context_detail::round_to<T, A>{out, sum.data()});
  }

  // Each step posts, in one group and in the same order on every rank, the next block's send and
  // receive and the previous step's dK/dV accumulator's (engines that match messages by posting
  // order, like NCCL, pair them up); the accumulator that arrives is added after the compute.
  void ring_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const kernels::attention_shape& s) {
    const int P = split_.degree, r = split_.rank;
    const std::int64_t m = s.seq, KVW = 2 * s.kv_width();
    const std::size_t kv_n = std::size_t(s.batch * m * KVW), out_n = std::size_t(s.batch * m * s.q_width());
    buffer<A> D(*ledger_, memory_category::workspace, std::size_t(s.batch * s.heads * m), uninitialized);
    kernels::attention_delta(Device{}, D.data(), dout, out, s);
    buffer<A> dq(*ledger_, memory_category::workspace, out_n);  // zeroed
    const std::size_t moving_n = P > 1 ? kv_n : 0;
    buffer<T> blocks[2] = {buffer<T>(*ledger_, memory_category::communication, kv_n, uninitialized),
                           buffer<T>(*ledger_, memory_category::communication, moving_n, uninitialized)};
    // This step's accumulator and the previous one's (on its way out), and the incoming one.
    buffer<A> grads[2] = {buffer<A>(*ledger_, memory_category::communication, kv_n, uninitialized),
                          buffer<A>(*ledger_, memory_category::communication, moving_n, uninitialized)};
    buffer<A> incoming(*ledger_, memory_category::communication, moving_n, uninitialized);
    kernels::attention_kv_pack(Device{}, blocks[0].data(), qkv, s);
    const std::vector<std::int64_t> pos = host_positions();
    const buffer<std::int64_t> dpos = device_positions(pos);

    for (int step = 0; step < P; ++step) {
      buffer<T>& current = blocks[step % 2];
      buffer<A>& g = grads[step % 2];
      g.zero();
      p2p_op ops[4];
      std::size_t n_ops = 0;
      if (step + 1 < P) {
        ops[n_ops++] = send_to(next(), std::span<const T>(current.data(), kv_n), tag_backward);
        ops[n_ops++] = recv_from(prev(), std::span<T>(blocks[(step + 1) % 2].data(), kv_n), tag_backward);
      }
      if (step > 0) {  // the last step's accumulator on, this block's (summed by the ranks before) in
        ops[n_ops++] = send_to(next(), std::span<const A>(grads[(step + 1) % 2].data(), kv_n), tag_grads);
        ops[n_ops++] = recv_from(prev(), std::span<A>(incoming.data(), kv_n), tag_grads);
      }
      comm_handle moving;
      if (n_ops > 0) moving = cp_.p2p_async(std::span<const p2p_op>(ops, n_ops));
      const int owner = (r - step + P) % P;
      if (sees(pos, r, owner))
        work_ +=
            kernels::positioned_attention_backward(Device{}, dq.data(), g.data(), dout, lse_.data(), D.data(), qkv,
                                                   dpos.data() + r * m, current.data(), dpos.data() + owner * m, m, s);
      moving.wait();
      if (step > 0)
        kernels::for_each_index(Device{}, std::int64_t(kv_n), context_detail::add_into<A>{g.data(), incoming.data()});
    }
    // The accumulator of this rank's own block comes home from the last rank to add to it.
    const A* home = grads[0].data();
    if (P > 1) {
      const p2p_op ops[2] = {send_to(next(), std::span<const A>(grads[(P - 1) % 2].data(), kv_n), tag_grads),
                             recv_from(prev(), std::span<A>(incoming.data(), kv_n), tag_grads)};
      cp_.p2p_async(ops).wait();
      home = incoming.data();
    }
    kernels::for_each_index(
        Device{}, s.batch * m * (by_rows ? 1 : s.row_width()),
        context_detail::join_rows<T, A>{dqkv, dq.data(), home, s.row_width(), s.q_width(), by_rows});
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
  // for_each_index's count for n elements in rows of `width`.
  static std::int64_t calls(std::size_t n, std::int64_t width) {
    return by_rows ? std::int64_t(n) / width : std::int64_t(n);
  }
  // Rows of qkv (q, k and v segments) <-> blocks of each rank's heads.
  context_detail::heads_of_rows<T> qkv_blocks(const T* from, T* to, const kernels::attention_shape& s,
                                              bool to_blocks) const {
    const kernels::attention_shape g = gathered(s);
    return {from,
            to,
            s.batch * s.seq,
            s.row_width(),
            g.row_width(),
            {g.q_width(), g.kv_width(), g.kv_width()},
            {0, s.q_width(), s.q_width() + s.kv_width()},
            to_blocks,
            by_rows};
  }
  // Rows of the heads' output <-> blocks of each rank's heads.
  context_detail::heads_of_rows<T> out_blocks(const T* from, T* to, const kernels::attention_shape& s,
                                              bool to_blocks) const {
    const kernels::attention_shape g = gathered(s);
    return {from, to, s.batch * s.seq, s.q_width(), g.q_width(), {g.q_width(), 0, 0}, {0, 0, 0}, to_blocks, by_rows};
  }
  context_detail::rows_by_position<T> by_position(const T* from, T* to, std::int64_t B, std::int64_t w,
                                                  bool to_positions) const {
    return {from, to, split_, B, w, to_positions, by_rows};
  }

  void ulysses_forward(T* out, const T* qkv, const kernels::attention_shape& s) {
    const int P = split_.degree;
    const kernels::attention_shape g = gathered(s);
    const std::int64_t B = s.batch, m = s.seq, Wg = g.row_width(), Hgd = g.q_width();
    qkv_heads_ = buffer<T>(*ledger_, memory_category::activations, std::size_t(B * g.seq * Wg), uninitialized);
    {
      // Block j of what this rank sends: rank j's query, key and value heads of this rank's rows.
      const std::size_t n = std::size_t(P * B * m * Wg);
      buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
      buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
      kernels::for_each_index(Device{}, calls(n, Wg), qkv_blocks(qkv, send.data(), s, true));
      cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
      // Block i came from rank i: its rows, put at their positions.
      kernels::for_each_index(Device{}, calls(n, Wg), by_position(recv.data(), qkv_heads_.data(), B, Wg, true));
    }
    lse_ = buffer<A>(*ledger_, memory_category::activations, std::size_t(B * g.heads * g.seq), uninitialized);
    buffer<T> out_heads(*ledger_, memory_category::workspace, std::size_t(B * g.seq * Hgd), uninitialized);
    kernels::attention_forward(Device{}, out_heads.data(), lse_.data(), qkv_heads_.data(), g);
    work_ += serial_work(g);

    // Back: block i is rank i's rows of these heads; block j received holds heads of rank j.
    const std::size_t n = std::size_t(P * B * m * Hgd);
    buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
    buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
    kernels::for_each_index(Device{}, calls(n, Hgd), by_position(out_heads.data(), send.data(), B, Hgd, false));
    cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
    kernels::for_each_index(Device{}, calls(n, Hgd), out_blocks(recv.data(), out, s, false));
  }

  // rows [B, T/cp, H·d] of this rank's tokens -> heads [B, T, H/cp·d] of every token in position
  // order, as qkv went in forward (the output's and its gradient's way to the serial backward).
  void output_rows_to_heads(T* heads, const T* rows, const kernels::attention_shape& s) {
    const kernels::attention_shape g = gathered(s);
    const std::int64_t B = s.batch, Hgd = g.q_width();
    const std::size_t n = std::size_t(split_.degree * B * s.seq * Hgd);
    buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
    buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
    kernels::for_each_index(Device{}, calls(n, Hgd), out_blocks(rows, send.data(), s, true));
    cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
    kernels::for_each_index(Device{}, calls(n, Hgd), by_position(recv.data(), heads, B, Hgd, true));
  }

  void ulysses_backward(T* dqkv, const T* dout, const T* out, const kernels::attention_shape& s) {
    const int P = split_.degree;
    const kernels::attention_shape g = gathered(s);
    const std::int64_t B = s.batch, m = s.seq, Wg = g.row_width(), Hgd = g.q_width();
    buffer<T> dqkv_heads(*ledger_, memory_category::workspace, std::size_t(B * g.seq * Wg), uninitialized);
    {
      buffer<T> dout_heads(*ledger_, memory_category::workspace, std::size_t(B * g.seq * Hgd), uninitialized);
      buffer<T> out_heads(*ledger_, memory_category::workspace, std::size_t(B * g.seq * Hgd), uninitialized);
      output_rows_to_heads(dout_heads.data(), dout, s);
      output_rows_to_heads(out_heads.data(), out, s);
      kernels::attention_backward(Device{}, dqkv_heads.data(), dout_heads.data(), qkv_heads_.data(), lse_.data(),
                                  out_heads.data(), g);
      work_ += serial_work(g);
    }
    // dqkv back: block i is rank i's rows; block j received holds rank j's heads of this rank's rows.
    const std::size_t n = std::size_t(P * B * m * Wg);
    buffer<T> send(*ledger_, memory_category::communication, n, uninitialized);
    buffer<T> recv(*ledger_, memory_category::communication, n, uninitialized);
    kernels::for_each_index(Device{}, calls(n, Wg), by_position(dqkv_heads.data(), send.data(), B, Wg, false));
    cp_.all_to_all(std::span<const T>(send.data(), n), std::span<T>(recv.data(), n));
    kernels::for_each_index(Device{}, calls(n, Wg), qkv_blocks(recv.data(), dqkv, s, false));
  }

  group_ref cp_;
  context_split split_;
  context_form form_;
  memory_ledger* ledger_;
  kernels::attention_shape kept_{};
  bool has_kept_ = false;
  buffer<A> lse_;        // ring [B, H, T/cp]; all_to_all [B, H/cp, T]
  buffer<T> qkv_heads_;  // all_to_all: its heads' qkv, every token, in position order
  std::int64_t work_ = 0;
};

}  // namespace strata
