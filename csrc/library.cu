// Library-wide entry points: ABI version, target name, error strings, the tables Python checks at
// load time (routes, constants), device check, capture id, and route workspace sizes.
#include <string.h>
#include <atomic>
#include <mutex>
#include <vector>
#include "common.cuh"

namespace {

#define KDACTL_STR_(x) #x
#define KDACTL_STR(x) KDACTL_STR_(x)

struct Route {
  int id;
  const char* name;
  uint64_t (*workspace_bytes)(const kdactl_kda_args&);
};
#define KDACTL_ROUTE_ENTRY(id, name) {id, #name, kdactl_##name##_workspace_bytes},
constexpr Route kRoutes[] = {KDACTL_ROUTES(KDACTL_ROUTE_ENTRY)};
constexpr int kRouteCount = sizeof(kRoutes) / sizeof(kRoutes[0]);

constexpr bool route_ids_are_indices() {
  for (int i = 0; i < kRouteCount; ++i)
    if (kRoutes[i].id != i) return false;
  return true;
}
static_assert(route_ids_are_indices(), "KDACTL_ROUTES: ids must be 0, 1, 2, ... in order (Python indexes by id)");

struct Constant {
  const char* name;
  int64_t value;
};
#define KDACTL_CONSTANT(name) {#name, KDACTL_##name}
constexpr Constant kConstants[] = {
    KDACTL_CONSTANT(MAX_GRID_DIM),
    KDACTL_CONSTANT(CHUNK),
    KDACTL_CONSTANT(SMALL_BH_CTAS_PER_SM),
    KDACTL_CONSTANT(SMALL_BH_MAX_UNSTITCHED),
    KDACTL_CONSTANT(ERR_WRONG_DEVICE),  // the error codes Python tells apart by their values
    KDACTL_CONSTANT(ERR_UNSUPPORTED),
    KDACTL_CONSTANT(BETA_SIGMOID),
    KDACTL_CONSTANT(BETA_SIGMOID2),
    KDACTL_CONSTANT(GATE_SOFTPLUS),
    KDACTL_CONSTANT(GATE_LOWER_BOUND),
    KDACTL_CONSTANT(DTYPE_BF16),
    KDACTL_CONSTANT(DTYPE_FP16),
};

// One entry per bad-argument code, in code order from KDACTL_ERR_BAD_ARGS.
struct ArgumentError {
  int code;
  const char* argument;
  const char* message;
};
constexpr ArgumentError kArgumentErrors[] = {
    {KDACTL_ERR_BAD_ARGS, "args", "args is NULL"},
    {KDACTL_ERR_BAD_OUT, "out", "the result pointer out is NULL"},
    {KDACTL_ERR_BAD_COUNT, "n", "n must be positive"},
    {KDACTL_ERR_BAD_NAME, "name", "name is no constant of this library"},
    {KDACTL_ERR_BAD_ROUTE, "route", "route is no id of this library's route table"},
    {KDACTL_ERR_BAD_BATCH, "batch", "batch must be in 0.." KDACTL_STR(KDACTL_MAX_GRID_DIM)},
    {KDACTL_ERR_BAD_SEQLEN, "seqlen", "seqlen must be >= 0, and > 0 for a segmented route"},
    {KDACTL_ERR_BAD_HEADS, "heads", "heads must be in 1.." KDACTL_STR(KDACTL_MAX_GRID_DIM)},
    {KDACTL_ERR_BAD_KEY_DIM, "key_dim", "key_dim has no kernel in this route"},
    {KDACTL_ERR_BAD_VALUE_DIM, "value_dim", "value_dim has no kernel in this route"},
    {KDACTL_ERR_BAD_CU_SEQLENS, "cu_seqlens", "this route takes the fixed-length layout: varlen must be 0 and cu_seqlens NULL"},
    {KDACTL_ERR_BAD_TUNING, "tuning", "tuning_warps and tuning_stages name no kernel this route builds"},
    {KDACTL_ERR_BAD_WORKSPACE, "workspace", "workspace is NULL or smaller than kdactl_kda_workspace_bytes"},
    {KDACTL_ERR_BAD_SEGMENT_CHUNKS, "segment_chunks",
     "segment_chunks must be positive and cut at most " KDACTL_STR(KDACTL_MAX_GRID_DIM) " reduction slots"},
    {KDACTL_ERR_BAD_QK_HEADS, "qk_heads", "qk_heads must be 0 or divide heads"},
    {KDACTL_ERR_BAD_BETA_MODE, "beta_mode", "beta_mode must be one of KDACTL_BETA_*"},
    {KDACTL_ERR_BAD_GATE_MODE, "gate_mode",
     "gate_mode must be one of KDACTL_GATE_*, with A_log for the softplus gate and a negative lower_bound for the "
     "lower-bound one"},
    {KDACTL_ERR_BAD_DTYPE, "dtype", "g_dtype and beta_dtype must be KDACTL_DTYPE_*, qkv_fp16 0 or 1"},
    {KDACTL_ERR_BAD_CHECKPOINTS, "checkpoints",
     "checkpoint_every must be a positive multiple of KDACTL_CHUNK and checkpoint_dtype fp32 or bf16"},
    {KDACTL_ERR_BAD_VARLEN, "varlen", "varlen must be 0 or 1, and cu_seqlens non-NULL exactly when it is 1"},
};
constexpr int kArgumentErrorCount = sizeof(kArgumentErrors) / sizeof(kArgumentErrors[0]);

constexpr bool argument_errors_in_code_order() {
  for (int i = 0; i < kArgumentErrorCount; ++i)
    if (kArgumentErrors[i].code != KDACTL_ERR_BAD_ARGS + i) return false;
  return kArgumentErrorCount == KDACTL_ERR_BAD_END - KDACTL_ERR_BAD_ARGS;
}
static_assert(argument_errors_in_code_order(), "kArgumentErrors: one entry per KDACTL_ERR_BAD_* code, in order");

const ArgumentError* argument_error_of(int code) {
  const int i = code - KDACTL_ERR_BAD_ARGS;
  return (i >= 0 && i < kArgumentErrorCount) ? &kArgumentErrors[i] : nullptr;
}

}  // namespace

extern "C" int kdactl_abi_version(void) { return KDACTL_ABI_VERSION; }

extern "C" const char* kdactl_target_name(void) { return KDACTL_TARGET_NAME; }

extern "C" const char* kdactl_error_string(int code) {
  if (const ArgumentError* e = argument_error_of(code)) return e->message;
  switch (code) {
    case KDACTL_ERR_WRONG_DEVICE: return "device compute capability cannot run this build's target " KDACTL_TARGET_NAME;
    case KDACTL_ERR_UNSUPPORTED: return "no kernel for this configuration in this build";
    default: return cudaGetErrorString((cudaError_t)code);
  }
}

extern "C" const char* kdactl_error_argument(int code) {
  const ArgumentError* e = argument_error_of(code);
  return e ? e->argument : nullptr;
}

extern "C" int kdactl_constant(const char* name, int64_t* out) {
  if (out == nullptr) return KDACTL_ERR_BAD_OUT;
  for (const Constant& c : kConstants) {
    if (name != nullptr && strcmp(name, c.name) == 0) {
      *out = c.value;
      return 0;
    }
  }
  return KDACTL_ERR_BAD_NAME;
}

extern "C" int kdactl_route_count(void) { return kRouteCount; }

extern "C" const char* kdactl_route_name(int id) { return (id >= 0 && id < kRouteCount) ? kRoutes[id].name : nullptr; }

extern "C" int kdactl_check_device(void) {
  int dev = 0, major = 0, minor = 0;
  KDACTL_TRY(cudaGetDevice(&dev));
  KDACTL_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  KDACTL_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const int cc = major * 10 + minor;
#if KDACTL_EXPECTED_ARCH == 800
  const bool ok = (cc == 80 || cc == 86 || cc == 89);
#elif defined(KDACTL_TARGET_SM100F)
  const bool ok = (cc == 100 || cc == 103);
#else
  const bool ok = (cc * 10 == KDACTL_EXPECTED_ARCH);
#endif
  return ok ? 0 : KDACTL_ERR_WRONG_DEVICE;
}

namespace {
constexpr int kMaxDevices = 64;
struct DeviceFacts {
  std::atomic<int> known{0};  // 1 once sms and optin hold the device's values
  int sms = 0, optin = 0;
};
DeviceFacts g_device_facts[kMaxDevices];
}  // namespace

// A launch needs these facts, five runtime calls' worth, which do not change while the process runs:
// asked once per device. Two threads may both fill an entry: with the same values, published by the
// release store.
int kdactl_device_facts(int* sms, int* smem_optin) {
  int dev = 0;
  KDACTL_TRY(cudaGetDevice(&dev));
  DeviceFacts* f = (dev >= 0 && dev < kMaxDevices) ? &g_device_facts[dev] : nullptr;
  if (f == nullptr || f->known.load(std::memory_order_acquire) == 0) {
    if (int rc = kdactl_check_device()) return rc;
    int s = 0, o = 0;
    KDACTL_TRY(cudaDeviceGetAttribute(&s, cudaDevAttrMultiProcessorCount, dev));
    KDACTL_TRY(cudaDeviceGetAttribute(&o, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (f == nullptr) {
      *sms = s, *smem_optin = o;
      return 0;
    }
    f->sms = s, f->optin = o;
    f->known.store(1, std::memory_order_release);
  }
  *sms = f->sms, *smem_optin = f->optin;
  return 0;
}

int kdactl_set_smem_once(const void* func, int bytes) {
  struct Done {
    const void* func;
    int dev, bytes;
  };
  static std::mutex lock;
  static std::vector<Done> done;  // a few dozen kernel variants at most
  int dev = 0;
  KDACTL_TRY(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> hold(lock);
  for (const Done& d : done)
    if (d.func == func && d.dev == dev && d.bytes >= bytes) return 0;
  KDACTL_TRY(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  done.push_back({func, dev, bytes});
  return 0;
}

extern "C" int kdactl_stream_capture_id(void* stream, unsigned long long* out) {
  if (out == nullptr) return KDACTL_ERR_BAD_OUT;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  KDACTL_TRY(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &capture));
  *out = (status == cudaStreamCaptureStatusActive) ? capture : 0ULL;
  return 0;
}

extern "C" int kdactl_kda_workspace_bytes(const kdactl_kda_args* args, int route, uint64_t* out) {
  if (args == nullptr) return KDACTL_ERR_BAD_ARGS;
  if (out == nullptr) return KDACTL_ERR_BAD_OUT;
  if (route < 0 || route >= kRouteCount) return KDACTL_ERR_BAD_ROUTE;
  *out = kRoutes[route].workspace_bytes(*args);
  return 0;
}
