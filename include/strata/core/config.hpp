// strata/core/config.hpp - macros that let one header compile under g++ and nvcc alike.
#pragma once

#if defined(__CUDACC__)
#define STRATA_HD __host__ __device__
#else
#define STRATA_HD
#endif

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
