// kdactl kernel library: the C ABI that Python (ctypes) calls.
// No torch or Python headers here or in any kernel file: nvcc alone builds the library for any target.
// Every entry point returns 0 or a cudaError_t / kdactl error code, and takes the caller's stream.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KDACTL_ABI_VERSION 8

// Facts the Python side is built on: kdactl.kernel_abi holds each one under the name without the
// prefix, and the loader refuses a library whose values (kdactl_constant) differ.
#define KDACTL_MAX_GRID_DIM 65535      // heads, sequences and segment slots each map to grid y or z
#define KDACTL_CHUNK 16                // tokens per chunk of the chunked routes
#define KDACTL_SMALL_BH_CTAS_PER_SM 2  // small_bh's recurrence CTAs one SM holds: its plan fills one wave
#define KDACTL_SMALL_BH_MAX_UNSTITCHED 4  // small_bh stitches no sequence cut into at most this many segments

// The route table, X(id, name), ids 0, 1, ... in order; kdactl.kernel_abi.ROUTES lists the same
// (the loader compares them through kdactl_route_count / kdactl_route_name). Route `name` is launched
// by kdactl_kda_<name> (declared below) and sized by kdactl_<name>_workspace_bytes (common.cuh).
#define KDACTL_ROUTES(X)                                                                         \
  X(0, direct)   /* token-serial recurrence, state on chip, V columns split across CTAs */       \
  X(1, chunk)    /* chunked WY/UT form on tensor cores: a prepare pass, then the recurrence;  */ \
                 /* K == V in {64, 128}, needs a workspace */                                    \
  X(2, small_bh) /* the chunked kernels on segments of each sequence at once, stitched by the */ \
                 /* segments' affine state maps; fixed layout, K == V, segment_chunks > 0, a workspace */

// kdactl's own error codes, above the cudaError_t range.
enum {
  KDACTL_ERR_WRONG_DEVICE = 10001,  // device compute capability cannot run this build's target
  KDACTL_ERR_UNSUPPORTED = 10003,   // a configuration this build has no kernel for (grid size, shared memory)
  // Bad arguments, one code per argument (kdactl_error_argument names it, so that Python raises a
  // ValueError naming it). kdactl.kda.prefill validates first: these catch the C side disagreeing.
  KDACTL_ERR_BAD_ARGS = 10100,     // args is NULL
  KDACTL_ERR_BAD_OUT,              // the result pointer `out` is NULL
  KDACTL_ERR_BAD_COUNT,            // kdactl_selftest's n
  KDACTL_ERR_BAD_NAME,             // kdactl_constant's name
  KDACTL_ERR_BAD_ROUTE,            // a route id outside the route table
  KDACTL_ERR_BAD_BATCH,            // from here on: fields of kdactl_kda_args
  KDACTL_ERR_BAD_SEQLEN,
  KDACTL_ERR_BAD_HEADS,
  KDACTL_ERR_BAD_KEY_DIM,
  KDACTL_ERR_BAD_VALUE_DIM,
  KDACTL_ERR_BAD_CU_SEQLENS,
  KDACTL_ERR_BAD_TUNING,
  KDACTL_ERR_BAD_WORKSPACE,
  KDACTL_ERR_BAD_SEGMENT_CHUNKS,
  KDACTL_ERR_BAD_QK_HEADS,
  KDACTL_ERR_BAD_BETA_MODE,
  KDACTL_ERR_BAD_GATE_MODE,
  KDACTL_ERR_BAD_DTYPE,
  KDACTL_ERR_BAD_CHECKPOINTS,
  KDACTL_ERR_BAD_VARLEN,
  KDACTL_ERR_BAD_END  // one past the last bad-argument code (not a code)
};

int kdactl_abi_version(void);
// The target this library was compiled for, e.g. "sm_90a".
const char* kdactl_target_name(void);
// Message for a code returned by any entry point.
const char* kdactl_error_string(int code);
// The argument a KDACTL_ERR_BAD_* code names ("heads", "workspace", ...); NULL for any other code.
const char* kdactl_error_argument(int code);
// The value of KDACTL_<name>, for the facts above and ERR_WRONG_DEVICE (name without the prefix,
// e.g. "MAX_GRID_DIM"); KDACTL_ERR_BAD_NAME for any other name.
int kdactl_constant(const char* name, int64_t* out);
// The route table: its length, and the name of route `id` (NULL outside 0 .. count - 1).
int kdactl_route_count(void);
const char* kdactl_route_name(int id);
// 0 when the current device can run this build's code, else KDACTL_ERR_WRONG_DEVICE or a CUDA error.
int kdactl_check_device(void);

// The id of the CUDA graph capture under way on stream (0 when it is not capturing).
int kdactl_stream_capture_id(void* stream, unsigned long long* out);

// Device self-test: out[i] = kdactl_selftest_value(i, seed) for i < n, computed with integer ALU,
// warp shuffles and a shared-memory round trip. Python recomputes the expected values.
int kdactl_selftest(uint32_t* out, int n, uint32_t seed, void* stream);

// The input transforms fla's chunk_kda fuses, applied by every route where it loads its inputs.
enum {
  KDACTL_BETA_AS_GIVEN = 0,  // beta is used as given
  KDACTL_BETA_SIGMOID = 1,   // sigmoid(beta)
  KDACTL_BETA_SIGMOID2 = 2,  // 2 sigmoid(beta): negative eigenvalues allowed
};
enum {
  KDACTL_GATE_AS_GIVEN = 0,     // g is the log decay
  KDACTL_GATE_SOFTPLUS = 1,     // -exp(A_log[h]) softplus(g + dt_bias[h, key])
  KDACTL_GATE_LOWER_BOUND = 2,  // lower_bound sigmoid(exp(A_log[h]) (g + dt_bias[h, key])); no A_log: of g + dt_bias
};

// Element types of g and beta (q, k, v and o: bf16, or fp16 with qkv_fp16).
enum {
  KDACTL_DTYPE_FP32 = 0,
  KDACTL_DTYPE_BF16 = 1,
  KDACTL_DTYPE_FP16 = 2,
};

// KDA prefill arguments shared by all routes. Layouts follow flash-linear-attention:
// q,k [B,T,Hqk,K] (Hqk = qk_heads, dividing H); v, o [B,T,H,V], all four bf16 or all fp16;
// g [B,T,H,K] and beta [B,T,H] fp32, bf16 or fp16; state [N,H,K,V] fp32 ([N,H,V,K] with state_v_first).
// Varlen (varlen == 1): B == 1 and cu_seqlens [N+1] gives the sequence bounds.
typedef struct {
  const void* q;
  const void* k;
  const void* v;
  const void* g;
  const void* beta;
  const float* initial_state;   // may be NULL (zero state)
  void* o;
  float* final_state;           // may be NULL (not wanted)
  const void* cu_seqlens;       // varlen only (else NULL); int32 or int64, [batch + 1]
  int64_t batch;                // B (fixed) or N (varlen: number of sequences)
  int64_t seqlen;               // T of the tensors (total tokens for varlen)
  int32_t heads;                // H
  int32_t key_dim;              // K
  int32_t value_dim;            // V
  int32_t g_dtype;              // KDACTL_DTYPE_* of g
  int32_t beta_dtype;           // KDACTL_DTYPE_* of beta
  int32_t cu_seqlens_is_int32;  // 0: int64 cu_seqlens, 1: int32
  int32_t tuning_warps;         // forced by benchmarks (0: the launcher's choice): the chunked routes' recurrence
  int32_t tuning_stages;        //   warps a CTA (2, 4, 8) and chunks in flight (4, 8); chunk_builds names the shapes
  float scale;
  void* workspace;              // route scratch memory (kdactl_kda_workspace_bytes); may be NULL when 0
  uint64_t workspace_bytes;     // its size
  int32_t segment_chunks;       // route small_bh: chunks per segment (kdactl.kda.routes plans it)
  // Fused input transforms (fla's chunk_kda options); all zero: none.
  int32_t qk_heads;             // heads of q and k (0: heads); heads / qk_heads value heads share one (GVA)
  int32_t qk_l2norm;            // 1: every q and k row is used as x / sqrt(|x|^2 + 1e-6)
  int32_t beta_mode;            // KDACTL_BETA_*
  int32_t gate_mode;            // KDACTL_GATE_*
  const float* A_log;           // [heads] fp32; required by KDACTL_GATE_SOFTPLUS
  const float* dt_bias;         // [heads * key_dim] fp32, added to g by the gates; may be NULL
  float lower_bound;            // KDACTL_GATE_LOWER_BOUND: negative (a log decay)
  // Serving state pool: sequence n's state is slot state_indices[n] of initial_state and final_state
  // (one pool, updated in place; a negative index starts from zero and is not written). NULL: slot n.
  const int32_t* state_indices;
  int32_t qkv_fp16;             // 1: q, k, v and o are fp16 (0: bf16)
  int32_t state_v_first;        // 1: every state (initial, final, pool, checkpoints) is [V, K] per head
  // Prefix checkpoints: entry j of sequence n is its state before token j * checkpoint_every, for
  // j < ceil(len_n / checkpoint_every), at row base_n + j of checkpoints [rows, H, K, V] (V-first:
  // [rows, H, V, K]) with base_n = sum over m < n of ceil(len_m / checkpoint_every) (fla's layout of
  // return_intermediate_states). NULL: none.
  void* checkpoints;
  int32_t checkpoint_every;     // tokens, a positive multiple of KDACTL_CHUNK
  int32_t checkpoint_dtype;     // KDACTL_DTYPE_FP32 or KDACTL_DTYPE_BF16
  // The layout: 1 packs the sequences along T with their bounds in cu_seqlens, 0 is B fixed-length
  // sequences. Workspace sizes depend on it and read no pointer; a launch needs cu_seqlens exactly
  // when it is 1.
  int32_t varlen;
} kdactl_kda_args;

// Scratch bytes route `route` (an id of KDACTL_ROUTES) needs for these shapes (pointers are not read).
int kdactl_kda_workspace_bytes(const kdactl_kda_args* args, int route, uint64_t* out);

// Each route's launcher: checks what Python cannot see, then launches on the caller's stream.
#define KDACTL_DECLARE_LAUNCHER(id, name) int kdactl_kda_##name(const kdactl_kda_args* args, void* stream);
KDACTL_ROUTES(KDACTL_DECLARE_LAUNCHER)
#undef KDACTL_DECLARE_LAUNCHER

#ifdef __cplusplus
}
#endif
