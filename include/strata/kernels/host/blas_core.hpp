// strata/kernels/host/blas_core.hpp - the host CBLAS, set up for this CPU and strata's threads
// before the first host GEMM: OpenBLAS (the default) or MKL (STRATA_HOST_BLAS_VENDOR=MKL in
// CMake, which defines STRATA_HOST_BLAS_MKL).
//
// OpenBLAS: its kernels for the CPU it actually runs on.
// An OpenBLAS built for many CPUs (Debian's DYNAMIC_ARCH library) picks its kernels once, when
// it loads, from the CPU's model number. A CPU newer than the library is not in its table and
// gets a generic core: OpenBLAS 0.3.21 meets a Sapphire Rapids as "Prescott" (SSE3), and its
// sgemm then runs at a quarter of the AVX-512 kernels' speed the CPU supports. Before the first
// host GEMM, strata compares the core OpenBLAS chose with the instruction sets the CPU reports
// and, when OpenBLAS fell back to a core without AVX2, selects the best one the CPU can run
// (Cooperlake with AVX-512 BF16, SkylakeX with AVX-512, Haswell with AVX2 and FMA) through
// OpenBLAS's own OPENBLAS_CORETYPE mechanism. Kernels of another core compute the same GEMM
// contract (fp32 accumulation); the rounding of a sum may differ, as between any two machines.
//
// Left alone: a core OpenBLAS recognised, a user's OPENBLAS_CORETYPE, STRATA_OPENBLAS_CORE=keep,
// an OpenBLAS without runtime core selection, and any other CBLAS.
//
// MKL: libmkl_rt picks its threading layer at its first call: Intel's OpenMP runtime (libiomp5)
// by default, GNU's where libgomp is already loaded (so measured with MKL 2025.0). strata's
// kernels run on the compiler's (GNU) runtime, and two runtimes with a thread per core each
// oversubscribe the machine, so strata selects the GNU layer itself before the first GEMM -
// unless the user set MKL_THREADING_LAYER. MKL's GEMMs then share strata's OpenMP threads, as
// OpenBLAS's do. Its results, like another OpenBLAS core's, may round differently from
// OpenBLAS's; at a fixed thread count they repeat from run to run (the whole suite passes on it).
#pragma once

// STRATA_HOST_BLAS: whether the host GEMM calls a CBLAS (kernels/host/gemm.hpp says more).
#ifndef STRATA_HOST_BLAS
#if defined(STRATA_HOST_BLAS_MKL) || __has_include(<cblas.h>)
#define STRATA_HOST_BLAS 1
#else
#define STRATA_HOST_BLAS 0
#endif
#endif

#if STRATA_HOST_BLAS && defined(STRATA_HOST_BLAS_MKL)
#include <mkl_cblas.h>
#include <mkl_service.h>
#elif STRATA_HOST_BLAS
#include <cblas.h>
#endif

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#if STRATA_HOST_BLAS && defined(OPENBLAS_VERSION) && defined(__x86_64__)
#define STRATA_OPENBLAS_CORE_SELECTION 1
// Exported by a DYNAMIC_ARCH OpenBLAS; weak, so a build without them links and skips this.
extern "C" void gotoblas_dynamic_init(void) __attribute__((weak));
extern "C" void gotoblas_dynamic_quit(void) __attribute__((weak));
#else
#define STRATA_OPENBLAS_CORE_SELECTION 0
#endif

namespace strata::kernels::blas_core {

struct choice {
  std::string detected;  // the core OpenBLAS chose itself ("" without OpenBLAS)
  std::string selected;  // the core strata selected instead ("" when it left OpenBLAS's choice)
};

namespace detail {
#if STRATA_OPENBLAS_CORE_SELECTION
// Cores of OpenBLAS's x86-64 table without AVX2: what an unrecognised CPU falls back to.
inline bool pre_avx2(const std::string& core) {
  for (const char* old : {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Atom", "Katmai",
                          "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona", "Bobcat", "Bulldozer"})
    if (core == old) return true;
  return false;
}
// The best core of OpenBLAS's table this CPU runs, "" when it has no AVX2.
inline const char* best_core() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512bf16")) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}
#endif

inline choice select() {
  choice c;
#if STRATA_HOST_BLAS && defined(STRATA_HOST_BLAS_MKL)
  if (!std::getenv("MKL_THREADING_LAYER")) mkl_set_threading_layer(MKL_THREADING_GNU);
#endif
#if STRATA_OPENBLAS_CORE_SELECTION
  c.detected = openblas_get_corename();
  const char* keep = std::getenv("STRATA_OPENBLAS_CORE");
  if (std::getenv("OPENBLAS_CORETYPE") || (keep && std::strcmp(keep, "keep") == 0)) return c;
  if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit || !pre_avx2(c.detected)) return c;
  const char* best = best_core();
  if (!*best) return c;
  // OpenBLAS reads OPENBLAS_CORETYPE when it initialises its kernel table: set it, re-initialise.
  ::setenv("OPENBLAS_CORETYPE", best, 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  c.selected = openblas_get_corename();
#endif
  return c;
}
}  // namespace detail

// Runs the set-up once per process (the first call; later calls return its result).
inline const choice& ensure_selected() {
  static std::once_flag once;
  static choice result;
  std::call_once(once, [] { result = detail::select(); });
  return result;
}

// Whether the host BLAS multiplies fp32 without AVX-512 on a CPU that has it: OpenBLAS on a core of
// its table without AVX-512 kernels, left there by the environment (OPENBLAS_CORETYPE=Haswell, set
// where OpenBLAS's AVX-512 kernels are not trusted on the CPU) or by its own detection.
// kernels/host/gemm.hpp then runs strata's own AVX-512 fp32 kernel on large products.
inline bool runs_without_avx512() {
#if STRATA_OPENBLAS_CORE_SELECTION
  const choice& c = ensure_selected();
  const std::string& core = c.selected.empty() ? c.detected : c.selected;
  __builtin_cpu_init();
  const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return cpu && core != "SkylakeX" && core != "Cooperlake" && core != "SapphireRapids";
#else
  return false;
#endif
}

// One line for a log: "OpenBLAS 0.3.21, core Cooperlake (selected by strata; OpenBLAS detected
// Prescott)", "OpenBLAS 0.3.21, core Haswell", "MKL 2025.0.0" or "" for another or no BLAS.
inline std::string describe() {
  const choice& c = ensure_selected();
#if STRATA_HOST_BLAS && defined(STRATA_HOST_BLAS_MKL)
  (void)c;
  MKLVersion v;
  mkl_get_version(&v);
  return "MKL " + std::to_string(v.MajorVersion) + "." + std::to_string(v.MinorVersion) + "." +
         std::to_string(v.UpdateVersion);
#elif STRATA_OPENBLAS_CORE_SELECTION
  std::string version = OPENBLAS_VERSION;
  while (!version.empty() && version.front() == ' ') version.erase(version.begin());
  while (!version.empty() && version.back() == ' ') version.pop_back();
  if (c.selected.empty()) return version + ", core " + c.detected;
  return version + ", core " + c.selected + " (selected by strata; OpenBLAS detected " + c.detected + ")";
#else
  (void)c;
  return {};
#endif
}

}  // namespace strata::kernels::blas_core
