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

// The current device's facts a launch needs, read once per device and process (defined in
// library.cu): 0 and its SM count and opt-in shared memory per block when this build's code can
// run on it, else the code of kdactl_check_device.
int kdactl_device_facts(int* sms, int* smem_optin);

// cudaFuncSetAttribute(func, MaxDynamicSharedMemorySize, bytes) on the current device, once per
// (func, device, bytes) and process: a call costs microseconds, on every launch (library.cu).
int kdactl_set_smem_once(const void* func, int bytes);

// Every route launcher's first step: the bounds all routes share, then, unless the batch is empty,
// the device check, the device's SM count and opt-in shared memory per block (`smem_optin` may be
// NULL). 0 with *sms == 0 means an empty batch (nothing to do).
static inline int kdactl_launch_prologue(const kdactl_kda_args* a, int* sms, int* smem_optin = nullptr) {
  *sms = 0;
  if (a == nullptr) return KDACTL_ERR_BAD_ARGS;
  if (a->batch < 0 || a->batch > KDACTL_MAX_GRID_DIM) return KDACTL_ERR_BAD_BATCH;
  if (a->heads <= 0 || a->heads > KDACTL_MAX_GRID_DIM) return KDACTL_ERR_BAD_HEADS;
  if (a->seqlen < 0) return KDACTL_ERR_BAD_SEQLEN;
  if (a->qk_heads < 0 || (a->qk_heads > 0 && a->heads % a->qk_heads)) return KDACTL_ERR_BAD_QK_HEADS;
  if (a->beta_mode < KDACTL_BETA_AS_GIVEN || a->beta_mode > KDACTL_BETA_SIGMOID2) return KDACTL_ERR_BAD_BETA_MODE;
  if (a->gate_mode < KDACTL_GATE_AS_GIVEN || a->gate_mode > KDACTL_GATE_LOWER_BOUND ||
      (a->gate_mode == KDACTL_GATE_SOFTPLUS && a->A_log == nullptr) ||
      (a->gate_mode == KDACTL_GATE_LOWER_BOUND && !(a->lower_bound < 0.f)))  // a decay: the prepare relies on it
    return KDACTL_ERR_BAD_GATE_MODE;
  auto dtype_ok = [](int32_t d) { return d == KDACTL_DTYPE_FP32 || d == KDACTL_DTYPE_BF16 || d == KDACTL_DTYPE_FP16; };
  if (!dtype_ok(a->g_dtype) || !dtype_ok(a->beta_dtype) || (a->qkv_fp16 != 0 && a->qkv_fp16 != 1))
    return KDACTL_ERR_BAD_DTYPE;
  if ((a->varlen != 0 && a->varlen != 1) || (a->varlen == 1) != (a->cu_seqlens != nullptr))
    return KDACTL_ERR_BAD_VARLEN;
  if (a->checkpoints != nullptr &&
      (a->checkpoint_every <= 0 || a->checkpoint_every % KDACTL_CHUNK != 0 ||
       (a->checkpoint_dtype != KDACTL_DTYPE_FP32 && a->checkpoint_dtype != KDACTL_DTYPE_BF16)))
    return KDACTL_ERR_BAD_CHECKPOINTS;
  if (a->batch == 0) return 0;
  int optin = 0;
  return kdactl_device_facts(sms, smem_optin ? smem_optin : &optin);
}

// Every route's workspace size (0 when it needs none, or for a shape it has no kernel for), defined
// beside its launcher; library.cu's route table dispatches kdactl_kda_workspace_bytes to them.
#define KDACTL_DECLARE_WORKSPACE_BYTES(id, name) uint64_t kdactl_##name##_workspace_bytes(const kdactl_kda_args& a);
KDACTL_ROUTES(KDACTL_DECLARE_WORKSPACE_BYTES)
#undef KDACTL_DECLARE_WORKSPACE_BYTES
