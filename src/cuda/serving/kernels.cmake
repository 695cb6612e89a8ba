# Serving kernels around the attention call (cache writers, index conversion, empty-row finisher).
list(APPEND SMLA_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/cache_writer.cu
  ${CMAKE_CURRENT_LIST_DIR}/index_convert.cu
  ${CMAKE_CURRENT_LIST_DIR}/finish_empty.cu
)
