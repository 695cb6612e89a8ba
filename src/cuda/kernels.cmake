# The CUDA manifest: every translation unit of the CUDA layer, one per kernel instantiation.
set(SMLA_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cu
)
