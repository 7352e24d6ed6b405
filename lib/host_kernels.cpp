// One storage type's host kernels, compiled once (kernels/host/instantiation.hpp): CMake builds
// this file four times, with STRATA_HOST_KERNELS_DEFINE_float, _double, _bf16 and _fp16, into
// the library strata::host_kernels.
#include <strata/kernels/all.hpp>
