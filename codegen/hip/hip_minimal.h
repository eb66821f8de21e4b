// hip_minimal.h -- the few HIP built-ins dsv41c's emitted HIP kernels use, written on
// clang's own builtins, so the sources can be checked with a plain clang where no ROCm
// install (hipcc, hip_runtime.h, device libraries) exists:
//
//   clang -x hip --offload-arch=gfx942 -nogpuinc -nogpulib -DDSV41C_HIP_MINIMAL \
//         -I codegen/hip -fsyntax-only kernel.hip
//
// It is a checking aid, not a HIP runtime: kernels compile against it, host launches
// type-check (the <<<>>> launch is declared, not implemented). A real build uses hipcc and
// <hip/hip_runtime.h>; the emitted sources pick this header only under DSV41C_HIP_MINIMAL.
// Everything here maps 1:1 onto what hip_runtime.h provides under the same names.
#ifndef DSV41C_HIP_MINIMAL_H
#define DSV41C_HIP_MINIMAL_H

#if !defined(__HIP__)
#error "hip_minimal.h needs clang in HIP mode (-x hip)"
#endif

typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned long size_t;

// ---- function and variable qualifiers (clang's CUDA/HIP attributes)
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __constant__ __attribute__((constant))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(max_threads) __attribute__((amdgpu_flat_work_group_size(1, max_threads)))

// Dynamic LDS: size chosen at launch (the `sharedMemBytes` launch argument).
#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];

// ---- built-in index variables: threadIdx / blockIdx / blockDim / gridDim (x, y, z)
// `__declspec(property)` is how clang's own CUDA headers expose them; HIP mode accepts it.
#define DSV41C_BUILTIN_VAR(name, fx, fy, fz)                                                   \
  struct __dsv41c_##name##_t {                                                                 \
    static __device__ __forceinline__ unsigned int __get_x() { return fx; }                    \
    static __device__ __forceinline__ unsigned int __get_y() { return fy; }                    \
    static __device__ __forceinline__ unsigned int __get_z() { return fz; }                    \
    __declspec(property(get = __get_x)) unsigned int x;                                        \
    __declspec(property(get = __get_y)) unsigned int y;                                        \
    __declspec(property(get = __get_z)) unsigned int z;                                        \
  };                                                                                           \
  extern const __device__ __attribute__((weak)) __dsv41c_##name##_t name;

DSV41C_BUILTIN_VAR(threadIdx, __builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
                   __builtin_amdgcn_workitem_id_z())
DSV41C_BUILTIN_VAR(blockIdx, __builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
                   __builtin_amdgcn_workgroup_id_z())
DSV41C_BUILTIN_VAR(blockDim, __builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(),
                   __builtin_amdgcn_workgroup_size_z())
DSV41C_BUILTIN_VAR(gridDim, __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x(),
                   __builtin_amdgcn_grid_size_y() / __builtin_amdgcn_workgroup_size_y(),
                   __builtin_amdgcn_grid_size_z() / __builtin_amdgcn_workgroup_size_z())
#undef DSV41C_BUILTIN_VAR

// ---- barriers: workgroup-scope release fence, s_barrier, acquire fence (as HIP does)
static __device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// ---- math used by the kernels (clang builtins; no device libraries needed)
static __device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
#define INFINITY (__builtin_inff())

// ---- host side: launch configuration and the <<<grid, block, lds, stream>>> syntax
struct dim3 {
  unsigned int x, y, z;
  constexpr __host__ __device__ dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1)
      : x(x_), y(y_), z(z_) {}
};
typedef struct ihipStream_t* hipStream_t;
typedef enum hipError_t { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorLaunchFailure = 719 } hipError_t;

// clang lowers `k<<<g, b, lds, s>>>(args)` to these (HIP's "new launch API").
extern "C" hipError_t __hipPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem = 0,
                                                 hipStream_t stream = 0);
extern "C" hipError_t __hipPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                                hipStream_t* stream);
extern "C" hipError_t hipLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                      size_t sharedMem, hipStream_t stream);
extern "C" hipError_t hipGetLastError(void);
#define hipLaunchKernelGGL(kernel, grid, block, lds_bytes, stream, ...) \
  kernel<<<(grid), (block), (lds_bytes), (stream)>>>(__VA_ARGS__)

#endif  // DSV41C_HIP_MINIMAL_H
