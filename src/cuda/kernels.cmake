# The CUDA manifest: every translation unit of the CUDA layer, one per kernel instantiation.
set(SMLA_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cu
  ${CMAKE_CURRENT_LIST_DIR}/common/phase.cu  # the phase-timing buffer of `smla bench --phases`
  # SM90 sparse MLA: launcher, split merge, and the warp-specialized kernel per cache format
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/launcher.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/combine.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/bf16_h64_ws.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp16_h64_ws.cu
  # quantized caches, dequantized to bf16 in shared memory by the kernel's second consumer
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h64_ws.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h64_ws.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/nvfp4_ds_mla_h64_ws.cu
  # e4m3 q over fp8 rows: S on the fp8 tensor cores
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_h64_ws8.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_h64_ws8.cu
  # small H (<= 16), fp8_ds_mla / fp8_e4m3 / nvfp4_ds_mla with bf16 scores: rows as the wgmma M dimension (swap AB)
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_swapab.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_swapab.cu
  # ... and N = 32 for 17 <= H <= 32 (fp8_ds_mla, fp8_e4m3)
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_ds_mla_swapab32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/fp8_e4m3_swapab32.cu
  ${CMAKE_CURRENT_LIST_DIR}/sm90/sparse_mla/nvfp4_ds_mla_swapab.cu
)
