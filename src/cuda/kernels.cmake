# The CUDA manifest: every translation unit of the CUDA layer, one per kernel instantiation.
set(SMLA_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cu
  ${CMAKE_CURRENT_LIST_DIR}/common/bench_support.cu  # benchmark data made on the device, GPU sleep
  # SM90 sparse MLA, 16-bit caches: launcher, split merge, (element type x head tile)
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/launcher.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/combine.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h64_wgmma.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h64_wgmma.cu
)
