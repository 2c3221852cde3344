// Shared by all kernel files: target guards and error plumbing. No torch headers.
#pragma once
#include <cuda_runtime.h>
#include "kdactl_api.h"

// Exactly one KDACTL_TARGET_* is defined by the build (kdactl.targets). KDACTL_EXPECTED_ARCH is the
// __CUDA_ARCH__ its device code must be compiled at; KDACTL_TARGET_NAME is reported to Python.
#if defined(KDACTL_TARGET_SM90A)
#define KDACTL_EXPECTED_ARCH 900
#define KDACTL_TARGET_NAME "sm_90a"
#elif defined(KDACTL_TARGET_SM100A)
#define KDACTL_EXPECTED_ARCH 1000
#define KDACTL_TARGET_NAME "sm_100a"
#elif defined(KDACTL_TARGET_SM100F)
#define KDACTL_EXPECTED_ARCH 1000
#define KDACTL_TARGET_NAME "sm_100f"
#elif defined(KDACTL_TARGET_SM120A)
#define KDACTL_EXPECTED_ARCH 1200
#define KDACTL_TARGET_NAME "sm_120a"
#elif defined(KDACTL_TARGET_SM120F)
#define KDACTL_EXPECTED_ARCH 1200
#define KDACTL_TARGET_NAME "sm_120f"
#elif defined(KDACTL_TARGET_SM80)
#define KDACTL_EXPECTED_ARCH 800
#define KDACTL_TARGET_NAME "sm_80"
#else
#error "kdactl: build with exactly one -DKDACTL_TARGET_* (see kdactl/targets.py)"
#endif

// Device-side guard: a kernel compiled for the wrong arch must fail loudly, never compute quietly.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ != KDACTL_EXPECTED_ARCH)
#define KDACTL_ARCH_MISMATCH 1
#endif

#define KDACTL_TRY(expr)                      \
  do {                                        \
    cudaError_t kdactl_err_ = (expr);         \
    if (kdactl_err_ != cudaSuccess) return (int)kdactl_err_; \
  } while (0)

// After a launch: report a bad configuration at once instead of at the next sync.
static inline int kdactl_launch_status() { return (int)cudaGetLastError(); }

// Workspace sizes of the routes that need one (0 for an unsupported shape); library.cu dispatches.
uint64_t kdactl_chunk_workspace_bytes(const kdactl_kda_args& a);
