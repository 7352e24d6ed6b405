// strata/core/config.hpp - macros that let one header compile under g++ and nvcc alike.
#pragma once

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__
#else
#define STRATA_HD
#endif

// Small functions a vectorised loop calls per element (conversions): inlined whatever the
// compiler's heuristics say in a large translation unit, where a call would stop vectorisation.
// Under nvcc it is empty: nvcc inlines such device functions itself, and __forceinline__ would
// repeat the `inline` these declarations carry.
#if defined(__CUDACC__)
#define STRATA_ALWAYS_INLINE
#else
#define STRATA_ALWAYS_INLINE __attribute__((always_inline))
#endif

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
