# The CUDA manifest: every translation unit of the CUDA layer, one per kernel instantiation.
set(SMLA_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cu
  ${CMAKE_CURRENT_LIST_DIR}/common/phase.cu  # the phase-timing buffer of `smla bench --phases`
  # SM90 sparse MLA: launcher, split merge, (element type x head tile) for 16-bit caches
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/launcher.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/combine.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h64_ws.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h64_ws.cu
  # quantized caches, dequantized to bf16 in shared memory: (format x head tile), mma.sync kernel
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h64_ws.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h64_ws.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h64_ws8.cu  # e4m3 q: S on the fp8 tensor cores
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h64_ws8.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/nvfp4_ds_mla_h16.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/nvfp4_ds_mla_h32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/nvfp4_ds_mla_h64.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/nvfp4_ds_mla_h64_ws.cu
)
