// hip_host_emu.h -- runs dsv41c's emitted HIP kernels on the host CPU, for numeric tests
// where no AMD GPU exists. Compile the kernel source as C++20 with -DDSV41C_HIP_HOST_EMU:
//
//   g++ -std=c++20 -pthread -DDSV41C_HIP_HOST_EMU -I codegen/hip -x c++ kernel.hip driver.cpp
//
// hipLaunchKernelGGL runs every workgroup in turn; inside one, each work-item is a
// std::thread, __syncthreads is a std::barrier, and the dynamic LDS is a heap buffer of
// exactly the launch's `lds_bytes` (so AddressSanitizer catches a kernel that reads past
// the LDS its launcher sized). Slow, and only for small shapes: it checks semantics
// (indexing, decoding, LDS sizing, masking), not performance or wave-level behaviour.
#ifndef DSV41C_HIP_HOST_EMU_H
#define DSV41C_HIP_HOST_EMU_H

#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef struct ihipStream_t* hipStream_t;
typedef enum hipError_t { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorLaunchFailure = 719 } hipError_t;

namespace dsv41c_emu {
inline thread_local dim3 thread_idx, block_idx;
inline thread_local unsigned char* lds = nullptr;
inline thread_local std::barrier<>* bar = nullptr;
inline dim3 block_dim, grid_dim;
inline hipError_t last_error = hipSuccess;

template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, dim3 block, size_t lds_bytes, Args... args) {
  block_dim = block;
  grid_dim = grid;
  const unsigned n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::vector<unsigned char> shared(lds_bytes ? lds_bytes : 1);
        std::barrier<> barrier((std::ptrdiff_t)n);
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (unsigned i = 0; i < n; ++i)
          threads.emplace_back([&, i] {
            thread_idx = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
            block_idx = dim3(bx, by, bz);
            lds = shared.data();
            bar = &barrier;
            kernel(args...);
          });
        for (auto& t : threads) t.join();
      }
}
}  // namespace dsv41c_emu

#define threadIdx (dsv41c_emu::thread_idx)
#define blockIdx (dsv41c_emu::block_idx)
#define blockDim (dsv41c_emu::block_dim)
#define gridDim (dsv41c_emu::grid_dim)
#define HIP_DYNAMIC_SHARED(type, var) type* var = reinterpret_cast<type*>(dsv41c_emu::lds);
// Every work-item must reach every __syncthreads (no return before a barrier), the rule
// HIP itself states for workgroup barriers.
inline void __syncthreads() { dsv41c_emu::bar->arrive_and_wait(); }
inline hipError_t hipGetLastError(void) { return dsv41c_emu::last_error; }
#define hipLaunchKernelGGL(kernel, grid, block, lds_bytes, stream, ...) \
  dsv41c_emu::launch(kernel, (grid), (block), (lds_bytes), __VA_ARGS__)

#endif  // DSV41C_HIP_HOST_EMU_H
