// Deliberately faulty kernels: the sanitize step runs each under its tool first, and trusts the tool
// only if it reports the fault. Each kernel has exactly one planted bug, named in its comment.
// Kernel names contain "kdactl_fault" so that a kernel-name filter can select them.
#include <cuda_runtime.h>
#include <string.h>

#include "faults.h"

namespace {

constexpr int kN = 64;          // elements in each global buffer
constexpr int kThreads = 128;   // threads of the oob launch: twice the buffer
constexpr int kRaceThreads = 256;

// memcheck: out has kN floats; threads kN..2kN-1 write past its end (out-of-bounds global write).
__global__ void kdactl_fault_oob(float* out) {
  const int i = threadIdx.x;
  out[i] = static_cast<float>(i);  // BUG: i runs to kThreads - 1 >= kN
}

// synccheck: only the even threads of each warp reach the barrier (divergent __syncthreads).
__global__ void kdactl_fault_barrier(float* out) {
  const int i = threadIdx.x;
  float v = static_cast<float>(i);
  if ((i & 1) == 0) {
    __syncthreads();  // BUG: the odd threads of the same warp never arrive
    v *= 2.0f;
  }
  out[i] = v;
}

// racecheck: each thread writes its shared slot and reads the slot one warp further on, with no
// __syncthreads in between (read-after-write hazard across warps on shared memory).
__global__ void kdactl_fault_race(float* out) {
  __shared__ float tile[kRaceThreads];
  const int i = threadIdx.x;
  tile[i] = static_cast<float>(i);
  // BUG: missing __syncthreads(); the other warp may not have written its slot yet
  out[i] = tile[(i + 32) % kRaceThreads];
}

// initcheck: in comes from cudaMalloc and is never written before this read (uninitialized read).
__global__ void kdactl_fault_uninit(const float* in, float* out) {
  const int i = threadIdx.x;
  out[i] = in[i] + 1.0f;  // BUG: in[i] was never initialized
}

int finish(cudaError_t launch, int* launched, void* a, void* b) {
  *launched = (launch == cudaSuccess) ? 1 : 0;
  cudaError_t sync = cudaDeviceSynchronize();
  cudaFree(a);
  if (b != nullptr) cudaFree(b);
  if (launch != cudaSuccess) return static_cast<int>(launch);
  return static_cast<int>(sync);
}

}  // namespace

extern "C" int kdactl_fault_run(const char* name, int* launched) {
  int ignored = 0;
  if (launched == nullptr) launched = &ignored;
  *launched = 0;
  if (name == nullptr) return -1;
  float* a = nullptr;
  float* b = nullptr;
  const size_t bytes = kN * sizeof(float);
  if (strcmp(name, "oob") == 0) {
    if (cudaMalloc(&a, bytes) != cudaSuccess) return static_cast<int>(cudaGetLastError());
    kdactl_fault_oob<<<1, kThreads>>>(a);
    return finish(cudaGetLastError(), launched, a, b);
  }
  if (strcmp(name, "barrier") == 0) {
    if (cudaMalloc(&a, kN * sizeof(float)) != cudaSuccess) return static_cast<int>(cudaGetLastError());
    kdactl_fault_barrier<<<1, kN>>>(a);
    return finish(cudaGetLastError(), launched, a, b);
  }
  if (strcmp(name, "race") == 0) {
    if (cudaMalloc(&a, kRaceThreads * sizeof(float)) != cudaSuccess) return static_cast<int>(cudaGetLastError());
    kdactl_fault_race<<<1, kRaceThreads>>>(a);
    return finish(cudaGetLastError(), launched, a, b);
  }
  if (strcmp(name, "uninit") == 0) {
    if (cudaMalloc(&a, bytes) != cudaSuccess) return static_cast<int>(cudaGetLastError());
    if (cudaMalloc(&b, bytes) != cudaSuccess) {
      cudaFree(a);
      return static_cast<int>(cudaGetLastError());
    }
    kdactl_fault_uninit<<<1, kN>>>(a, b);
    return finish(cudaGetLastError(), launched, a, b);
  }
  return -1;
}
