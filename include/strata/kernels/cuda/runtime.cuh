// strata/kernels/cuda/runtime.cuh - what every CUDA kernel file needs around the kernels: the
// streams, events and checked calls of core/cuda_stream.cuh, launch and cuBLAS checks, the
// per-thread context (cuBLASLt handle and workspace, the device error record), NVTX ranges,
// device memory.
//
// Every CUDA kernel is enqueued on the calling thread's current stream, gpu::current_stream()
// (core/cuda_stream.cuh, where gpu::stream_scope sets it). Kernels never synchronize, except the
// few whose host signature returns a value (sum_of_squares, all_finite): they synchronize the
// current stream to return it.
//
// Errors. STRATA_CUDA_CHECK(call) (core/cuda_stream.cuh) throws strata::error naming the call,
// the CUDA error, the file and line. Every launch is followed by STRATA_CUDA_CHECK_LAUNCH(name);
// with the environment variable STRATA_CUDA_SYNC=1 that also synchronizes, so an asynchronous
// fault is reported at the kernel that caused it. Bad data a kernel finds (a token id out of
// range) is written to a device error record; gpu::check_device_errors() (also run by every
// synchronizing call) throws it on the host.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/cuda_stream.cuh"
#include "strata/core/error.hpp"
#include "strata/core/memory.hpp"
#include "strata/kernels/cuda/launch_config.hpp"

// Same for cuBLAS / cuBLASLt status codes.
#define STRATA_CUBLAS_CHECK(call) \
  STRATA_GPU_STATUS_CHECK(call, #call, CUBLAS_STATUS_SUCCESS, ::strata::gpu::detail::cublas_fail)

// After every <<<...>>>: the launch error (bad configuration, missing kernel image), and with
// STRATA_CUDA_SYNC=1 the kernel's own execution error.
#define STRATA_CUDA_CHECK_LAUNCH(name) ::strata::gpu::detail::check_launch(name, __FILE__, __LINE__)

namespace strata::gpu {

namespace detail {
[[noreturn]] inline void cublas_fail(cublasStatus_t s, const char* call, const char* file, int line) {
  fail("cuBLAS error ", int(s), " (", cublasLtGetStatusName(s), ": ", cublasLtGetStatusString(s), ") in `", call,
       "` at ", file, ":", line);
}
inline bool sync_after_launch() {
  static const bool on = [] {
    const char* v = std::getenv("STRATA_CUDA_SYNC");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return on;
}
inline void check_launch(const char* name, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess && sync_after_launch()) e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    fail("CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") launching ", name, " at ", file, ":",
         line);
}
}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Device-side error record: the first bad value a kernel met. Kernels write it with atomicCAS
// on `code` (an integer: which kernel wins is irrelevant, the record is for the message).
enum class device_error_code : int { none = 0, token_out_of_range = 1, target_out_of_range = 2, negative_token = 3 };
struct device_error_record {
  int code = 0;
  int pad = 0;
  long long position = 0;
  long long value = 0;
  long long limit = 0;
};

#if defined(__CUDACC__)
__device__ inline void record_device_error(device_error_record* rec, device_error_code code, long long position,
                                           long long value, long long limit) {
  if (rec == nullptr) return;
  if (atomicCAS(&rec->code, 0, int(code)) == 0) {
    rec->position = position;
    rec->value = value;
    rec->limit = limit;
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// What identifies a GEMM for the algorithm cache (types, shapes, leading dimensions, epilogue,
// operand alignments), as plain numbers.
struct gemm_key {
  std::array<std::int64_t, 16> v;
  bool operator<(const gemm_key& o) const { return v < o.v; }
};

// ---------------------------------------------------------------------------------------------
// The per-thread, per-device context: the thread's streams on the device (core/cuda_stream.cuh),
// cuBLASLt handle, one GEMM workspace per stream it has run on (a workspace must not be shared by
// GEMMs running concurrently), the device error record, and device properties the launchers need.
class context {
 public:
  explicit context(int device) : device_(device), streams_(&detail::this_thread_streams()) {
    STRATA_CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
    STRATA_CUBLAS_CHECK(cublasLtCreate(&lt_));
    STRATA_CUDA_CHECK(cudaMalloc(&errors_, sizeof(device_error_record)));
    STRATA_CUDA_CHECK(cudaMemsetAsync(errors_, 0, sizeof(device_error_record), streams_->own));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(streams_->own));
    // Keep freed stream-ordered scratch in the pool instead of returning it to the driver
    // every synchronisation: scratch (gpu::scratch) then costs no cudaMalloc after warm-up.
    cudaMemPool_t pool;
    STRATA_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    std::uint64_t threshold = UINT64_MAX;
    STRATA_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  }
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  ~context() {
    for (auto& w : workspaces_) cudaFree(w.second);
    if (errors_) cudaFree(errors_);
    if (lt_) cublasLtDestroy(lt_);
  }

  int device() const { return device_; }
  const cudaDeviceProp& properties() const { return props_; }
  // The thread's current stream on this context's device.
  cudaStream_t stream() const { return streams_->get(); }
  cublasLtHandle_t lt() const { return lt_; }
  device_error_record* errors() const { return errors_; }
  // fp32 GEMMs on TF32 tensor cores (faster, ~1e-3 relative error). Off by default.
  bool allow_tf32 = false;

  std::size_t gemm_workspace_bytes() const { return gpu::gemm_workspace_bytes(props_.major); }
  void* gemm_workspace(cudaStream_t s) {
    for (auto& w : workspaces_)
      if (w.first == s) return w.second;
    void* p = nullptr;
    STRATA_CUDA_CHECK(cudaMalloc(&p, gemm_workspace_bytes()));
    workspaces_.emplace_back(s, p);
    return p;
  }
  // Opt-in shared memory per block (227 KiB on sm_90).
  std::size_t smem_optin() const { return props_.sharedMemPerBlockOptin; }

  // cuBLASLt algorithms already chosen by its heuristic, per GEMM (kernels/cuda/gemm.cuh).
  const cublasLtMatmulAlgo_t* find_gemm_algo(const gemm_key& k) const {
    const auto it = gemm_algos_.find(k);
    return it == gemm_algos_.end() ? nullptr : &it->second;
  }
  const cublasLtMatmulAlgo_t* add_gemm_algo(const gemm_key& k, const cublasLtMatmulAlgo_t& a) {
    return &gemm_algos_.emplace(k, a).first->second;
  }

 private:
  int device_;
  detail::thread_streams* streams_;
  cudaDeviceProp props_{};
  cublasLtHandle_t lt_ = nullptr;
  device_error_record* errors_ = nullptr;
  std::vector<std::pair<cudaStream_t, void*>> workspaces_;
  std::map<gemm_key, cublasLtMatmulAlgo_t> gemm_algos_;
};

// The calling thread's context for its current CUDA device (created on first use).
inline context& this_context() {
  thread_local std::vector<std::unique_ptr<context>> contexts;
  int device = 0;
  STRATA_CUDA_CHECK(cudaGetDevice(&device));
  for (auto& c : contexts)
    if (c->device() == device) return *c;
  contexts.push_back(std::make_unique<context>(device));
  return *contexts.back();
}

// Throws the first error a kernel recorded since the last check (and clears it). Synchronizes
// the current stream.
inline void check_device_errors() {
  context& ctx = this_context();
  device_error_record rec;
  STRATA_CUDA_CHECK(cudaMemcpyAsync(&rec, ctx.errors(), sizeof rec, cudaMemcpyDeviceToHost, ctx.stream()));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  if (rec.code == int(device_error_code::none)) return;
  STRATA_CUDA_CHECK(cudaMemsetAsync(ctx.errors(), 0, sizeof rec, ctx.stream()));
  STRATA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  switch (device_error_code(rec.code)) {
    case device_error_code::token_out_of_range:
      fail("embedding: token id ", rec.value, " at position ", rec.position, " is out of range for vocab ", rec.limit);
    case device_error_code::negative_token:
      fail("embedding: token id ", rec.value, " at position ", rec.position, " is negative");
    case device_error_code::target_out_of_range:
      fail("cross_entropy: target ", rec.value, " at position ", rec.position, " is out of range for vocab ",
           rec.limit);
    default: fail("CUDA kernel reported error code ", rec.code);
  }
}

// Waits for the current stream, then reports recorded kernel errors.
inline void synchronize() { check_device_errors(); }

// ---------------------------------------------------------------------------------------------
// NVTX: a named range a profiler (nsys) shows on the timeline: { gpu::nvtx_range r("forward"); ... }
class nvtx_range {
 public:
  explicit nvtx_range(const char* name) { nvtxRangePushA(name); }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
  ~nvtx_range() { nvtxRangePop(); }
};

// ---------------------------------------------------------------------------------------------
// Device memory.

// An owning device array of T, zero-initialised, charged to a memory_ledger like buffer<T>
// (the ledger is optional: nullptr charges nothing).
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(memory_ledger* ledger, memory_category category, std::size_t count)
      : ledger_(ledger), category_(category), count_(count) {
    if (count_ == 0) return;
    STRATA_CUDA_CHECK(cudaMalloc(&data_, count_ * sizeof(T)));
    // Zeroed and complete before the constructor returns, whatever stream uses it next.
    const cudaStream_t s = current_stream();
    STRATA_CUDA_CHECK(cudaMemsetAsync(data_, 0, count_ * sizeof(T), s));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
    if (ledger_) ledger_->charge(category_, count_ * sizeof(T));
  }
  explicit device_buffer(std::size_t count) : device_buffer(nullptr, memory_category::workspace, count) {}
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept { swap(o); }
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      device_buffer tmp(std::move(o));
      swap(tmp);
    }
    return *this;
  }
  ~device_buffer() {
    if (data_) {
      if (ledger_) ledger_->release(category_, count_ * sizeof(T));
      cudaFree(data_);
    }
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  // Stream-ordered on the current stream.
  void zero() {
    if (data_) STRATA_CUDA_CHECK(cudaMemsetAsync(data_, 0, bytes(), current_stream()));
  }
  // Blocking copies, ordered after everything enqueued on the current stream (plain
  // cudaMemcpy would use the legacy stream, which does not wait for non-blocking streams).
  void upload(const T* host, std::size_t count) {
    STRATA_CHECK(count <= count_, "device_buffer::upload: ", count, " elements into ", count_);
    const cudaStream_t s = current_stream();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(data_, host, count * sizeof(T), cudaMemcpyHostToDevice, s));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  void download(T* host, std::size_t count) const {
    STRATA_CHECK(count <= count_, "device_buffer::download: ", count, " elements from ", count_);
    const cudaStream_t s = current_stream();
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host, data_, count * sizeof(T), cudaMemcpyDeviceToHost, s));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
  }

 private:
  void swap(device_buffer& o) noexcept {
    std::swap(ledger_, o.ledger_);
    std::swap(category_, o.category_);
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
  }
  memory_ledger* ledger_ = nullptr;
  memory_category category_ = memory_category::workspace;
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// The GPU's memory as a memory_space: a ledger made with it (memory_ledger ledger(
// gpu::device_memory())) puts every buffer charged to it - a model's parameters, gradients,
// optimizer state, activations - on the current device. Allocation and release are
// stream-ordered on the current stream from the device's pool (no driver call after warm-up,
// no device-wide synchronisation when a layer's temporary goes), so every kernel on that stream
// sees the memory in order; copies to the host wait for the stream, copies from it too (the
// host source may go as soon as the call returns).
inline const memory_space& device_memory() {
  static const memory_space space{
      "cuda",
      false,
      [](std::size_t bytes) -> void* {
        void* p = nullptr;
        const cudaStream_t s = current_stream();
        STRATA_CUDA_CHECK(cudaMallocAsync(&p, bytes, s));
        STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
        return p;
      },
      [](void* p) { cudaFreeAsync(p, current_stream()); },  // no throw: called from destructors
      [](void* p, std::size_t bytes) { STRATA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream())); },
      [](void* dst, const void* src, std::size_t bytes, copy_direction d) {
        const cudaStream_t s = current_stream();
        const cudaMemcpyKind kind = d == copy_direction::host_to_space   ? cudaMemcpyHostToDevice
                                    : d == copy_direction::space_to_host ? cudaMemcpyDeviceToHost
                                                                         : cudaMemcpyDeviceToDevice;
        STRATA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
        if (d != copy_direction::within_space) STRATA_CUDA_CHECK(cudaStreamSynchronize(s));
      },
      [](std::size_t bytes) -> void* {
        void* p = nullptr;
        STRATA_CUDA_CHECK(cudaMallocAsync(&p, bytes, current_stream()));
        return p;
      }};
  return space;
}

// Stream-ordered scratch for one launcher: allocated on the current stream, freed on it at
// scope exit (cudaMallocAsync / cudaFreeAsync from the device's pool), so it is safe however
// the kernels that use it are ordered on that stream.
template <class T>
class scratch {
 public:
  explicit scratch(std::size_t count) : stream_(current_stream()) {
    if (count > 0) STRATA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), count * sizeof(T), stream_));
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() {
    if (data_) cudaFreeAsync(data_, stream_);
  }
  T* get() const { return data_; }

 private:
  cudaStream_t stream_;
  T* data_ = nullptr;
};

// Enables `bytes` of dynamic shared memory for `kernel` when it needs more than the 48 KiB
// default. (A host-side driver call of about a microsecond; made before each such launch, so
// it is right for every device and thread.)
template <class Kernel>
inline void allow_dynamic_smem(Kernel* kernel, std::size_t bytes) {
  if (bytes <= 48 * 1024) return;
  STRATA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

}  // namespace strata::gpu
