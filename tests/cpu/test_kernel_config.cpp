// The SM90 kernels' shared-memory and register plans, checked on the host: config.h
// static_asserts every shared-memory plan against the 227 KiB opt-in limit, so including it here
// makes the CPU build (CI) fail on an over-budget change before any GPU sees it; and the compiled
// cubins (embedded in the CUDA library) are read back to check the register allocation that the
// warp-specialized kernel's setmaxnreg budget assumes.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90/sparse_mla/config.h"
#include "cuda/sm90/sparse_mla/dequant.h"
#include "cuda/sm90/sparse_mla/xo_layout.h"
#include "smla/formats.h"

namespace k = smla::cuda::sm90::sparse_mla;

TEST(KernelConfig, SharedMemoryPlansFitSm90) {
  EXPECT_LE(k::WsConfig::kSmemBytes, k::kSmemLimit);
  EXPECT_LE(k::WsQ8Config::kSmemBytes, k::kSmemLimit);
  EXPECT_EQ(k::kSmemLimit, 227u * 1024u);
}

TEST(KernelConfig, HeadGroups) {
  // 64-head groups; heads past H are zero-padded.
  EXPECT_EQ(k::head_groups_for(1), 1);
  EXPECT_EQ(k::head_groups_for(64), 1);
  EXPECT_EQ(k::head_groups_for(65), 2);
  EXPECT_EQ(k::head_groups_for(128), 2);
}

// The crossover variant's layout (xo_layout.h): each CTA of the pair stages its 32 rows inside its
// own rows of the half's blocks, writes exactly its own rows (4 KiB of every latent block) here and
// in the peer, and never touches what the other CTA stages or writes.
// SMLA_SM90_NARROW_HEADS's heads per block (docs/perf-history.md#s12-latency-budget): the shapes the
// section predicts for, then every small call against the rule's statement (one wave, more blocks than
// 64-head groups, the smallest such of 16 / 32, else 64) and the head coverage the kernel relies on.
TEST(KernelConfig, NarrowBlockHeads) {
  EXPECT_EQ(k::narrow_block_heads(1, 128, 32, 132), 32);  // 4 groups x 32 splits = 128 blocks
  EXPECT_EQ(k::narrow_block_heads(1, 64, 32, 132), 16);   // 4 x 32
  EXPECT_EQ(k::narrow_block_heads(1, 33, 32, 132), 16);   // 3 x 32
  EXPECT_EQ(k::narrow_block_heads(1, 96, 32, 132), 32);   // 16-head blocks: 6 x 32 = 192 > 132
  EXPECT_EQ(k::narrow_block_heads(1, 16, 32, 132), 64);   // one group either way: today's tiling
  EXPECT_EQ(k::narrow_block_heads(1, 1, 32, 132), 64);
  EXPECT_EQ(k::narrow_block_heads(1, 128, 16, 132), 16);  // 8 x 16
  EXPECT_EQ(k::narrow_block_heads(2, 128, 32, 132), 64);  // already 128 blocks
  EXPECT_EQ(k::narrow_block_heads(3, 128, 1, 132), 16);   // no split (small K): 3 x 8 blocks
  EXPECT_EQ(k::narrow_block_heads(32, 128, 2, 132), 64);
  EXPECT_EQ(k::narrow_block_heads(1, 128, 32, 78), 64);   // a smaller GPU: 128 blocks do not fit
  EXPECT_EQ(k::narrow_block_heads(0, 128, 32, 132), 64);
  EXPECT_EQ(k::narrow_block_heads(1, 128, 0, 132), 64);
  EXPECT_EQ(k::narrow_block_heads(1, 128, 32, 0), 64);
  for (int sms : {78, 114, 132})
    for (int64_t T = 1; T <= 8; ++T)
      for (int H = 1; H <= 128; ++H)
        for (int S = 1; S <= 32; ++S) {
          const int hb = k::narrow_block_heads(T, H, S, sms);
          SCOPED_TRACE("T " + std::to_string(T) + " H " + std::to_string(H) + " S " + std::to_string(S));
          ASSERT_TRUE(hb == 16 || hb == 32 || hb == 64);
          const int groups = (H + hb - 1) / hb, base = (H + 63) / 64;
          ASSERT_GE(int64_t(groups) * hb, H);  // every head in a block
          ASSERT_LT(int64_t(groups - 1) * hb, H);  // no block without a real head
          auto fits = [&](int b) { return (H + b - 1) / b > base && T * ((H + b - 1) / b) * S <= sms; };
          if (hb < 64) ASSERT_TRUE(fits(hb));
          for (int b = 16; b < hb; b *= 2) ASSERT_FALSE(fits(b)) << "a narrower block fits: " << b;
          if (hb == 64) ASSERT_FALSE(fits(16) || fits(32));
        }
}

TEST(KernelConfig, CrossoverLayoutKeepsTheTwoCtasApart) {
  constexpr int kBuf = k::WsConfig::kDimBlocks * k::WsConfig::kBlockBytes;
  std::vector<int> staged(kBuf, -1), written(kBuf, -1);  // which (rank) stages / writes each byte
  const smla::RowLayout L = smla::row_layout(smla::KvFormat::kFP8DsMla);
  for (int rank = 0; rank < 2; ++rank)
    for (int h = 0; h < 2; ++h)
      for (int rl = 0; rl < k::xo::kRows; ++rl) {
        for (int c = 0; c < k::xo::kStageCopies; ++c) {
          const int d = k::xo::copy_dst(h, rank, rl, c), src = k::xo::copy_src(h, c, L.scale_offset);
          EXPECT_LE(src + 16, L.rope_offset) << "a staged copy reads past the scales (D = 512 rows stop there)";
          const int blk = d / k::WsConfig::kBlockBytes, in = d % k::WsConfig::kBlockBytes;
          EXPECT_TRUE(blk >= 4 * h + 1 && blk <= 4 * h + 3) << "stage outside half " << h << "'s latent blocks";
          EXPECT_TRUE(in >= rank * k::xo::kOwnBytes && in + 16 <= (rank + 1) * k::xo::kOwnBytes)
              << "rank " << rank << " stages outside its own rows";
          for (int b = d; b < d + 16; ++b) {
            EXPECT_EQ(staged[b], -1) << "byte " << b << " staged twice";
            staged[b] = rank;
          }
        }
        for (int blk = 4 * h; blk < 4 * h + 4; ++blk)
          for (int c = 0; c < 8; ++c) {
            const int d = k::xo::bf16_chunk(k::xo::row_of(rank, rl), blk, c);
            EXPECT_EQ(d, k::xo::bf16_chunk(k::xo::row_of(rank, rl % 16), blk, c) + (rl / 16) * 16 * k::WsConfig::kAtomBytes)
                << "the converter's address step per 16 rows";
            for (int b = d; b < d + 16; ++b) {
              EXPECT_EQ(written[b], -1) << "byte " << b << " written twice";
              written[b] = rank;
            }
          }
      }
  for (int b = 0; b < kBuf; ++b) {
    const int blk = b / k::WsConfig::kBlockBytes, owner = (b % k::WsConfig::kBlockBytes) / k::xo::kOwnBytes;
    EXPECT_EQ(written[b], blk < 8 ? owner : -1) << "byte " << b;  // every latent byte by its rows' CTA; block 8 by none
    if (staged[b] != -1) EXPECT_EQ(staged[b], owner) << "byte " << b;
  }
  EXPECT_EQ(k::xo::kPeerBytesPerHalf, k::xo::kRows * 4 * k::WsConfig::kAtomBytes);
}

// The pair's whole data path on the host (producer copies, each CTA's conversion reading its staging
// and writing both buffers with dequant.h's host twin of the kernel's e4m3x8_scaled_fast), CTA 0
// entirely before CTA 1 (a write into the other CTA's staging would show): every latent chunk of
// both buffers is dequant_chunk of its row, a masked row (zero-filled) is 0.
TEST(KernelConfig, CrossoverDataPathRebuildsEveryRow) {
  constexpr int kBuf = k::WsConfig::kDimBlocks * k::WsConfig::kBlockBytes;
  const smla::RowLayout L = smla::row_layout(smla::KvFormat::kFP8DsMla);
  std::mt19937_64 rng(12345);
  std::vector<std::vector<uint8_t>> rows(k::kBlockK, std::vector<uint8_t>(size_t(L.bytes)));
  for (int r = 0; r < k::kBlockK; ++r) {
    for (auto& b : rows[r]) b = uint8_t(rng());
    for (int i = 0; i < L.bytes; ++i)
      if ((rows[r][i] & 0x7f) == 0x7f) rows[r][i] ^= 1;  // no NaN e4m3
    for (int i = 0; i < L.num_scales; ++i) {
      const float sc = std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, int(rng() % 20) - 10);
      std::memcpy(rows[r].data() + L.scale_offset + 4 * i, &sc, 4);
    }
  }
  std::fill(rows[37].begin(), rows[37].end(), uint8_t(0));  // a masked entry: the producer zero-fills it
  std::vector<std::vector<uint8_t>> buf(2, std::vector<uint8_t>(kBuf, 0xAB));
  for (int rank = 0; rank < 2; ++rank)  // producers
    for (int h = 0; h < 2; ++h)
      for (int rl = 0; rl < k::xo::kRows; ++rl)
        for (int c = 0; c < k::xo::kStageCopies; ++c)
          std::memcpy(&buf[rank][k::xo::copy_dst(h, rank, rl, c)],
                      rows[k::xo::row_of(rank, rl)].data() + k::xo::copy_src(h, c, L.scale_offset), 16);
  for (int rank = 0; rank < 2; ++rank)  // converters: read all, then write here and in the peer
    for (int h = 0; h < 2; ++h) {
      std::vector<std::pair<int, k::dq::Chunk>> out;
      for (int rl = 0; rl < k::xo::kRows; ++rl)
        for (int blk = 4 * h; blk < 4 * h + 4; ++blk)
          for (int c = 0; c < 8; ++c) {
            const uint8_t* b = buf[rank].data();
            const uint32_t lo = k::dq::ld_u32(b + k::xo::stage_chunk(h, rank, rl, blk, c));
            const uint32_t hi = k::dq::ld_u32(b + k::xo::stage_chunk(h, rank, rl, blk, c) + 4);
            const float sc = smla::num::bits_f32(k::dq::ld_u32(b + k::xo::stage_scale_of(h, rank, rl, blk)));
            out.push_back({k::xo::bf16_chunk(k::xo::row_of(rank, rl), blk, c), k::dq::e4m3x8_scaled(lo, hi, sc)});
          }
      for (const auto& [d, v] : out)
        for (int to = 0; to < 2; ++to) std::memcpy(&buf[to][d], v.w, 16);
    }
  int64_t bad = 0;
  for (int to = 0; to < 2; ++to)
    for (int r = 0; r < k::kBlockK; ++r)
      for (int blk = 0; blk < 8; ++blk)
        for (int c = 0; c < 8; ++c) {
          const k::dq::Chunk want = k::dq::dequant_chunk<smla::KvFormat::kFP8DsMla>(rows[r].data(), blk * 8 + c);
          bad += std::memcmp(&buf[to][k::xo::bf16_chunk(r, blk, c)], want.w, 16) != 0;
          if (r == 37) bad += std::memcmp(want.w, std::array<uint32_t, 4>{}.data(), 16) != 0;
        }
  EXPECT_EQ(bad, 0) << "bf16 chunks differing from dequant_chunk";
}

// The register-staged mode of h128.xo (SMLA_SM90_XO_REGS=1): each converter thread loads, straight from
// the stored row, the 8 e4m3 bytes of its chunk (xo::reg_src) and the half's two tile scales
// (reg_scales_src, slot reg_scale_slot); a masked row gives zeros. Those must be the bytes the staged
// mode reads from its staging (stage_chunk, stage_scale_of), so every bf16 chunk is the row's
// dequant_chunk, in both modes, over every rank, half, row, block and chunk.
TEST(KernelConfig, CrossoverRegisterPathReadsTheStagedBytes) {
  constexpr int kBuf = k::WsConfig::kDimBlocks * k::WsConfig::kBlockBytes;
  const smla::RowLayout L = smla::row_layout(smla::KvFormat::kFP8DsMla);
  std::mt19937_64 rng(777);
  std::vector<std::vector<uint8_t>> rows(k::kBlockK, std::vector<uint8_t>(size_t(L.bytes)));
  for (int r = 0; r < k::kBlockK; ++r) {
    for (auto& b : rows[r]) b = uint8_t(rng());
    for (int i = 0; i < L.bytes; ++i)
      if ((rows[r][i] & 0x7f) == 0x7f) rows[r][i] ^= 1;  // no NaN e4m3
    for (int i = 0; i < L.num_scales; ++i) {
      const float sc = std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, int(rng() % 20) - 10);
      std::memcpy(rows[r].data() + L.scale_offset + 4 * i, &sc, 4);
    }
  }
  const int masked = 41;  // a masked entry: zeros in both modes
  std::vector<uint8_t> zero(size_t(L.bytes), 0);
  std::vector<uint8_t> buf(kBuf, 0xAB);  // the staged mode's staging, filled as its producer copies
  int64_t bad = 0, checked = 0;
  for (int rank = 0; rank < 2; ++rank)
    for (int h = 0; h < 2; ++h) {
      for (int rl = 0; rl < k::xo::kRows; ++rl) {
        const int r = k::xo::row_of(rank, rl);
        const std::vector<uint8_t>& row = r == masked ? zero : rows[r];
        for (int c = 0; c < k::xo::kStageCopies; ++c)
          std::memcpy(&buf[k::xo::copy_dst(h, rank, rl, c)], row.data() + k::xo::copy_src(h, c, L.scale_offset), 16);
      }
      for (int rl = 0; rl < k::xo::kRows; ++rl) {
        const int r = k::xo::row_of(rank, rl);
        const bool ok = r != masked;
        float sc2[2] = {0.0f, 0.0f};  // the register path's 8-byte scale load
        if (ok) std::memcpy(sc2, rows[r].data() + k::xo::reg_scales_src(h, L.scale_offset), 8);
        for (int blk = 4 * h; blk < 4 * h + 4; ++blk)
          for (int c = 0; c < 8; ++c) {
            uint32_t lo = 0, hi = 0;
            if (ok) {
              lo = k::dq::ld_u32(rows[r].data() + k::xo::reg_src(blk, c));
              hi = k::dq::ld_u32(rows[r].data() + k::xo::reg_src(blk, c) + 4);
            }
            const int slot = k::xo::reg_scale_slot(h, blk);
            ASSERT_TRUE(slot == 0 || slot == 1);
            const k::dq::Chunk reg = k::dq::e4m3x8_scaled(lo, hi, sc2[slot]);
            const uint8_t* b = buf.data();
            const uint32_t slo = k::dq::ld_u32(b + k::xo::stage_chunk(h, rank, rl, blk, c));
            const uint32_t shi = k::dq::ld_u32(b + k::xo::stage_chunk(h, rank, rl, blk, c) + 4);
            const float ssc = smla::num::bits_f32(k::dq::ld_u32(b + k::xo::stage_scale_of(h, rank, rl, blk)));
            bad += lo != slo || hi != shi || std::memcmp(&sc2[slot], &ssc, 4) != 0;
            const k::dq::Chunk want =
                ok ? k::dq::dequant_chunk<smla::KvFormat::kFP8DsMla>(rows[r].data(), blk * 8 + c) : k::dq::Chunk{};
            bad += std::memcmp(reg.w, want.w, 16) != 0;
            ++checked;
          }
      }
    }
  EXPECT_EQ(checked, 2 * 2 * k::xo::kRows * 4 * 8);
  EXPECT_EQ(bad, 0) << "register-path bytes or chunks differing from the staged path / dequant_chunk";
}

// The register-staged mode's global loads (xr_load, kernel_xo.cuh): 8-byte ld.global.nc.v2 from a row
// that starts 16-byte aligned (the launcher checks kv and its stride), so every offset must be a
// multiple of 8; each must lie inside the bytes the kernel may read of a row (raw_row_chunks, with and
// without RoPE: D = 512 rows stop after the scales), the latent ones inside the latent and the scales
// inside the four tile scales; and the kernel's guard ((offset & ~15) < raw_chunks * 16, which turns
// a load into zeros) must pass for every one of them, or a valid row would convert as zeros (the
// staged mode would still copy it: a bit difference between the modes, not a crash).
TEST(KernelConfig, CrossoverRegisterLoadsAreAlignedAndInsideTheRow) {
  const smla::RowLayout L = smla::row_layout(smla::KvFormat::kFP8DsMla);
  for (int rope_dim : {0, 64}) {
    const int row_bytes = k::raw_row_chunks(smla::KvFormat::kFP8DsMla, rope_dim) * 16;
    EXPECT_LE(row_bytes, L.bytes);
    for (int h = 0; h < 2; ++h) {
      for (int blk = 4 * h; blk < 4 * h + 4; ++blk)
        for (int c = 0; c < 8; ++c) {
          const int src = k::xo::reg_src(blk, c);
          EXPECT_EQ(src % 8, 0) << "blk " << blk << " c " << c;
          EXPECT_GE(src, 256 * h) << "outside half " << h << "'s latent bytes";
          EXPECT_LE(src + 8, 256 * (h + 1)) << "outside half " << h << "'s latent bytes";
          EXPECT_LE(src + 8, L.latent_bytes);
          EXPECT_LT(src & ~15, row_bytes) << "the kernel's guard would zero a valid row's bytes, D " << 512 + rope_dim;
        }
      const int ssrc = k::xo::reg_scales_src(h, L.scale_offset);
      EXPECT_EQ(ssrc % 8, 0);
      EXPECT_GE(ssrc, L.scale_offset);
      EXPECT_LE(ssrc + 8, L.scale_offset + L.num_scales * L.scale_bytes);
      EXPECT_LE(ssrc + 8, row_bytes) << "D " << 512 + rope_dim;
      EXPECT_LT(ssrc & ~15, row_bytes) << "the kernel's guard would zero a valid row's scales, D " << 512 + rope_dim;
      for (int blk = 4 * h; blk < 4 * h + 4; ++blk)  // the two scales loaded are the tiles of the half's blocks
        EXPECT_EQ(ssrc + 4 * k::xo::reg_scale_slot(h, blk), L.scale_offset + L.scale_bytes * (blk / 2)) << blk;
    }
  }
}

namespace {

template <typename T>
T rd(const std::vector<uint8_t>& d, size_t off) {
  T v{};
  if (off + sizeof(T) <= d.size()) std::memcpy(&v, d.data() + off, sizeof(T));
  return v;
}

struct KernelResources {
  int64_t regs = -1;        // EIATTR_REGCOUNT
  int64_t frame_bytes = 0;  // EIATTR_FRAME_SIZE / MIN_STACK_SIZE: local memory per thread (spills, stack arrays)
};

// Resources per kernel (the EIATTR_REGCOUNT / EIATTR_FRAME_SIZE entries of each .nv.info section)
// of every sm_90a cubin embedded uncompressed in `bytes` (nvcc object files in a static library):
// ELF64 images with e_machine 190.
std::map<std::string, KernelResources> cubin_resources(const std::vector<uint8_t>& d) {
  std::map<std::string, KernelResources> res;
  const uint8_t magic[4] = {0x7f, 'E', 'L', 'F'};
  for (size_t b = 0; b + 64 <= d.size(); ++b) {
    if (std::memcmp(d.data() + b, magic, 4) != 0 || d[b + 4] != 2 || rd<uint16_t>(d, b + 18) != 190) continue;
    const uint64_t shoff = rd<uint64_t>(d, b + 0x28);
    const uint16_t shentsize = rd<uint16_t>(d, b + 0x3a), shnum = rd<uint16_t>(d, b + 0x3c);
    struct Sec {
      uint32_t name, type, link;
      uint64_t off, size;
    };
    std::vector<Sec> secs;
    for (uint16_t i = 0; i < shnum; ++i) {
      const size_t o = b + shoff + size_t(i) * shentsize;
      secs.push_back({rd<uint32_t>(d, o), rd<uint32_t>(d, o + 4), rd<uint32_t>(d, o + 0x28), rd<uint64_t>(d, o + 0x18),
                      rd<uint64_t>(d, o + 0x20)});
    }
    const uint16_t shstrndx = rd<uint16_t>(d, b + 0x3e);
    if (shstrndx >= secs.size()) continue;
    auto str = [&](const Sec& tab, uint32_t at) {
      std::string s;
      for (size_t o = b + tab.off + at; o < d.size() && d[o] != 0; ++o) s += char(d[o]);
      return s;
    };
    std::vector<std::string> syms;
    for (const Sec& s : secs)
      if (s.type == 2 && s.link < secs.size())  // SHT_SYMTAB: 24-byte entries
        for (uint64_t j = 0; j < s.size / 24; ++j) syms.push_back(str(secs[s.link], rd<uint32_t>(d, b + s.off + 24 * j)));
    for (const Sec& s : secs) {
      if (str(secs[shstrndx], s.name) != ".nv.info") continue;
      for (size_t o = b + s.off, end = o + s.size; o + 4 <= end;) {
        const uint8_t fmt = d[o], attr = d[o + 1];
        if (fmt == 4) {  // EIFMT_SVAL: u16 size, then the value
          const uint16_t sz = rd<uint16_t>(d, o + 2);
          const uint32_t sym = rd<uint32_t>(d, o + 4);
          if (sz == 8 && sym < syms.size() && syms[sym].rfind("_Z", 0) == 0) {  // (symbol index, value)
            if (attr == 0x2f) res[syms[sym]].regs = rd<uint32_t>(d, o + 8);         // EIATTR_REGCOUNT
            if (attr == 0x11 || attr == 0x12)  // EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE
              res[syms[sym]].frame_bytes = std::max<int64_t>(res[syms[sym]].frame_bytes, rd<uint32_t>(d, o + 8));
          }
          o += 4 + sz;
        } else {
          o += fmt == 1 ? 2 : 4;  // EIFMT_NVAL: 2 bytes; EIFMT_BVAL / HVAL: 4
        }
      }
    }
    b += 63;
  }
  return res;
}

}  // namespace

// setmaxnreg.inc only takes registers that setmaxnreg.dec gave back inside the block, so the
// warp-specialized kernel's budget (WsConfig: scorer, consumer and producer registers) holds only
// when ptxas allocated exactly kLaunchRegs per thread at launch; with any other allocation the
// consumers wait forever (a hang, not an error). __launch_bounds__(384, 1) gives ptxas that cap;
// this test fails CI if a change makes it allocate anything else, or if any kernel of the library
// uses local memory (a register spill: STYLE.md, a defect in a release kernel).
TEST(KernelConfig, KernelsHaveTheirRegistersAndNoSpills) {
#ifndef SMLA_CUDA_LIBRARY
  GTEST_SKIP() << "CPU-only build: no CUDA kernels compiled";
#else
  std::ifstream f(SMLA_CUDA_LIBRARY, std::ios::binary);
  ASSERT_TRUE(f.good()) << "cannot read " << SMLA_CUDA_LIBRARY;
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  int ws_kernels = 0, kernels = 0;
  for (const auto& [name, r] : cubin_resources(bytes)) {
    ++kernels;
    EXPECT_EQ(r.frame_bytes, 0) << name << ": local memory (spills)";
    // swapab (SwabConfig): the same setmaxnreg budget, from the same launch allocation
    if (name.find("sparse_mla_swapab_kernel") != std::string::npos) EXPECT_EQ(r.regs, k::WsConfig::kLaunchRegs) << name;
    if (name.find("sparse_mla_ws_kernel") == std::string::npos) continue;
    ++ws_kernels;
    EXPECT_EQ(r.regs, k::WsConfig::kLaunchRegs) << name;
  }
  EXPECT_GE(kernels, ws_kernels);
  EXPECT_GE(ws_kernels, 1) << "no warp-specialized kernel found in the sm_90a cubins of " << SMLA_CUDA_LIBRARY
                           << " (a compressed fatbin? this test reads uncompressed cubins)";
#endif
}
