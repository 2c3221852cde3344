// kdactl kernel library: the C ABI that Python (ctypes) calls.
// No torch or Python headers here or in any kernel file: nvcc alone builds the library for any target.
// Every entry point returns 0 or a cudaError_t / kdactl error code, and takes the caller's stream.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KDACTL_ABI_VERSION 3

// kdactl's own error codes, above the cudaError_t range.
#define KDACTL_ERR_WRONG_DEVICE 10001   // device compute capability cannot run this build's target
#define KDACTL_ERR_BAD_ARGUMENT 10002   // the launcher rejected its arguments (Python validates first)
#define KDACTL_ERR_UNSUPPORTED 10003    // shape/config this build has no kernel for

int kdactl_abi_version(void);
// The target this library was compiled for, e.g. "sm_90a".
const char* kdactl_target_name(void);
// Message for a code returned by any entry point.
const char* kdactl_error_string(int code);
// 0 when the current device can run this build's code, else KDACTL_ERR_WRONG_DEVICE or a CUDA error.
int kdactl_check_device(void);

// The id of the CUDA graph capture under way on stream (0 when it is not capturing).
int kdactl_stream_capture_id(void* stream, unsigned long long* id);

// Device self-test: out[i] = kdactl_selftest_value(i, seed) for i < n, computed with integer ALU,
// warp shuffles and a shared-memory round trip. Python recomputes the expected values.
int kdactl_selftest(uint32_t* out, int n, uint32_t seed, void* stream);

// KDA prefill arguments shared by all routes. Layouts follow flash-linear-attention:
// q,k [B,T,H,K] bf16; v, o [B,T,H,V] bf16; g [B,T,H,K] fp32 or bf16; beta [B,T,H] fp32 or bf16;
// state [N,H,K,V] fp32. Varlen: B == 1 and cu_seqlens [N+1] gives the sequence bounds.
typedef struct {
  const void* q;
  const void* k;
  const void* v;
  const void* g;
  const void* beta;
  const float* initial_state;   // may be NULL (zero state)
  void* o;
  float* final_state;           // may be NULL (not wanted)
  const void* cu_seqlens;       // NULL for fixed-length batches; int32 or int64, [batch + 1]
  int64_t batch;                // B (fixed) or N (varlen: number of sequences)
  int64_t seqlen;               // T of the tensors (total tokens for varlen)
  int32_t heads;                // H
  int32_t key_dim;              // K
  int32_t value_dim;            // V
  int32_t g_is_bf16;            // 0: fp32 g, 1: bf16 g
  int32_t beta_is_bf16;         // 0: fp32 beta, 1: bf16 beta
  int32_t cu_seqlens_is_int32;  // 0: int64 cu_seqlens, 1: int32
  int32_t tuning;               // route-specific variant for benchmarks; 0 = the launcher's choice
  float scale;
  void* workspace;              // route scratch memory (kdactl_kda_workspace_bytes); may be NULL when 0
  uint64_t workspace_bytes;     // its size
  int32_t segment_chunks;       // route small_bh: chunks per segment (kdactl.kda.routes plans it)
} kdactl_kda_args;

// Scratch memory `route` ("direct", "chunk", ...) needs for these shapes (pointers are not read).
int kdactl_kda_workspace_bytes(const kdactl_kda_args* args, const char* route, uint64_t* bytes);

// Route "direct": token-serial recurrence, state on chip, V columns split across CTAs.
int kdactl_kda_direct(const kdactl_kda_args* args, void* stream);
// Route "chunk": the chunked WY/UT form on tensor cores (a prepare pass, then the state recurrence).
// K == V in {64, 128}; needs a workspace.
int kdactl_kda_chunk(const kdactl_kda_args* args, void* stream);
// Route "small_bh": the chunked kernels run on segments of each sequence at once, stitched by the
// segments' affine state maps. Fixed layout, K == V in {64, 128}, segment_chunks > 0; a workspace.
int kdactl_kda_small_bh(const kdactl_kda_args* args, void* stream);

#ifdef __cplusplus
}
#endif
