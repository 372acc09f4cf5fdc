// TANDEM_HOST_DEVICE marks an inline function that both the host's compilers and nvcc (the
// cuda backend's kernels) compile: the formulas one op's backends share.
#pragma once

#ifdef __CUDACC__
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif
