// strata/layers/module.hpp - what a layer is handed when it is built.
//
// A model owns one model_context: the parameter store, scratch space and the memory ledger
// every buffer is charged to, the tensor-parallel group every layer of the model shards over,
// the context-parallel group whose ranks share each sequence, the expert group whose ranks share
// out a mixture's experts, the recomputation mode, and the
// auxiliary losses its layers add to the objective (layers/auxiliary_loss.hpp). Layers receive a
// module_scope - the same context plus a dotted name prefix, and the index of the block it is in -
// so each parameter gets a stable name ("h.3.mlp.fc.weight") that the initializer, checkpoints and
// exports all key on. A layer takes its tensor split from the scope (split()), never from its
// config: the policy and the launch decide it, in one place.
#pragma once
#include <string>
#include <string_view>
#include <utility>

#include "strata/comm/group_ref.hpp"
#include "strata/core/memory.hpp"
#include "strata/layers/auxiliary_loss.hpp"
#include "strata/layers/context_parallel.hpp"
#include "strata/layers/expert_dispatch.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/layers/tensor_gradients.hpp"
#include "strata/layers/tensor_parallel.hpp"
#include "strata/layers/tensor_split.hpp"
#include "strata/policy/policy.hpp"
#include "strata/policy/recompute.hpp"

namespace strata {

template <class P>
class model_context {
 public:
  using T = typename P::storage;

  model_context(memory_ledger& ledger, strata::seed s, strata::tensor_parallel tp = {},
                recompute_mode recompute = recompute_mode::none, strata::context_parallel cp = {},
                group_ref experts = {})
      : params_(ledger, s),
        workspace_(ledger),
        tp_(std::move(tp)),
        cp_(std::move(cp)),
        experts_(std::move(experts)),
        recompute_(recompute) {
    params_.set_tensor_sums([this](tensor_gradient g) { return tensor_group_sums(g, tp_.split()); });
  }
  model_context(const model_context&) = delete;
  model_context& operator=(const model_context&) = delete;

  parameter_store<T>& params() { return params_; }
  strata::workspace& workspace() { return workspace_; }
  memory_ledger& ledger() { return params_.ledger(); }
  strata::tensor_parallel& tensor() { return tp_; }
  const strata::tensor_parallel& tensor() const { return tp_; }
  // The context-parallel group (cp: the group's ranks hold chunks of the same sequences).
  strata::context_parallel& cp() { return cp_; }
  const strata::context_parallel& cp() const { return cp_; }
  // The expert group (ep: each rank holds 1/ep of every mixture's experts); a group of one
  // without expert parallelism.
  group_ref& experts() { return experts_; }
  // What this rank's MoE blocks sent to each expert under expert parallelism.
  expert_dispatch_log& dispatch_log() { return dispatch_; }
  // What recompute<recompute_from_context, L> does in this model.
  recompute_mode recompute() const { return recompute_; }
  // The terms layers add to the objective, and their statistics.
  auxiliary_losses& auxiliary() { return aux_; }
  // How many blocks the whole model has (every pipeline stage alike); 0 before the model says.
  std::int64_t block_count() const { return blocks_; }
  void set_block_count(std::int64_t n) { blocks_ = n; }

  // While on, layers built in this context reuse parameters already registered under the same
  // names instead of registering new ones: a pipeline stage builds one copy of its layers per
  // micro-batch in flight (each keeps its own activations), all sharing one set of weights and
  // gradients.
  void share_parameters(bool on) { share_ = on; }
  bool sharing_parameters() const { return share_; }

  // While on, a layer that uses a parameter another layer owns (a tied table) and does not find
  // it registers a replica of it: a pipeline stage holding the user but not the owner. Off, not
  // finding it is an error naming the parameter.
  void allow_tied_replicas(bool on) { replicas_ = on; }
  bool tied_replicas_allowed() const { return replicas_; }

 private:
  parameter_store<T> params_;
  strata::workspace workspace_;
  strata::tensor_parallel tp_;
  strata::context_parallel cp_;
  group_ref experts_;
  expert_dispatch_log dispatch_;
  recompute_mode recompute_;
  auxiliary_losses aux_;
  std::int64_t blocks_ = 0;
  bool share_ = false, replicas_ = false;
};

template <class P>
class module_scope {
 public:
  using T = typename P::storage;

  module_scope(model_context<P>& ctx, std::string prefix = {}) : ctx_(&ctx), prefix_(std::move(prefix)) {}

  // A child scope: scope / "attn" names its parameters "<prefix>.attn.*".
  module_scope operator/(std::string_view child) const {
    module_scope s{*ctx_, qualify(child)};
    s.block_ = block_;
    return s;
  }
  module_scope operator/(int index) const { return *this / std::string_view(std::to_string(index)); }
  // The same scope inside block `index` of the model's blocks (a stack numbers its copies so).
  module_scope in_block(std::int64_t index) const {
    module_scope s = *this;
    s.block_ = index;
    return s;
  }
  // The block this scope is in (its index in the whole model); -1 outside the blocks.
  std::int64_t block() const { return block_; }

  std::string qualify(std::string_view leaf) const {
    return prefix_.empty() ? std::string(leaf) : prefix_ + "." + std::string(leaf);
  }
  // A parameter whole on every rank of the tensor group, and what one rank's gradient of it is:
  // tensor_gradient::token_share for one computed from the tokens between regions (a norm's gain),
  // head_share from the heads inside a region (a per-head norm's), own from every token. The
  // library sums the shares (gradients(...)).
  param_handle add_parameter(std::string_view leaf, strata::shape shape, init_rule init, bool decay,
                             tensor_gradient gradient) {
    return add_parameter(leaf, tensor_shard{shape}, init, decay, gradient);
  }
  // This rank's piece of a tensor-parallel parameter (see tensor_shard), its gradient its own.
  param_handle add_parameter(std::string_view leaf, tensor_shard shard, init_rule init, bool decay,
                             tensor_gradient gradient = tensor_gradient::own) {
    const std::string name = qualify(leaf);
    if (ctx_->sharing_parameters()) {
      const param_handle h = ctx_->params().find(name);
      if (h.valid()) {
        STRATA_CHECK(ctx_->params().info(h).shape == shard.local(), "module_scope: shared parameter '", name,
                     "' has shape ", ctx_->params().info(h).shape.str(), ", a copy asks for ", shard.local().str());
        return h;
      }
    }
    return ctx_->params().add(name, init, decay, shard, gradient);
  }
  // A parameter another layer owns and registers under the absolute name `name` (a tied table):
  // its handle, with this layer counted as one more writer of its gradient. Where the owner is
  // not in this model (a pipeline stage without it), a replica is registered - same name, same
  // piece - that the assembled model keeps equal to the owner's.
  param_handle tied_parameter(std::string_view name, tensor_shard shard, init_rule init, bool decay) {
    auto& p = ctx_->params();
    param_handle h = p.find(name);
    if (!h.valid()) {
      STRATA_CHECK(ctx_->tied_replicas_allowed(), qualify_layer(), ": the tied parameter '", name,
                   "' is not registered; the layer that owns it must be built first");
      h = p.add(std::string(name), init, decay, shard);
      p.mark_replica(h);
      return h;
    }
    STRATA_CHECK(p.info(h).shape == shard.local(), qualify_layer(), ": the tied parameter '", name, "' has shape ",
                 p.info(h).shape.str(), ", this layer needs ", shard.local().str());
    // A copy built for another micro-batch of a pipeline stage writes the same gradient once.
    if (!ctx_->sharing_parameters() && !p.info(h).replica) p.add_writer(h);
    return h;
  }

  // Where this backward adds the gradients of `handles`, the tensor group's sums derived from
  // their registration (layers/tensor_gradients.hpp); the layer calls written() when done.
  template <class... Handles>
  gradient_targets<T, typename P::device, sizeof...(Handles)> gradients(Handles... handles) const {
    return {ctx_->params(), ctx_->tensor(), ctx_->ledger(), {handles...}};
  }

  // The tensor split this layer runs under.
  tensor_split split() const { return ctx_->tensor().split(); }
  // Fails, naming the layer and the numbers, when the tensor-parallel degree does not divide
  // one of `extents` (a layer's tensor_extents(config)).
  void check_tensor_extents(const tensor_extent_list& extents) const {
    const int t = ctx_->tensor().degree();
    if (const tensor_extent* e = extents.first_not_divided_by(t))
      fail(qualify_layer(), ": tensor parallelism tp=", t, " does not divide ", e->name(), " = ", e->extent,
           e->otherwise());
  }
  // The scope's name for messages ("h.3.attn"; "model" at the root).
  std::string qualify_layer() const { return prefix_.empty() ? std::string("model") : prefix_; }

  model_context<P>& context() const { return *ctx_; }
  parameter_store<T>& params() const { return ctx_->params(); }
  strata::workspace& workspace() const { return ctx_->workspace(); }
  memory_ledger& ledger() const { return ctx_->ledger(); }
  strata::tensor_parallel& tensor() const { return ctx_->tensor(); }
  strata::context_parallel& cp() const { return ctx_->cp(); }
  group_ref& experts() const { return ctx_->experts(); }
  const std::string& prefix() const { return prefix_; }

 private:
  model_context<P>* ctx_;
  std::string prefix_;
  std::int64_t block_ = -1;
};

// Makes `buf` hold exactly `count` elements of `category`, reallocating only on a change:
// activation buffers follow the batch shape without reallocating every step.
template <class U>
void ensure_size(buffer<U>& buf, memory_ledger& ledger, memory_category category, std::int64_t count) {
  if (static_cast<std::int64_t>(buf.size()) != count)
    buf = buffer<U>(ledger, category, static_cast<std::size_t>(count));
}

}  // namespace strata
