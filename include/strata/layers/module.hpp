// strata/layers/module.hpp - what a layer is handed when it is built.
//
// A model owns one model_context: the parameter store, scratch space and the memory ledger
// every buffer is charged to. Layers receive a module_scope - the same context plus a dotted
// name prefix - so each parameter gets a stable name ("blocks.3.mlp.fc.weight") that the
// initializer, checkpoints and exports all key on. Under tensor parallelism the context also
// holds the tensor-parallel group; every layer of the model shards over it.
#pragma once
#include <string>
#include <string_view>
#include <utility>

#include "strata/core/memory.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/layers/tensor_parallel.hpp"
#include "strata/policy/policy.hpp"

namespace strata {

template <class P>
class model_context {
 public:
  using T = typename P::storage;

  model_context(memory_ledger& ledger, strata::seed s, strata::tensor_parallel tp = {})
      : params_(ledger, s), workspace_(ledger), tp_(std::move(tp)) {}
  model_context(const model_context&) = delete;
  model_context& operator=(const model_context&) = delete;

  parameter_store<T>& params() { return params_; }
  strata::workspace& workspace() { return workspace_; }
  memory_ledger& ledger() { return params_.ledger(); }
  strata::tensor_parallel& tensor() { return tp_; }
  const strata::tensor_parallel& tensor() const { return tp_; }

  // While on, layers built in this context reuse parameters already registered under the same
  // names instead of registering new ones: a pipeline stage builds one copy of its layers per
  // micro-batch in flight (each keeps its own activations), all sharing one set of weights and
  // gradients.
  void share_parameters(bool on) { share_ = on; }
  bool sharing_parameters() const { return share_; }

 private:
  parameter_store<T> params_;
  strata::workspace workspace_;
  strata::tensor_parallel tp_;
  bool share_ = false;
};

template <class P>
class module_scope {
 public:
  using T = typename P::storage;

  module_scope(model_context<P>& ctx, std::string prefix = {}) : ctx_(&ctx), prefix_(std::move(prefix)) {}

  // A child scope: scope / "attn" names its parameters "<prefix>.attn.*".
  module_scope operator/(std::string_view child) const { return {*ctx_, qualify(child)}; }
  module_scope operator/(int index) const { return *this / std::string_view(std::to_string(index)); }

  std::string qualify(std::string_view leaf) const {
    return prefix_.empty() ? std::string(leaf) : prefix_ + "." + std::string(leaf);
  }
  param_handle add_parameter(std::string_view leaf, strata::shape shape, init_rule init, bool decay) {
    return add_parameter(leaf, tensor_shard{shape}, init, decay);
  }
  // This rank's piece of a tensor-parallel parameter (see tensor_shard).
  param_handle add_parameter(std::string_view leaf, tensor_shard shard, init_rule init, bool decay) {
    const std::string name = qualify(leaf);
    if (ctx_->sharing_parameters()) {
      const param_handle h = ctx_->params().find(name);
      if (h.valid()) {
        STRATA_CHECK(ctx_->params().info(h).shape == shard.local(), "module_scope: shared parameter '", name,
                     "' has shape ", ctx_->params().info(h).shape.str(), ", a copy asks for ", shard.local().str());
        return h;
      }
    }
    return ctx_->params().add(name, init, decay, shard);
  }

  model_context<P>& context() const { return *ctx_; }
  parameter_store<T>& params() const { return ctx_->params(); }
  strata::workspace& workspace() const { return ctx_->workspace(); }
  memory_ledger& ledger() const { return ctx_->ledger(); }
  strata::tensor_parallel& tensor() const { return ctx_->tensor(); }
  const std::string& prefix() const { return prefix_; }

 private:
  model_context<P>* ctx_;
  std::string prefix_;
};

// Makes `buf` hold exactly `count` elements of `category`, reallocating only on a change:
// activation buffers follow the batch shape without reallocating every step.
template <class U>
void ensure_size(buffer<U>& buf, memory_ledger& ledger, memory_category category, std::int64_t count) {
  if (static_cast<std::int64_t>(buf.size()) != count)
    buf = buffer<U>(ledger, category, static_cast<std::size_t>(count));
}

}  // namespace strata
