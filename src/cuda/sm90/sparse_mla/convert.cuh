// SM90 sparse MLA, warp-specialized kernel: consumer 1's dequantization of the gathered raw rows
// to bf16 (dequant.h), for the scorer's next tile while consumer 1 waits on its P V. Quantized
// caches: each half of a buffer in place, from its staging area (StageLayout, config.h); the fp8
// score path: only V (dims 0-511), into the one bf16 V buffer.
#pragma once

#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/ws_common.cuh"

namespace smla::cuda::sm90::sparse_mla {

// Dequantizes half kH of buffer kB in place, by consumer 1's 128 threads (thread wt: rows
// grp + 16 i, 16-byte chunk c of each dim block, as the producer's copies): waits for the raw
// bytes (the producer's "raw" mbarrier, phase `parity`), reads this thread's raw bytes into
// registers, syncs the warpgroup (every raw byte read before any is overwritten), writes the
// bf16 chunks to their swizzled places and arrives on the half's "full" mbarrier.
template <KvFormat kFormat, int kB, int kH>
__device__ __forceinline__ void ws_convert_half(const KernelParams& p, WsConfig::SharedStorage& s, int wt,
                                                uint32_t parity) {
  using Cfg = WsConfig;
  constexpr StageHalf st = StageLayout<kFormat>::h[kH];
  constexpr RowLayout L = row_layout(kFormat);
  constexpr int kBlk0 = kH == 0 ? 0 : 4;
  constexpr int kNb = kH == 0 ? 4 : (kFormat == KvFormat::kFP8DsMla ? 4 : 5);  // ds_mla RoPE is in place
  const int c = wt & 7, grp = wt >> 3;
  const bool rope = p.k_steps > kLatent / 16;
  ptx::mbar_wait(ws_bar(s.raw[kB][kH]), parity);
  const uint8_t* stage = reinterpret_cast<const uint8_t*>(s.kv[kB][st.block]);
  uint32_t lo[4][kNb], hi[4][kNb];  // raw bytes of chunk (row i, block kBlk0 + j)
  float sc[4][kNb];                 // its scale (fp8_ds_mla tile scale, nvfp4 block scale)
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint8_t* sr = stage + (grp + 16 * i) * st.bytes;
#pragma unroll
    for (int j = 0; j < kNb; ++j) {
      const int blk = kBlk0 + j;
      if constexpr (kFormat == KvFormat::kFP8E4M3) {
        dq::ld_u32x2(sr + (blk - kBlk0) * 64 + c * 8, lo[i][j], hi[i][j]);
        sc[i][j] = 1.0f;
      } else if constexpr (kFormat == KvFormat::kFP8DsMla) {
        dq::ld_u32x2(sr + (blk - kBlk0) * 64 + c * 8, lo[i][j], hi[i][j]);
        sc[i][j] = num::bits_f32(dq::ld_u32(sr + st.len0 + L.scale_bytes * (blk / (L.tile_width / 64))));  // its tile's
      } else {
        if (blk < 8) {
          const int ch = blk * 8 + c;  // latent chunk: bytes 4 ch .. 4 ch + 3 of the row
          lo[i][j] = dq::ld_u32(sr + 4 * ch - st.off0);
          const int scale_at = nvfp4_scale_offset(ch >> 1);
          hi[i][j] = sr[kH == 0 ? scale_at - st.off1 + st.len0 : scale_at - st.off0];  // the e4m3 block scale
          sc[i][j] = 1.0f;
        } else {
          dq::ld_u32x2(sr + (L.rope_offset - st.off0) + 8 * c, lo[i][j], hi[i][j]);  // RoPE, e4m3 unscaled
          sc[i][j] = 1.0f;
        }
      }
    }
  }
  bar_sync(Bar::kConvert, 128);  // every raw byte read before any is overwritten
  const uint32_t base = ptx::smem_addr(s.kv[kB]) + uint32_t(grp * Cfg::kAtomBytes + ((c ^ (grp & 7)) << 4));
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < kNb; ++j) {
      const int blk = kBlk0 + j;
      dq::Chunk v;
      if constexpr (kFormat == KvFormat::kFP8E4M3) v = dq::e4m3x8_fast(lo[i][j], hi[i][j]);
      else if constexpr (kFormat == KvFormat::kFP8DsMla) v = dq::e4m3x8_scaled_fast(lo[i][j], hi[i][j], sc[i][j]);
      else
        v = blk < 8 ? dq::e2m1x8_scaled_lut(lo[i][j], dq::e4m3_bf16_bits(hi[i][j])) : dq::e4m3x8_fast(lo[i][j], hi[i][j]);
      if (blk == 8 && !rope) v = dq::Chunk{{0u, 0u, 0u, 0u}};
      const uint32_t dst = base + uint32_t(blk * Cfg::kBlockBytes + 16 * i * Cfg::kAtomBytes);
      ptx::st_shared_v4(dst, v.w);
    }
  ptx::fence_proxy_async_smem();
  ptx::mbar_arrive(ws_bar(s.full[kB][kH]));
}

// Half kH of `tile` (buffer tile % 2).
template <KvFormat kFormat, int kH>
__device__ __forceinline__ void ws_convert(const KernelParams& p, WsConfig::SharedStorage& s, int wt, int tile) {
  const uint32_t parity = (tile >> 1) & 1;
  if (tile & 1) ws_convert_half<kFormat, 1, kH>(p, s, wt, parity);
  else ws_convert_half<kFormat, 0, kH>(p, s, wt, parity);
}

// V half kH (dims 256 kH .. 256 kH + 255) of `tile` -> bf16 in s.v, by consumer 1's 128 threads
// (thread wt: rows grp + 16 i, 16-byte chunk c of latent blocks 2 kH and 2 kH + 1, written as two
// bf16 chunks). fp8_e4m3 stays unscaled (k_scale is applied to the output), fp8_ds_mla takes its
// tile scale. Half 0 first waits for the stage's rows. Ends with the writes visible to wgmma.
template <KvFormat kFormat, int kH>
__device__ __forceinline__ void ws_convert_v(WsQ8Config::SharedStorage& s, int wt, int tile) {
  const int st = tile & 1;
  if constexpr (kH == 0) ptx::mbar_wait(ws_bar(s.full[st]), (tile >> 1) & 1);
  const int c = wt & 7, grp = wt >> 3;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = grp + 16 * i;
#pragma unroll
    for (int lb = 2 * kH; lb < 2 * kH + 2; ++lb) {
      uint32_t x[4];
      ptx::ld_shared_v4(x, ptx::smem_addr(s.k[st][lb]) + uint32_t(r * 128 + ((c ^ (r & 7)) << 4)));
      dq::Chunk v[2];
      if constexpr (kFormat == KvFormat::kFP8DsMla) {
        const float sc = s.ks[st][r][lb];
        v[0] = dq::e4m3x8_scaled_fast(x[0], x[1], sc);
        v[1] = dq::e4m3x8_scaled_fast(x[2], x[3], sc);
      } else {
        v[0] = dq::e4m3x8_fast(x[0], x[1]);
        v[1] = dq::e4m3x8_fast(x[2], x[3]);
      }
      const uint32_t blk = ptx::smem_addr(s.v[2 * lb + (c >> 2)]) + uint32_t(r * 128);
#pragma unroll
      for (int u = 0; u < 2; ++u)
        ptx::st_shared_v4(blk + uint32_t(((2 * (c & 3) + u) ^ (r & 7)) << 4), v[u].w);
    }
  }
  ptx::fence_proxy_async_smem();
}

}  // namespace smla::cuda::sm90::sparse_mla
