// strata/layers/parameters.hpp - every parameter of a model in one flat buffer.
//
// Layers register their parameters by name while the model is built; the store then lays
// them end to end in one flat weight buffer and one flat gradient buffer (what the optimizer,
// gradient clipping and, later, data-parallel buckets work on) and fills the weights with the
// sharding-invariant initializer. A layer keeps only a handle and asks the store for pointers.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/dtype.hpp"
#include "strata/core/error.hpp"
#include "strata/core/init.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"

namespace strata {

// Index of a registered parameter in its store.
struct param_handle {
  int index = -1;
  bool valid() const { return index >= 0; }
};

// Where a rank's piece of a tensor-parallel parameter sits in the full tensor. Dimension `dim`
// (0: rows, 1: columns of a matrix) of the full tensor is a run of blocks (3 for a fused QKV
// weight: q, k, v), and each block is split into pieces over the `parts` ranks; this rank holds
// its piece of every block, blocks kept in order. The blocks are `blocks` equal ones, or, when
// `block_sizes` is set, of those sizes (grouped-query QKV: {H·d, KV·d, KV·d}). A block may be cut
// into fewer pieces than there are ranks (`block_parts`, dividing `parts`): then parts/block_parts
// neighbouring ranks hold the same piece (a key/value head shared by more ranks than there are
// key/value heads). Rows at or past `real_rows` are padding (a vocabulary padded to a multiple of
// the degree): they start at zero and are no part of the serial model. parts == 1: the parameter
// is whole on every rank (replicated).
struct tensor_shard {
  static constexpr int max_blocks = 4;
  strata::shape full;  // the full tensor, padding included
  int dim = 0, parts = 1, index = 0, blocks = 1;
  std::int64_t real_rows = -1;                         // -1: no padding
  std::array<std::int64_t, max_blocks> block_sizes{};  // along dim; all zero: `blocks` equal blocks
  std::array<int, max_blocks> block_parts{};           // pieces of each block; zero: `parts`

  bool sharded() const { return parts > 1; }
  // Along `dim`: the size of block b, how many pieces it is cut into, and this rank's piece.
  // Meaningful only for a consistent() split; on any other (a checkpoint's fields, before they
  // are checked) they return 0 rather than divide by zero or index past an array.
  std::int64_t block_size(int b) const {
    if (b < 0 || b >= max_blocks || blocks < 1) return 0;
    return block_sizes[0] > 0 ? block_sizes[std::size_t(b)] : extent() / blocks;
  }
  int pieces(int b) const {
    if (b < 0 || b >= max_blocks) return 0;
    return block_parts[std::size_t(b)] > 0 ? block_parts[std::size_t(b)] : parts;
  }
  int piece_index(int b) const {
    const int n = pieces(b), holders = n > 0 ? parts / n : 0;
    return holders > 0 ? index / holders : 0;
  }
  // Whether some block is held whole by more than one rank (its gradients are partial sums).
  bool has_shared_pieces() const {
    for (int b = 0; b < block_count(); ++b)
      if (pieces(b) < parts) return true;
    return false;
  }
  strata::shape local() const {
    strata::shape s = full;
    std::int64_t along = 0;
    for (int b = 0; b < block_count(); ++b) along += pieces(b) > 0 ? block_size(b) / pieces(b) : 0;
    if (dim >= 0 && dim < max_rank) s.dims[static_cast<std::size_t>(dim)] = along;
    return s;
  }
  // Whether the blocks fit the tensor: positive, dividing into their pieces, adding up to it.
  bool consistent() const {
    if (parts < 1 || index < 0 || index >= parts || blocks < 1 || blocks > max_blocks || full.rank > max_rank ||
        dim < 0 || dim >= full.rank)
      return false;
    std::int64_t total = 0;
    for (int b = 0; b < blocks; ++b) {
      const int n = pieces(b);
      if (n < 1 || parts % n != 0 || block_size(b) <= 0 || block_size(b) % n != 0) return false;
      if (__builtin_add_overflow(total, block_size(b), &total)) return false;  // sizes may come from a file
    }
    return total == extent();
  }
  // Local elements [begin, end) that `holders` ranks hold alike: one run per block, for a split
  // along rows (dim 0) or of a vector; the whole piece as one run of 1 holder otherwise.
  struct holder_run {
    std::int64_t begin = 0, end = 0;
    int holders = 1;
  };
  std::vector<holder_run> holder_runs() const {
    const strata::shape l = local();
    const std::int64_t numel = l.numel();
    if (!has_shared_pieces() || dim != 0) return {{0, numel, 1}};
    const std::int64_t per_row = l.rank >= 2 ? numel / l[0] : 1;
    std::vector<holder_run> runs;
    std::int64_t row = 0;
    for (int b = 0; b < block_count(); ++b) {
      const std::int64_t rows = block_size(b) / pieces(b);
      runs.push_back({row * per_row, (row + rows) * per_row, parts / pieces(b)});
      row += rows;
    }
    return runs;
  }
  // The full tensor's (row, column) of local element i, rank 1 tensors being one row.
  std::pair<std::int64_t, std::int64_t> full_position(std::int64_t i) const {
    const strata::shape l = local();
    const std::int64_t cols = l.rank >= 2 ? l[1] : l.rank == 1 ? l[0] : 0;
    if (cols <= 0) return {0, 0};  // no elements (or not a consistent split): nothing to place
    std::int64_t row = l.rank >= 2 ? i / cols : 0, col = l.rank >= 2 ? i % cols : i;
    std::int64_t& along = (dim == 0 && l.rank >= 2) ? row : col;
    std::int64_t local_start = 0, full_start = 0;
    for (int b = 0; b < block_count(); ++b) {
      const std::int64_t piece = pieces(b) > 0 ? block_size(b) / pieces(b) : 0;  // of this block, on one rank
      if (along < local_start + piece || b + 1 == block_count()) {
        along = full_start + piece_index(b) * piece + (along - local_start);
        break;
      }
      local_start += piece;
      full_start += block_size(b);
    }
    return {row, col};
  }
  // Index of local element i in the full (row-major) tensor.
  std::int64_t global_index(std::int64_t i) const {
    const auto [row, col] = full_position(i);
    return full.rank >= 2 ? row * full[1] + col : col;
  }
  bool is_padding(std::int64_t i) const {
    if (real_rows < 0) return false;
    const auto [row, col] = full_position(i);
    return (full.rank >= 2 ? row : col) >= real_rows;
  }
  // A [rows, cols] matrix whose rows are split over `parts` ranks after padding them to a
  // multiple of `parts` (a vocabulary-parallel table); whole when parts = 1.
  static tensor_shard padded_rows(std::int64_t rows, std::int64_t cols, int parts, int index) {
    if (parts == 1) return tensor_shard{{rows, cols}};
    return {{(rows + parts - 1) / parts * parts, cols}, 0, parts, index, 1, rows};
  }
  // The same split as seen from rank q.
  tensor_shard of_rank(int q) const {
    tensor_shard s = *this;
    s.index = q;
    return s;
  }

 private:
  std::int64_t extent() const { return dim >= 0 && dim < full.rank && full.rank <= max_rank ? full[dim] : 0; }
  int block_count() const { return std::clamp(blocks, 0, max_blocks); }
};

// How one rank's gradient of a parameter relates to the serial model's over the tensor-parallel
// group, said when the parameter is registered. The library sums the shares over the group
// (module_scope::gradients) exactly where they are shares, so no layer calls a reduction itself.
//   own          the rank computes its whole gradient: of its piece of a sharded tensor, or of a
//                whole one from every token (a layer that gathered them)
//   token_share  replicated, computed from the tokens this rank holds between regions (a norm's
//                gain): a share under sequence parallelism, summed over the group then
//   head_share   replicated, computed from the heads this rank holds inside a region (a per-head
//                norm's gain): a share whenever the group has more than one rank
enum class tensor_gradient { own, token_share, head_share };

constexpr const char* tensor_gradient_name(tensor_gradient g) {
  switch (g) {
    case tensor_gradient::own: return "own";
    case tensor_gradient::token_share: return "token_share";
    case tensor_gradient::head_share: return "head_share";
  }
  return "?";
}

struct param_info {
  std::string name;  // "blocks.3.attn.qkv.weight": its identity for init and checkpoints
  strata::shape shape;
  std::int64_t offset = 0;  // in elements, into the flat buffers
  std::int64_t numel = 0;
  init_rule init;
  bool weight_decay = false;  // AdamW decays matrices, not biases or norm gains
  int writers = 1;            // layers whose backward adds to its gradient (2 for a tied table)
  tensor_shard shard;         // this rank's piece under tensor parallelism (whole when not sharded)
  bool replica = false;       // a copy of a parameter another pipeline stage owns (a tied table on
                              // the last stage): its gradient is summed with the owner's and it
                              // counts once, there
  bool expert = false;        // one of the experts this rank holds under expert parallelism: its
                              // gradient is reduced over the ranks holding the same experts
  tensor_gradient gradient = tensor_gradient::own;  // what the tensor group sums (see tensor_gradient)
};

template <class T>
class parameter_store {
 public:
  parameter_store(memory_ledger& ledger, strata::seed s) : ledger_(&ledger), seed_(s) {}
  parameter_store(const parameter_store&) = delete;
  parameter_store& operator=(const parameter_store&) = delete;

  param_handle add(std::string name, strata::shape shape, init_rule init, bool weight_decay) {
    return add(std::move(name), init, weight_decay, tensor_shard{shape});
  }
  // A parameter that may be a piece of a larger tensor: its shape here is shard.local().
  param_handle add(std::string name, init_rule init, bool weight_decay, tensor_shard shard,
                   tensor_gradient gradient = tensor_gradient::own) {
    const strata::shape shape = shard.local();
    STRATA_CHECK(!materialized(), "parameter_store: cannot add '", name, "' after the parameters were allocated");
    for (const auto& e : entries_)
      STRATA_CHECK(e.name != name, "parameter_store: parameter '", name, "' registered twice");
    STRATA_CHECK(shard.consistent(), "parameter_store: '", name, "' of shape ", shard.full.str(),
                 " cannot be split into ", shard.parts, " pieces of each of ", shard.blocks, " blocks along dimension ",
                 shard.dim);
    STRATA_CHECK(gradient == tensor_gradient::own || !shard.sharded(), "parameter_store: '", name,
                 "' is sharded over the tensor group; its gradient is its own piece's, not a ",
                 tensor_gradient_name(gradient));
    param_info info{std::move(name), shape, total_, shape.numel(), init, weight_decay, 1, shard};
    info.gradient = gradient;
    STRATA_CHECK(info.numel > 0, "parameter_store: parameter '", info.name, "' has shape ", shape.str(),
                 " with no elements");
    total_ += info.numel;
    entries_.push_back(std::move(info));
    return {static_cast<int>(entries_.size()) - 1};
  }

  // The parameter registered as `name`, or an invalid handle.
  param_handle find(std::string_view name) const {
    for (std::size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].name == name) return {static_cast<int>(i)};
    return {};
  }
  // Marks h as a pipeline stage's copy of a parameter another stage owns (see param_info).
  void mark_replica(param_handle h) {
    info(h);
    entries_[static_cast<std::size_t>(h.index)].replica = true;
  }

  // One of this rank's share of a mixture's experts (expert parallelism).
  void mark_expert(param_handle h) {
    info(h);
    entries_[static_cast<std::size_t>(h.index)].expert = true;
  }

  // Another layer's backward also adds to this parameter's gradient (a tied table).
  void add_writer(param_handle h) {
    info(h);  // checks the handle
    entries_[static_cast<std::size_t>(h.index)].writers++;
  }

  // Gradient-ready notifications, so data parallelism can reduce a bucket as soon as backward
  // has finished with it. Layers call grad_written(h) after adding to h's gradient; once every
  // writer has, the hook (when armed for this backward) runs with h.
  void set_grad_ready_hook(std::function<void(param_handle)> hook) { hook_ = std::move(hook); }
  void arm_grad_ready_hook() {
    pending_writers_.resize(entries_.size());
    for (std::size_t i = 0; i < entries_.size(); ++i) pending_writers_[i] = entries_[i].writers;
    armed_ = static_cast<bool>(hook_);
  }
  // The tensor-parallel mode decides which shares are summed now (module_scope sets it from its
  // group: token shares under sequence parallelism, head shares whenever the group has ranks).
  void set_tensor_sums(std::function<bool(tensor_gradient)> summed) { summed_ = std::move(summed); }
  // Whether h's gradient on this rank is a share the tensor group sums, in the current mode.
  bool summed_over_tensor_group(param_handle h) const {
    const tensor_gradient g = info(h).gradient;
    return g != tensor_gradient::own && summed_ && summed_(g);
  }
  // A layer that wrote h's gradient itself says so. A share the group sums cannot be written so:
  // it goes through module_scope::gradients, which sums it and then calls summed_grad_written.
  void grad_written(param_handle h) {
    STRATA_CHECK(!summed_over_tensor_group(h), "parameter '", info(h).name, "' is registered as a ",
                 tensor_gradient_name(info(h).gradient),
                 " of the tensor group, which is summed over the group now: write its gradient through "
                 "module_scope::gradients(...), which sums it");
    summed_grad_written(h);
  }
  void summed_grad_written(param_handle h) {
    if (!armed_) return;
    auto& left = pending_writers_[static_cast<std::size_t>(h.index)];
    if (--left == 0) hook_(h);
  }
  void disarm_grad_ready_hook() { armed_ = false; }

  // Allocates the flat buffers and initialises every weight. Idempotent; called on first use.
  void materialize() {
    if (materialized()) return;
    weights_ = buffer<T>(*ledger_, memory_category::parameters, static_cast<std::size_t>(total_));
    grads_ = buffer<T>(*ledger_, memory_category::gradients, static_cast<std::size_t>(total_));
    for (const auto& e : entries_) initialize(e);
  }
  bool materialized() const { return total_ > 0 && (!weights_.empty() || weights_released_); }

  // Where h's weights are read (and, in the serial case, updated): the flat buffer, or wherever
  // a weight source (ZeRO-3's gathered buckets) says.
  T* weights(param_handle h) {
    if (weight_source_) return weight_source_(h);
    return weights_data() + info(h).offset;
  }
  // Where backward adds h's gradient: the flat buffer, or wherever a gradient source (ZeRO-2's
  // per-bucket buffers) says.
  T* grads(param_handle h) {
    if (grad_source_) return grad_source_(h);
    return grads_data() + info(h).offset;
  }
  // Whether every weight stays where weights(h) points for as long as the store lives (no weight
  // source that gathers them on demand and lets them go: ZeRO-3 keeps a few buckets at a time).
  bool weights_resident() const { return !weight_source_; }
  T* weights_data() {
    materialize();
    STRATA_CHECK(!weights_released_,
                 "parameter_store: the flat weight buffer was released (parameters are "
                 "sharded, ZeRO-3); gather them from their owner");
    return weights_.data();
  }

  // h's weights copied to or from the host, wherever the store's memory space keeps them.
  void download_weights(param_handle h, std::span<T> out) {
    STRATA_CHECK(static_cast<std::int64_t>(out.size()) == info(h).numel, "parameter_store: '", info(h).name, "' has ",
                 info(h).numel, " elements, ", out.size(), " asked for");
    materialize();
    weights_.download(out.data(), out.size(), static_cast<std::size_t>(info(h).offset));
  }
  void upload_weights(param_handle h, std::span<const T> in) {
    STRATA_CHECK(static_cast<std::int64_t>(in.size()) == info(h).numel, "parameter_store: '", info(h).name, "' has ",
                 info(h).numel, " elements, ", in.size(), " given");
    materialize();
    weights_.upload(in.data(), in.size(), static_cast<std::size_t>(info(h).offset));
  }

  // ZeRO-3: weights are gathered on demand by someone else; the flat weight buffer is freed.
  void use_weight_source(std::function<T*(param_handle)> source) {
    materialize();
    weight_source_ = std::move(source);
    if (weight_source_) {
      weights_ = buffer<T>();
      weights_released_ = true;
    }
  }
  T* grads_data() {
    materialize();
    STRATA_CHECK(!grads_released_,
                 "parameter_store: the flat gradient buffer was released (gradients are "
                 "sharded, ZeRO-2); read them from their owner");
    return grads_.data();
  }

  // ZeRO-2: gradients live in buffers someone else owns; the flat gradient buffer is freed.
  void use_grad_source(std::function<T*(param_handle)> source) {
    materialize();
    grad_source_ = std::move(source);
    grads_ = buffer<T>();
    grads_released_ = true;
  }
  void zero_grads() {
    materialize();
    grads_.zero();
  }
  bool weights_released() const { return weights_released_; }

  const param_info& info(param_handle h) const {
    STRATA_CHECK(h.index >= 0 && h.index < static_cast<int>(entries_.size()),
                 "parameter_store: no parameter with index ", h.index);
    return entries_[static_cast<std::size_t>(h.index)];
  }
  const std::vector<param_info>& entries() const { return entries_; }
  std::int64_t size() const { return total_; }  // Ψ, the parameter count
  memory_ledger& ledger() const { return *ledger_; }
  strata::seed seed() const { return seed_; }

 private:
  void initialize(const param_info& e) {
    // Each element from its index in the full tensor: a shard starts as its piece of the serial
    // model's tensor; padding starts (and, having no gradient, stays) at zero.
    // Computed on the host, then copied to wherever the weights live.
    const std::uint64_t id = parameter_id(e.name);
    std::vector<T> w(static_cast<std::size_t>(e.numel));
    const bool whole = !e.shard.sharded() && e.shard.real_rows < 0;
    for (std::int64_t i = 0; i < e.numel; ++i) {
      if (!whole && e.shard.is_padding(i)) {
        w[static_cast<std::size_t>(i)] = convert<T>(0.0);
        continue;
      }
      const auto g = static_cast<std::uint64_t>(whole ? i : e.shard.global_index(i));
      w[static_cast<std::size_t>(i)] = convert<T>(initial_value(e.init, seed_.value, id, g));
    }
    weights_.upload(w.data(), w.size(), static_cast<std::size_t>(e.offset));
  }

  memory_ledger* ledger_;
  strata::seed seed_;
  std::vector<param_info> entries_;
  std::int64_t total_ = 0;
  buffer<T> weights_, grads_;
  std::function<void(param_handle)> hook_;
  std::function<T*(param_handle)> grad_source_, weight_source_;
  std::function<bool(tensor_gradient)> summed_;
  bool grads_released_ = false, weights_released_ = false;
  std::vector<int> pending_writers_;
  bool armed_ = false;
};

}  // namespace strata
