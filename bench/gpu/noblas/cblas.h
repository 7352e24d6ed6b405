// bench/gpu/noblas/cblas.h - what strata's host GEMM header needs to compile where no BLAS is
// installed (the GPU machine scripts/gpu-check builds on). The layers include the host kernels
// beside the CUDA ones; a program whose policy is st::cuda never calls them, so only the names
// are declared: a call would fail to link, not run slowly.
#pragma once
enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 };
extern "C" {
void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int, int, float, const float*, int,
                 const float*, int, float, float*, int);
void cblas_dgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, int, int, int, double, const double*,
                 int, const double*, int, double, double*, int);
}
