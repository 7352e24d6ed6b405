// strata/parallel/gradient_synchronizer.hpp - what the trainer asks of whoever makes gradients
// and weights agree across ranks, and the synchronizer of a rank that trains alone.
//
// A synchronizer picks this rank's rows of a global batch, reduces gradients around each
// backward, writes the global gradient norm's square where the model lives (the same on every
// rank, never read back by the host: grad_sum_of_squares_into), says which pieces of the flat
// parameter buffer this rank's optimizer updates (and where their reduced gradients and, under
// ZeRO-3, their weights are), and shares the updated weights. data_parallel (data_parallel.hpp) is the one for any
// layout; no_sync is the one for a single rank. An optimizer is built from its synchronizer
// (adamw<P> opt(sync, {...})), and the trainer refuses a pair that disagrees, naming both.
#pragma once
#include <concepts>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/profile.hpp"
#include "strata/kernels/reduce.hpp"
#include "strata/layers/parameters.hpp"
#include "strata/parallel/dp_layout.hpp"

namespace strata {

template <class S>
concept has_batch_split = requires(const S& s, std::int64_t n) {
  { s.local_rows(n) } -> std::same_as<std::pair<std::int64_t, std::int64_t>>;
};
template <class S>
concept has_step_hooks = requires(S& s, bool last) {
  s.begin_step();
  s.after_forward();
  s.before_backward(last);
  s.after_backward(last);
  s.share_weights();
};
template <class S>
concept has_global_norm = requires(S& s, double v, double* in_space) {
  s.grad_sum_of_squares_into(in_space);
  { s.mean(v) } -> std::convertible_to<double>;
};
template <class S>
concept has_optimizer_share = requires(S& s, const S& cs) {
  { cs.optimizer_segments() } -> std::same_as<std::vector<owned_segment>>;
  { cs.optimizer_elements() } -> std::convertible_to<std::int64_t>;
  s.state_weights();
  s.state_gradients();
  s.parameters();
  { cs.description() } -> std::convertible_to<std::string>;
};

template <class S>
concept gradient_synchronizer = has_batch_split<S> && has_step_hooks<S> && has_global_norm<S> && has_optimizer_share<S>;

// One static_assert per group of members, naming them.
template <class S>
consteval bool check_gradient_synchronizer() {
  static_assert(has_batch_split<S>,
                "strata gradient synchronizer: missing `std::pair<int64_t, int64_t> "
                "local_rows(int64_t batch) const` (this rank's first row and row count)");
  static_assert(has_step_hooks<S>,
                "strata gradient synchronizer: missing one of begin_step(), after_forward(), "
                "before_backward(bool last), after_backward(bool last), share_weights()");
  static_assert(has_global_norm<S>,
                "strata gradient synchronizer: missing `void grad_sum_of_squares_into(double*)` "
                "or `double mean(double)`");
  static_assert(has_optimizer_share<S>,
                "strata gradient synchronizer: missing one of optimizer_segments(), "
                "optimizer_elements(), state_weights(), state_gradients(), parameters(), "
                "description()");
  return true;
}

// The synchronizer of a single rank: the whole batch, every parameter, nothing to reduce or share.
template <class P>
class no_sync {
 public:
  using T = typename P::storage;

  explicit no_sync(parameter_store<T>& params) : params_(&params) {}

  std::pair<std::int64_t, std::int64_t> local_rows(std::int64_t batch) const { return {0, batch}; }
  void begin_step() {}
  void after_forward() {}
  void before_backward(bool /*last*/) {}
  void after_backward(bool /*last*/) {}
  void grad_sum_of_squares_into(double* out) {
    STRATA_PROFILE("grad_norm");
    kernels::sum_of_squares_into(typename P::device{}, params_->grads_data(), params_->size(), out);
  }
  const T* state_gradients() const { return nullptr; }
  T* state_weights() { return nullptr; }
  void share_weights() {}
  double mean(double v) { return v; }
  void mean_each(std::span<double>) {}
  void sum_each(std::span<double>) {}

  std::vector<owned_segment> optimizer_segments() const { return whole_model_segments(*params_); }
  std::int64_t optimizer_elements() const { return params_->size(); }
  parameter_store<T>& parameters() const { return *params_; }
  std::string description() const { return "a single rank (every parameter, nothing shared)"; }

 private:
  parameter_store<T>* params_;
};

}  // namespace strata
