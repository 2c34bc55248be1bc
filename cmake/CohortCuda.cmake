# CUDA is optional: where nvcc exists (the CUDA 13 toolkit under /usr/local/cuda),
# CUDA sources are compiled for sm_90 in the normal build; elsewhere everything
# else still builds and the GPU tests skip.
set(COHORT_HAVE_CUDA OFF)
if(COHORT_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES 90)
    # CMake 3.25 does not know nvcc 13's C++20 flag; device code needs only C++17.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_library(COHORT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    set(COHORT_HAVE_CUDA ON)
    message(STATUS "cohort: CUDA ${CUDAToolkit_VERSION} found, building GPU code for sm_90")
  else()
    message(STATUS "cohort: nvcc not found, building without GPU code")
  endif()
endif()
