// strata/kernels/host/instantiation.hpp - the host kernels compiled once, for programs that ask.
//
// A host kernel is a template on its storage type, so every translation unit that calls one
// compiles it again, at the optimisation level of that file; with vectorised loops that is a
// large share of a test's or a trainer's compile time. A program may compile them once instead:
//   - one translation unit per storage type defines STRATA_HOST_KERNELS_DEFINE_<type> (float,
//     double, bf16 or fp16) and includes <strata/kernels/all.hpp>: it holds the explicit
//     instantiation definitions of every host kernel for that type (CMake's strata::host_kernels
//     builds the four, optimised, from lib/host_kernels.cpp);
//   - every other translation unit defines STRATA_HOST_KERNELS_COMPILED: the same instantiations
//     are declared `extern template` there, so those files call the kernels without compiling them.
// With neither defined, the lines below declare nothing and each file instantiates what it calls.
//
// Each host kernel header ends by naming its kernels: STRATA_HOST_KERNEL(name) for a kernel whose
// one template parameter is the storage type, STRATA_HOST_KERNEL_AS(type, declaration) for the
// others. A kernel left out is still correct, only compiled where it is called.
#pragma once

#if defined(STRATA_HOST_KERNELS_DEFINE_float)
#define STRATA_HOST_KERNELS_float_(...) template __VA_ARGS__;
#elif defined(STRATA_HOST_KERNELS_COMPILED)
#define STRATA_HOST_KERNELS_float_(...) extern template __VA_ARGS__;
#else
#define STRATA_HOST_KERNELS_float_(...)
#endif

#if defined(STRATA_HOST_KERNELS_DEFINE_double)
#define STRATA_HOST_KERNELS_double_(...) template __VA_ARGS__;
#elif defined(STRATA_HOST_KERNELS_COMPILED)
#define STRATA_HOST_KERNELS_double_(...) extern template __VA_ARGS__;
#else
#define STRATA_HOST_KERNELS_double_(...)
#endif

#if defined(STRATA_HOST_KERNELS_DEFINE_bf16)
#define STRATA_HOST_KERNELS_bf16_(...) template __VA_ARGS__;
#elif defined(STRATA_HOST_KERNELS_COMPILED)
#define STRATA_HOST_KERNELS_bf16_(...) extern template __VA_ARGS__;
#else
#define STRATA_HOST_KERNELS_bf16_(...)
#endif

#if defined(STRATA_HOST_KERNELS_DEFINE_fp16)
#define STRATA_HOST_KERNELS_fp16_(...) template __VA_ARGS__;
#elif defined(STRATA_HOST_KERNELS_COMPILED)
#define STRATA_HOST_KERNELS_fp16_(...) extern template __VA_ARGS__;
#else
#define STRATA_HOST_KERNELS_fp16_(...)
#endif

// One instantiation of the storage type `type` (float, double, bf16 or fp16, spelled so).
#define STRATA_HOST_KERNEL_AS(type, ...) STRATA_HOST_KERNELS_##type##_(__VA_ARGS__)

// A kernel template<class T> over the storage type, for each of the four. The kernel is named
// before any other device's overload is declared (each host header ends with these lines), so
// the name picks one template.
#define STRATA_HOST_KERNEL(kernel)                                       \
  STRATA_HOST_KERNEL_AS(float, decltype(kernel<float>) kernel<float>)    \
  STRATA_HOST_KERNEL_AS(double, decltype(kernel<double>) kernel<double>) \
  STRATA_HOST_KERNEL_AS(bf16, decltype(kernel<bf16>) kernel<bf16>)       \
  STRATA_HOST_KERNEL_AS(fp16, decltype(kernel<fp16>) kernel<fp16>)
