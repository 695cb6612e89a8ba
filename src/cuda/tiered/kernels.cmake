# HiSparse tiered cache: the resolver (classify + victims, copy from pinned host memory) and the
# tiered cache writer's entry point (smla/cuda_tiered.h).
list(APPEND SMLA_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/resolve.cu
)
