// Library-wide entry points: ABI version, target name, error strings, device check.
#include <string.h>
#include "common.cuh"

extern "C" int kdactl_abi_version(void) { return KDACTL_ABI_VERSION; }

extern "C" const char* kdactl_target_name(void) { return KDACTL_TARGET_NAME; }

extern "C" const char* kdactl_error_string(int code) {
  switch (code) {
    case KDACTL_ERR_WRONG_DEVICE: return "device compute capability cannot run this build's target " KDACTL_TARGET_NAME;
    case KDACTL_ERR_BAD_ARGUMENT: return "kernel launcher rejected its arguments";
    case KDACTL_ERR_UNSUPPORTED: return "no kernel for this configuration in this build";
    default: return cudaGetErrorString((cudaError_t)code);
  }
}

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

extern "C" int kdactl_stream_capture_id(void* stream, unsigned long long* id) {
  if (id == nullptr) return KDACTL_ERR_BAD_ARGUMENT;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  KDACTL_TRY(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &capture));
  *id = (status == cudaStreamCaptureStatusActive) ? capture : 0ULL;
  return 0;
}

extern "C" int kdactl_kda_workspace_bytes(const kdactl_kda_args* args, const char* route, uint64_t* bytes) {
  if (args == nullptr || route == nullptr || bytes == nullptr) return KDACTL_ERR_BAD_ARGUMENT;
  if (strcmp(route, "direct") == 0) {
    *bytes = 0;
  } else if (strcmp(route, "chunk") == 0) {
    *bytes = kdactl_chunk_workspace_bytes(*args);
  } else if (strcmp(route, "small_bh") == 0) {
    *bytes = kdactl_small_bh_workspace_bytes(*args);
  } else {
    return KDACTL_ERR_BAD_ARGUMENT;
  }
  return 0;
}
