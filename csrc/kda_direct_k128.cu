// Route "direct"'s kernels at K = 128 (kda_direct_launch.cuh).
#include "kda_direct_launch.cuh"

template int kdactl::direct::launch_k<128>(const kdactl_kda_args&, int, cudaStream_t);
