// Positive controls for compute-sanitizer: deliberately faulty kernels, one per tool.
// Built as a library of their own (kdactl.jit.spec.faults_library_spec), never into libkdactl.so.
// No torch headers: nvcc alone compiles them.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Run the named fault ("oob", "barrier", "race", "uninit") on the current device: allocate its own
// buffers, launch, synchronize, free. *launched is 1 when the launch itself was accepted. Returns 0,
// a cudaError_t (a sanitizer may turn a caught fault into a launch failure), or -1 for an unknown name.
int kdactl_fault_run(const char* name, int* launched);

#ifdef __cplusplus
}
#endif
