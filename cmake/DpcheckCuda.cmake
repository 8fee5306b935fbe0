# The CUDA engine, kernels and GPU communicators (kernels/). DPCHECK_CUDA: AUTO builds them when nvcc is
# found (CMake finds /usr/local/cuda's without it being on PATH), ON requires them, OFF skips them.
# Without a GPU at run time the code still compiles and links; GPU tests skip with the runtime's reason.
if(NOT DPCHECK_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DPCHECK_CUDA is '${DPCHECK_CUDA}': use AUTO, ON or OFF")
endif()

set(DPCHECK_WITH_CUDA OFF)
if(NOT DPCHECK_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100, H200); override with -DCMAKE_CUDA_ARCHITECTURES=...
    endif()
    # Only the shared runtime, or the link line carries both it and the static one.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag (nvcc 12 and later accept it); the sources share
    # C++20 headers with the rest of dpcheck.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    # NCCL has no CMake package; its header and library sit beside the toolkit's.
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(DPCHECK_WITH_CUDA ON)
    elseif(DPCHECK_CUDA STREQUAL "ON")
      message(FATAL_ERROR "DPCHECK_CUDA=ON but NCCL (nccl.h, libnccl) was not found")
    endif()
  elseif(DPCHECK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DPCHECK_CUDA=ON but no CUDA compiler was found")
  endif()
endif()

# dpcheck_kernels' link libraries, followed through the libraries they bring, must not reach the reference
# or the properties: a wrong constant must not live on both sides of a check (ci/layers.sh checks the
# includes the same way).
function(dpcheck_check_kernels_links)
  get_target_property(pending dpcheck_kernels LINK_LIBRARIES)
  set(seen)
  while(pending)
    list(POP_FRONT pending lib)
    string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" lib "${lib}")
    if(NOT TARGET "${lib}" OR lib IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${lib}")
    if(lib STREQUAL "dpcheck_reference" OR lib STREQUAL "dpcheck_properties")
      message(FATAL_ERROR "dpcheck_kernels links ${lib}, directly or through another library: kernels/ never "
                          "calls the reference or the properties that check it; a test that pairs a kernel with "
                          "its reference links both itself")
    endif()
    get_target_property(more "${lib}" INTERFACE_LINK_LIBRARIES)
    if(more)
      list(APPEND pending ${more})
    endif()
  endwhile()
endfunction()

if(DPCHECK_WITH_CUDA)
  message(STATUS "dpcheck: CUDA engine: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${NCCL_LIBRARY})")
  add_library(dpcheck_nccl INTERFACE IMPORTED)
  set_target_properties(dpcheck_nccl PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${NCCL_LIBRARY}")

  add_library(dpcheck_kernels STATIC
    kernels/device.cpp
    kernels/cublas_library.cpp
    kernels/linear.cu
    kernels/activation.cu
    kernels/loss.cu
    kernels/bias_grad.cu
    kernels/optimizer.cu
    kernels/hash.cu
    kernels/first_difference.cu
    kernels/allreduce.cu
    kernels/cuda_memory.cpp
    kernels/cuda_engine.cpp
    kernels/gpu_comm.cpp
    kernels/gpu_bench.cu
  )
  # The core only: kernels/ never calls the oracle that checks it, nor the properties (tests that pair a
  # kernel with its reference link both themselves, tests/CMakeLists.txt).
  # cuBLAS is opened on first use (kernels/cublas_library.hpp), not linked: loading it costs 0.45 s of
  # CPU at every process start. Its headers are the toolkit's, which cudart's target carries.
  target_link_libraries(dpcheck_kernels PUBLIC dpcheck_core CUDA::cudart dpcheck_nccl ${CMAKE_DL_LIBS})
  # Checked once every CMakeLists.txt has run, so that a link added anywhere later is seen too.
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL dpcheck_check_kernels_links)
  target_compile_definitions(dpcheck_kernels PUBLIC DPCHECK_HAVE_CUDA=1)
  target_compile_options(dpcheck_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr>)
  dpcheck_warnings(dpcheck_kernels)

  # The plugin dpcheck loads on first GPU use (src/target/cuda_plugin.cpp). It carries its own copy of what it
  # needs from the static libraries, all hidden, and exports one symbol: dpcheck_cuda_plugin.
  add_library(dpcheck_cuda SHARED kernels/plugin.cpp)
  set_target_properties(dpcheck_cuda PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  target_link_libraries(dpcheck_cuda PRIVATE dpcheck_kernels)
  if(TARGET dpcheck_mpi_stub)
    set_target_properties(dpcheck_cuda PROPERTIES DPCHECK_MPI_LIBRARY dpcheck_mpi_stub)  # never starts MPI
  endif()
  target_link_options(dpcheck_cuda PRIVATE -Wl,--exclude-libs,ALL -Wl,-z,defs)
  dpcheck_warnings(dpcheck_cuda)
  set_property(SOURCE src/target/cuda_plugin.cpp APPEND PROPERTY
    COMPILE_DEFINITIONS "DPCHECK_CUDA_PLUGIN_BUILD_PATH=\"$<TARGET_FILE:dpcheck_cuda>\"")
else()
  message(STATUS "dpcheck: CUDA engine: off (DPCHECK_CUDA=${DPCHECK_CUDA})")
endif()
