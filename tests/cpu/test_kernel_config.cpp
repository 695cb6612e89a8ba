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
