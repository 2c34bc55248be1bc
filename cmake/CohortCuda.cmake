# CUDA is optional: where nvcc exists (the CUDA 13 toolkit under /usr/local/cuda),
# CUDA sources are compiled in the normal build; elsewhere everything else
# still builds and the GPU tests skip. -DCOHORT_ENABLE_CUDA=OFF builds
# without CUDA even where nvcc exists.
#
# Architectures: machine code for sm_80 (A100; every 8.x device runs it) and
# sm_90 (H100, H200), and compute_90 PTX, which the driver compiles for later
# GPUs when a program loads (CMake's bare numbers give both). The CUDA
# backend refuses a device none of these runs on (gpu_architectures.h,
# which reads COHORT_CUDA_ARCHITECTURES). The second architecture adds a
# device pass to every .cu file: about 40% more nvcc time, cold
# (docs/operations.md, "Checking a GPU build").
set(COHORT_HAVE_CUDA OFF)
if(COHORT_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
    # CMake 3.25 does not know nvcc 13's C++20 flag; device code needs only C++17.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # NCCL carries the device-memory collectives (worker/comm/nccl_*.cc): a
    # CUDA build without it would link nothing in its place.
    find_library(COHORT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
    if(NOT COHORT_NCCL_LIBRARY)
      message(FATAL_ERROR
        "cohort: CUDA ${CUDAToolkit_VERSION} is on (nvcc ${CMAKE_CUDA_COMPILER}), and it needs "
        "NCCL, but libnccl.so is in none of ${CUDAToolkit_LIBRARY_DIR}, /usr/local/cuda/lib64 "
        "or the system's library directories: install NCCL for this CUDA (libnccl-dev), point "
        "-DCOHORT_NCCL_LIBRARY=<path to libnccl.so> at it, or build without GPU code with "
        "-DCOHORT_ENABLE_CUDA=OFF")
    endif()
    # The list as the CUDA backend checks it, with ',' between entries (a ';'
    # would split the compile definition).
    string(REPLACE ";" "," COHORT_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    set(COHORT_HAVE_CUDA ON)
    message(STATUS "cohort: CUDA ${CUDAToolkit_VERSION} found, building GPU code for "
      "${COHORT_CUDA_ARCHITECTURES}; NCCL: ${COHORT_NCCL_LIBRARY}")
  else()
    message(STATUS "cohort: nvcc not found, building without GPU code")
  endif()
endif()
