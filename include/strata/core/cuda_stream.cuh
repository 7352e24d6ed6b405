// strata/core/cuda_stream.cuh - the order GPU work runs in: checked CUDA runtime calls, streams
// and events, and each thread's current stream.
//
// In core because both sides of a GPU step enqueue on the current stream and may not include each
// other: the kernels (kernels/cuda/runtime.cuh builds the rest of their runtime on this) and the
// communication groups (comm/gpu_groups.cuh runs the tensor-parallel collectives on the compute
// stream and orders the data-parallel stream after it).
//
// Streams. strata's device tag strata::cuda is an empty type (layers pass `device{}`), so a
// kernel cannot be handed a stream through it. Every CUDA kernel is enqueued on the calling
// thread's *current stream*: gpu::current_stream(). By default that is a non-blocking stream
// made for the thread (one per device) on first use; a gpu::stream_scope sets another for its
// lifetime (and restores the previous one):
//
//   gpu::stream compute, comm;                         // non-blocking streams
//   { gpu::stream_scope on(compute);                   // kernels below go to `compute`
//     kernels::layernorm_forward(cuda{}, ...);
//     gpu::event grads_ready; grads_ready.record(compute);
//     grads_ready.wait(comm); /* NCCL on comm */ }
//
// Errors. STRATA_CUDA_CHECK(call) throws strata::error naming the call, the CUDA error, the file
// and line.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "strata/core/error.hpp"

// Runs `call`, a CUDA library call returning a status, and hands any status but `ok` to
// `on_failure(status, text, file, line)`, which throws; `text` is the call as written.
#define STRATA_GPU_STATUS_CHECK(call, text, ok, on_failure)                                   \
  do {                                                                                        \
    const auto strata_gpu_status_ = (call);                                                   \
    if (strata_gpu_status_ != (ok)) on_failure(strata_gpu_status_, text, __FILE__, __LINE__); \
  } while (0)

// Throws strata::error when a CUDA runtime call fails: "CUDA error cudaErrorX (text) in
// `call` at file:line".
#define STRATA_CUDA_CHECK(call) STRATA_GPU_STATUS_CHECK(call, #call, cudaSuccess, ::strata::gpu::detail::cuda_fail)

namespace strata::gpu {

namespace detail {
[[noreturn]] inline void cuda_fail(cudaError_t e, const char* call, const char* file, int line) {
  fail("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in `", call, "` at ", file, ":", line);
}

// The calling thread's streams on one device: the non-blocking stream made for it on first use,
// and the one a stream_scope set (null: none).
struct thread_streams {
  explicit thread_streams(int d) : device(d) {
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking));
  }
  thread_streams(const thread_streams&) = delete;
  thread_streams& operator=(const thread_streams&) = delete;
  ~thread_streams() {
    if (own) cudaStreamDestroy(own);
  }
  cudaStream_t get() const { return current ? current : own; }

  int device;
  cudaStream_t own = nullptr;
  cudaStream_t current = nullptr;
};

// The calling thread's streams for its current CUDA device (made on first use).
inline thread_streams& this_thread_streams() {
  thread_local std::vector<std::unique_ptr<thread_streams>> all;
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  for (auto& s : all)
    if (s->device == device) return *s;
  all.push_back(std::make_unique<thread_streams>(device));
  return *all.back();
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// RAII streams and events.
class stream {
 public:
  // A non-blocking stream (no implicit synchronisation with the legacy default stream).
  explicit stream(int priority = 0) {
    STRATA_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
  }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() {
    if (s_) cudaStreamDestroy(s_);
  }
  cudaStream_t get() const { return s_; }
  operator cudaStream_t() const { return s_; }
  void synchronize() const { STRATA_CUDA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

class event {
 public:
  // timing = false: a pure ordering event (cheaper).
  explicit event(bool timing = false) {
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() {
    if (e_) cudaEventDestroy(e_);
  }
  void record(cudaStream_t s) { STRATA_CUDA_CHECK(cudaEventRecord(e_, s)); }
  // Work enqueued on `s` after this call waits for the recorded point.
  void wait(cudaStream_t s) const { STRATA_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
  void synchronize() const { STRATA_CUDA_CHECK(cudaEventSynchronize(e_)); }
  // Milliseconds between two timing events.
  float since(const event& start) const {
    float ms = 0;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, e_));
    return ms;
  }
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// The calling thread's current stream on its current device.
inline cudaStream_t current_stream() { return detail::this_thread_streams().get(); }

// Sets the calling thread's current stream for this scope; restores the previous one after.
class stream_scope {
 public:
  explicit stream_scope(cudaStream_t s) : streams_(&detail::this_thread_streams()), previous_(streams_->current) {
    streams_->current = s;
  }
  stream_scope(const stream_scope&) = delete;
  stream_scope& operator=(const stream_scope&) = delete;
  ~stream_scope() { streams_->current = previous_; }

 private:
  detail::thread_streams* streams_;
  cudaStream_t previous_;
};

}  // namespace strata::gpu
