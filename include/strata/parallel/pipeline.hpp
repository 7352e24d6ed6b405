// strata/parallel/pipeline.hpp - runs a pipeline schedule on one stage.
//
// The executor walks this stage's action list (pipeline_schedule.hpp) once per step. Before an
// action it posts the receive that action needs and the one the next action needs, so a
// message arrives while the stage computes; it then waits for its input, computes, and sends
// its output asynchronously (activations to the next virtual stage, input gradients to the
// previous one). Each in-flight micro-batch keeps its own activations (the stage model holds one
// copy of its layers per micro-batch) and its received input, until its backward. Gradients
// accumulate in the stage's parameter store over the micro-batches; the optimizer steps once.
//
// What a stage model provides (the pipeline_stage concept; sequential_model is one):
//   using T = ...;                                       // the storage type
//   tensor_view<const T> pipeline_forward(int chunk, int microbatch, tensor_view<const T> input,
//       tensor_view<const int32_t> inputs, tensor_view<const int32_t> targets, double grad_scale, double& loss);
//       // input: the previous virtual stage's activation (empty on virtual stage 0, which reads
//       // `inputs`); returns this chunk's output, or sets `loss` on the last virtual stage
//   buffer<T> pipeline_backward(int chunk, int microbatch, const buffer<T>* output_grad);
//       // output_grad is null on the last virtual stage; returns the input's gradient (empty on
//       // virtual stage 0) and lets the micro-batch's activations go
//   strata::shape pipeline_activation_shape(std::int64_t sequences, std::int64_t seq) const;
//       // what flows between stages for `sequences` sequences of `seq` tokens
//
// Per step it records each stage's busy time (computing), idle time (waiting for messages: the
// bubble, plus transfer time not hidden) and the activation bytes it held after each forward,
// from which the number of micro-batches in flight follows.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/comm/group_ref.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/tensor.hpp"
#include "strata/parallel/pipeline_schedule.hpp"
#include "strata/parallel/pipeline_stage.hpp"

namespace strata {

struct pipeline_step_stats {
  double busy_seconds = 0, idle_seconds = 0;
  int peak_in_flight = 0;                 // chunk-micro-batches forwarded, not yet backwarded
  std::size_t peak_activation_bytes = 0;  // held by the step's micro-batches after a forward, at most
  std::size_t largest_chunk_bytes = 0;    // what one chunk-micro-batch holds (its input included), at most
};

template <class Stage>
class pipeline_executor {
 public:
  using T = typename Stage::T;

  // `pp`: the pipeline group, ranks = stages in order; `ledger`: the stage's memory books.
  pipeline_executor(Stage& stage, group_ref pp, pipeline_shape shape, memory_ledger& ledger)
      : stage_(&stage), pp_(std::move(pp)), shape_(shape), ledger_(&ledger) {
    static_assert(check_pipeline_stage<Stage>());
    shape_.validate();
    STRATA_CHECK(pp_.size() == shape_.stages, "pipeline: the pipeline group has ", pp_.size(),
                 " ranks but the schedule ", shape_.stages, " stages");
    STRATA_CHECK(2 * shape_.microbatches * shape_.virtual_stages() <= 32767, "pipeline: ", shape_.microbatches,
                 " micro-batches x ", shape_.virtual_stages(),
                 " virtual stages need more message tags than MPI promises");
    actions_ = pipeline_actions(shape_, pp_.rank());
  }

  const pipeline_shape& shape() const { return shape_; }
  const pipeline_step_stats& last_step() const { return stats_; }

  // One step over `microbatches` micro-batches of `rows` sequences each. Returns the sum of their
  // losses, the same on every stage.
  // inputs, targets: [microbatches·rows, T] token ids, micro-batch m at rows m·rows ...
  double run(tensor_view<const std::int32_t> inputs, tensor_view<const std::int32_t> targets, std::int64_t rows,
             int microbatches, double grad_scale) {
    STRATA_CHECK(microbatches == shape_.microbatches, "pipeline: the step has ", microbatches,
                 " micro-batches but the schedule was built for ", shape_.microbatches);
    const int M = shape_.microbatches, V = shape_.chunks, p = shape_.stages, s = pp_.rank();
    const int last_virtual = shape_.virtual_stages() - 1;
    STRATA_CHECK(inputs.shape.rank == 2 && inputs.shape[0] == M * rows && targets.shape == inputs.shape,
                 "pipeline: expected ", M, " x ", rows, " sequences of inputs and targets, got ", inputs.shape.str(),
                 " and ", targets.shape.str());
    const std::int64_t seq = inputs.shape[1];
    const strata::shape act_shape = stage_->pipeline_activation_shape(rows, seq);
    const auto slots = static_cast<std::size_t>(M * V);
    step_run st{.inputs = inputs,
                .targets = targets,
                .rows = rows,
                .seq = seq,
                .grad_scale = grad_scale,
                .stage = s,
                .last_virtual = last_virtual,
                .act_shape = act_shape,
                .act_count = static_cast<std::size_t>(act_shape.numel()),
                .received = std::vector<buffer<T>>(slots),
                .out_grads = std::vector<buffer<T>>(slots),
                .sent_grads = std::vector<buffer<T>>(slots),
                .input_recv = std::vector<comm_handle>(slots),
                .grad_recv = std::vector<comm_handle>(slots),
                .act_send = std::vector<comm_handle>(slots),
                .grad_send = std::vector<comm_handle>(slots),
                .posted = std::vector<bool>(actions_.size(), false),
                .posted_bytes = std::vector<std::size_t>(actions_.size() + 1, 0)};
    stats_ = {};
    st.base = ledger_->current(memory_category::activations);
    st.prev = (s + p - 1) % p;
    st.next = (s + 1) % p;

    for (std::size_t i = 0; i < actions_.size(); ++i) {
      collect_sent(st);
      post(st, i);
      post(st, i + 1);
      if (actions_[i].kind == pipeline_action::forward) run_forward(st, i);
      else run_backward(st, i);
    }
    const auto t0 = clock::now();
    for (auto& h : st.act_send) h.wait();
    for (auto& h : st.grad_send) h.wait();
    stats_.idle_seconds += seconds(t0, clock::now());
    // Only the last stage saw the losses; every stage reports them.
    pp_.all_reduce(std::span<double>(&st.loss_sum, 1));
    return st.loss_sum;
  }

 private:
  using clock = std::chrono::steady_clock;

  // One step's state between its actions: the step's tokens, the buffers and messages of each
  // (micro-batch, chunk) slot, which receives are posted, the activation bytes accounted and the
  // losses so far.
  struct step_run {
    tensor_view<const std::int32_t> inputs, targets;
    std::int64_t rows, seq;
    double grad_scale;
    int stage, last_virtual;
    strata::shape act_shape;
    std::size_t act_count;
    std::vector<buffer<T>> received, out_grads, sent_grads;
    std::vector<comm_handle> input_recv, grad_recv, act_send, grad_send;
    std::vector<bool> posted;
    std::vector<std::size_t> posted_bytes;
    int prev = 0, next = 0;  // the stages before and after this one
    int in_flight = 0;
    // Activation bytes the step's micro-batches hold: the ledger's, less the receive posted for
    // the next action (it belongs to that one) and input gradients still on their way out.
    std::size_t base = 0;
    std::size_t in_transit = 0;
    double loss_sum = 0;

    tensor_view<const std::int32_t> tokens_of(tensor_view<const std::int32_t> all, int m) const {
      return tensor_view<const std::int32_t>{all.data + std::int64_t(m) * rows * seq, {rows, seq}};
    }
  };

  std::size_t slot(int m, int c) const { return static_cast<std::size_t>(m * shape_.chunks + c); }
  int tag(int m, int v, bool grad) const { return (m * shape_.virtual_stages() + v) * 2 + (grad ? 1 : 0); }
  std::size_t held(const step_run& st, std::size_t i) const {
    return ledger_->current(memory_category::activations) - st.base - st.posted_bytes[i + 1] - st.in_transit;
  }

  // Posts the receive action i needs (none for virtual stage 0's forward or the last one's backward).
  void post(step_run& st, std::size_t i) {
    if (i >= actions_.size() || st.posted[i]) return;
    st.posted[i] = true;
    const auto& a = actions_[i];
    const int v = shape_.virtual_stage(st.stage, a.chunk);
    const auto k = slot(a.microbatch, a.chunk);
    if (a.kind == pipeline_action::forward && v > 0) {
      st.received[k] = buffer<T>(*ledger_, memory_category::activations, st.act_count);
      st.input_recv[k] = receive(st.received[k], st.prev, tag(a.microbatch, v, false));
      st.posted_bytes[i] = st.received[k].bytes();
    } else if (a.kind == pipeline_action::backward && v < st.last_virtual) {
      st.out_grads[k] = buffer<T>(*ledger_, memory_category::activations, st.act_count);
      st.grad_recv[k] = receive(st.out_grads[k], st.next, tag(a.microbatch, v, true));
      st.posted_bytes[i] = st.out_grads[k].bytes();
    }
  }
  // Input gradients whose sends have finished are let go.
  void collect_sent(step_run& st) {
    for (std::size_t k = 0; k < st.sent_grads.size(); ++k)
      if (!st.sent_grads[k].empty() && st.grad_send[k].test()) {
        st.in_transit -= st.sent_grads[k].bytes();
        st.sent_grads[k] = buffer<T>();
      }
  }

  // Action i, a forward: waits for its input, computes, sends the output on (or adds the loss on
  // the last virtual stage) and records the activation bytes it holds.
  void run_forward(step_run& st, std::size_t i) {
    const auto& a = actions_[i];
    const int v = shape_.virtual_stage(st.stage, a.chunk);
    const auto k = slot(a.microbatch, a.chunk);
    auto t0 = clock::now();
    st.input_recv[k].wait();
    auto t1 = clock::now();
    const std::size_t before = held(st, i) - st.posted_bytes[i];  // this forward's input counts as its own
    double loss = 0;
    auto out = stage_->pipeline_forward(
        a.chunk, a.microbatch,
        v > 0 ? tensor_view<const T>{st.received[k].data(), st.act_shape} : tensor_view<const T>{},
        st.tokens_of(st.inputs, a.microbatch), st.tokens_of(st.targets, a.microbatch), st.grad_scale, loss);
    auto t2 = clock::now();
    if (v == st.last_virtual) st.loss_sum += loss;
    else st.act_send[k] = send(out.data, st.act_count, st.next, tag(a.microbatch, v + 1, false));
    account(t0, t1, t2);
    ++st.in_flight;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, st.in_flight);
    const std::size_t now = held(st, i);
    stats_.largest_chunk_bytes = std::max(stats_.largest_chunk_bytes, now - before);
    stats_.peak_activation_bytes = std::max(stats_.peak_activation_bytes, now);
  }
  // Action i, a backward: waits for the output's gradient, computes, lets the micro-batch's
  // activations go and sends the input's gradient back.
  void run_backward(step_run& st, std::size_t i) {
    const auto& a = actions_[i];
    const int v = shape_.virtual_stage(st.stage, a.chunk);
    const auto k = slot(a.microbatch, a.chunk);
    auto t0 = clock::now();
    st.grad_recv[k].wait();
    st.act_send[k].wait();  // the layer's output buffer goes with its activations
    auto t1 = clock::now();
    buffer<T> input_grad =
        stage_->pipeline_backward(a.chunk, a.microbatch, v < st.last_virtual ? &st.out_grads[k] : nullptr);
    auto t2 = clock::now();
    st.out_grads[k] = buffer<T>();
    st.received[k] = buffer<T>();
    if (v > 0) {
      st.sent_grads[k] = std::move(input_grad);
      st.in_transit += st.sent_grads[k].bytes();
      st.grad_send[k] = send(st.sent_grads[k].data(), st.act_count, st.prev, tag(a.microbatch, v - 1, true));
    }
    account(t0, t1, t2);
    --st.in_flight;
  }

  static double seconds(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  }
  // t0: the action began, t1: its input had arrived, t2: its computation ended.
  void account(clock::time_point t0, clock::time_point t1, clock::time_point t2) {
    stats_.idle_seconds += seconds(t0, t1);
    stats_.busy_seconds += seconds(t1, t2);
  }
  // A message from this very stage to itself (one stage holding several chunks) is a copy, made
  // whichever of send and receive comes first; it stays in the run's memory space.
  comm_handle receive(buffer<T>& into, int peer, int tag) {
    if (peer != pp_.rank()) return pp_.recv_async(std::span<T>(into.data(), into.size()), peer, tag);
    for (auto it = local_.begin(); it != local_.end(); ++it)
      if (it->tag == tag && it->into == nullptr) {
        into.copy_within(it->data.data(), it->data.size());
        local_.erase(it);
        return {};
      }
    local_.push_back({tag, &into, {}});
    return {};
  }
  comm_handle send(const T* data, std::size_t count, int peer, int tag) {
    if (peer != pp_.rank()) return pp_.send_async(std::span<const T>(data, count), peer, tag);
    for (auto it = local_.begin(); it != local_.end(); ++it)
      if (it->tag == tag && it->into != nullptr) {
        it->into->copy_within(data, count);
        local_.erase(it);
        return {};
      }
    // Held as a message in transit: charged to communication, not to the step's activations.
    buffer<T> early(*ledger_, memory_category::communication, count);
    early.copy_within(data, count);
    local_.push_back({tag, nullptr, std::move(early)});
    return {};
  }

  struct local_message {
    int tag;
    buffer<T>* into;  // a posted receive, or
    buffer<T> data;   // a send that came first
  };
  Stage* stage_;
  group_ref pp_;
  pipeline_shape shape_;
  memory_ledger* ledger_;
  std::vector<pipeline_action> actions_;
  std::vector<local_message> local_;
  pipeline_step_stats stats_;
};

}  // namespace strata
