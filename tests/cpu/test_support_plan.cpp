// Support checks (smla/support.h) and the pure planning heuristics (smla/plan.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "smla/api.h"
#include "smla/plan.h"
#include "smla/support.h"

using smla::DType;
using smla::Geometry;
using smla::KvFormat;

namespace {

constexpr KvFormat kFormats[] = {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kFP8E4M3, KvFormat::kFP8DsMla,
                                 KvFormat::kNvFP4DsMla};

Geometry geo(KvFormat f, DType q, int heads = 128, int rope = 64, int topk = 2048) {
  Geometry g;
  g.format = f;
  g.q_dtype = q;
  g.num_heads = heads;
  g.rope_dim = rope;
  g.topk = topk;
  return g;
}

smla::DeviceInfo device(int major, int minor, const char* name) {
  smla::DeviceInfo d;
  d.ordinal = 0;
  d.cc_major = major;
  d.cc_minor = minor;
  d.num_sms = 132;
  d.smem_per_block_optin = 232448;
  d.name = name;
  return d;
}

// A reason is one non-empty sentence that says what to do instead.
void expect_reason(const smla::Support& s, const std::string& must_contain, const std::string& what) {
  ASSERT_FALSE(s.ok()) << what;
  EXPECT_GT(s.reason.size(), 15u) << what;
  EXPECT_EQ(s.reason.find('\n'), std::string::npos) << what << ": " << s.reason;
  const bool has_fix = s.reason.find("use") != std::string::npos || s.reason.find("cast") != std::string::npos ||
                       s.reason.find("pass") != std::string::npos || s.reason.find("call") != std::string::npos ||
                       s.reason.find("must be") != std::string::npos || s.reason.find("supports") != std::string::npos;
  EXPECT_TRUE(has_fix) << what << ": reason names no fix: " << s.reason;
  EXPECT_NE(s.reason.find(must_contain), std::string::npos) << what << ": " << s.reason;
}

}  // namespace

TEST(Support, CommonAcceptsEveryDocumentedPairing) {
  for (KvFormat f : kFormats)
    for (int rope : {64, 0})
      for (int heads : {1, 3, 16, 48, 128, 256})
        for (int topk : {1, 100, 2048}) {
          const std::string what = std::string(smla::to_string(f)) + " H=" + std::to_string(heads);
          const DType q16 = f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
          EXPECT_TRUE(smla::support_common(geo(f, q16, heads, rope, topk)).ok()) << what;
          if (f != KvFormat::kBF16 && f != KvFormat::kFP16) {
            // quantized caches take either 16-bit q
            EXPECT_TRUE(smla::support_common(geo(f, DType::kFP16, heads, rope, topk)).ok()) << what;
          }
        }
  Geometry g = geo(KvFormat::kFP8E4M3, DType::kE4M3);
  g.lse_mode = smla::LseMode::kBase2;
  g.sink = true;
  EXPECT_TRUE(smla::support_common(g).ok());
}

TEST(Support, CommonReasons) {
  expect_reason(smla::support_common(geo(KvFormat::kBF16, DType::kBF16, 0)), "num_heads", "H = 0");
  expect_reason(smla::support_common(geo(KvFormat::kBF16, DType::kBF16, 128, 32)), "576", "rope 32");
  expect_reason(smla::support_common(geo(KvFormat::kBF16, DType::kBF16, 128, 64, 0)), "top-k", "K = 0");
  expect_reason(smla::support_common(geo(KvFormat::kBF16, DType::kFP32)), "bf16", "f32 q");
  expect_reason(smla::support_common(geo(KvFormat::kBF16, DType::kI32)), "bf16", "i32 q");
  for (KvFormat f : {KvFormat::kBF16, KvFormat::kFP16, KvFormat::kNvFP4DsMla})
    expect_reason(smla::support_common(geo(f, DType::kE4M3)), "fp8_e4m3, fp8_ds_mla",
                  "e4m3 q with " + std::string(smla::to_string(f)));
  EXPECT_TRUE(smla::support_common(geo(KvFormat::kFP8DsMla, DType::kE4M3)).ok()) << "e4m3 q with fp8_ds_mla";
  expect_reason(smla::support_common(geo(KvFormat::kFP16, DType::kBF16)), "fp16", "bf16 q, fp16 cache");
  expect_reason(smla::support_common(geo(KvFormat::kBF16, DType::kFP16)), "bf16", "fp16 q, bf16 cache");
}

TEST(Support, CpuSupportsWhatCommonSupports) {
  for (KvFormat f : kFormats)
    for (DType q : {DType::kBF16, DType::kFP16, DType::kE4M3, DType::kFP32})
      for (int heads : {0, 1, 128, 512})
        for (int rope : {0, 64, 16}) {
          const Geometry g = geo(f, q, heads, rope);
          EXPECT_EQ(smla::support_cpu(g).reason, smla::support_common(g).reason);
        }
}

TEST(Support, CudaNeedsTheBuildADeviceAndSm90) {
  const Geometry g = geo(KvFormat::kBF16, DType::kBF16);
  const auto h200 = device(9, 0, "NVIDIA H200");
  EXPECT_TRUE(smla::support_cuda(g, h200, true).ok()) << smla::support_cuda(g, h200, true).reason;
  EXPECT_TRUE(smla::support_cuda(geo(KvFormat::kFP16, DType::kFP16, 16, 0, 100), h200, true).ok());
  expect_reason(smla::support_cuda(g, h200, false), "CPU", "no CUDA build");
  expect_reason(smla::support_cuda(g, smla::DeviceInfo{}, true), "CPU", "no device");
  for (auto [maj, min] : {std::pair{8, 0}, std::pair{8, 9}, std::pair{10, 0}, std::pair{12, 0}, std::pair{9, 1}}) {
    const auto s = smla::support_cuda(g, device(maj, min, "other GPU"), true);
    expect_reason(s, "SM90", "sm_" + std::to_string(maj) + std::to_string(min));
    EXPECT_NE(s.reason.find("sm_" + std::to_string(maj) + std::to_string(min)), std::string::npos) << s.reason;
  }
  // the shared rules still apply on the device
  expect_reason(smla::support_cuda(geo(KvFormat::kBF16, DType::kFP16), h200, true), "bf16", "fp16 q, bf16 cache");
}

TEST(Support, CudaAnswersEveryGeometryWithOkOrAReason) {
  const auto h200 = device(9, 0, "NVIDIA H200");
  for (KvFormat f : kFormats)
    for (int heads : {1, 3, 48, 128, 129, 256})
      for (int rope : {64, 0}) {
        const DType q = f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16;
        const Geometry g = geo(f, q, heads, rope, 100);
        const auto s = smla::support_cuda(g, h200, true);
        const std::string what = std::string(smla::to_string(f)) + " H=" + std::to_string(heads);
        if (s.ok()) {
          EXPECT_FALSE(smla::cuda_kernel_name(g).empty()) << what;
        } else {
          expect_reason(s, "", what);
        }
      }
}

TEST(Support, Fp8ScoresNeedAnE4m3QWithAnFp8Cache) {
  const auto h200 = device(9, 0, "NVIDIA H200");
  EXPECT_EQ(smla::parse_score_precision("bf16"), smla::ScorePrecision::kBF16);
  EXPECT_EQ(smla::parse_score_precision("fp8"), smla::ScorePrecision::kFP8);
  EXPECT_EQ(smla::parse_score_precision("auto"), smla::ScorePrecision::kAuto);
  EXPECT_EQ(smla::to_string(smla::ScorePrecision::kFP8), "fp8");
  EXPECT_EQ(smla::to_string(smla::ScorePrecision::kBF16), "bf16");
  EXPECT_EQ(smla::to_string(smla::ScorePrecision::kAuto), "auto");
  EXPECT_THROW(smla::parse_score_precision("fp16"), smla::Error);
  try {
    smla::parse_score_precision("f8");
    ADD_FAILURE() << "expected an error";
  } catch (const smla::Error& e) {
    EXPECT_NE(std::string(e.what()).find("use auto, bf16 or fp8"), std::string::npos) << e.what();
  }
  for (KvFormat f : kFormats) {
    Geometry g = geo(f, f == KvFormat::kFP16 ? DType::kFP16 : DType::kBF16);
    g.score_precision = smla::ScorePrecision::kFP8;
    expect_reason(smla::support_common(g), "score precision fp8", "fp8 scores, 16-bit q");
    expect_reason(smla::support_cuda(g, h200, true), "score precision fp8", "fp8 scores on the GPU, 16-bit q");
  }
  for (KvFormat f : {KvFormat::kFP8E4M3, KvFormat::kFP8DsMla}) {
    Geometry g = geo(f, DType::kE4M3);
    // The default (auto) scores an e4m3 q on the fp8 tensor cores; bf16 scores widen it.
    EXPECT_EQ(g.score_precision, smla::ScorePrecision::kAuto);
    EXPECT_TRUE(smla::support_cuda(g, h200, true).ok());
    ASSERT_NE(smla::cuda_variant_for(g, h200), nullptr);
    EXPECT_STREQ(smla::cuda_variant_for(g, h200)->name, "h64.ws.q8");
    g.score_precision = smla::ScorePrecision::kBF16;
    EXPECT_TRUE(smla::support_cuda(g, h200, true).ok());
    ASSERT_NE(smla::cuda_variant_for(g, h200), nullptr);
    EXPECT_STREQ(smla::cuda_variant_for(g, h200)->name, "h64.ws");
    g.score_precision = smla::ScorePrecision::kFP8;
    EXPECT_TRUE(smla::support_cpu(g).ok()) << "the reference takes any score precision";
    EXPECT_TRUE(smla::support_cuda(g, h200, true).ok()) << smla::support_cuda(g, h200, true).reason;
    const smla::CudaVariant* v = smla::cuda_variant_for(g, h200);
    ASSERT_NE(v, nullptr);
    EXPECT_STREQ(v->name, "h64.ws.q8");
    EXPECT_NE(std::string(v->notes).find("1e-2"), std::string::npos) << "the notes state the accuracy: " << v->notes;
    // the kernel's own limits still apply to the fp8 path, with its reason
    g.num_heads = 129;
    expect_reason(smla::support_cuda(g, h200, true), "128 heads", "fp8 scores, H = 129");
  }
  // Every variant answers every geometry; its workspace is the split-K scratch.
  for (const smla::CudaVariant& v : smla::cuda_variants()) {
    EXPECT_EQ(v.workspace(4, 128, 1), 0u) << v.name;
    EXPECT_EQ(v.workspace(4, 128, 8), smla::split_workspace_bytes(4, 128, 8)) << v.name;
  }
}

// resolve_score_precision: every format x q dtype x {auto, bf16, fp8}. An explicit choice stays as
// it is (support_common refuses fp8 where it cannot run); auto is fp8 exactly for an e4m3 q with an
// fp8_e4m3 / fp8_ds_mla cache (the two pairs listed by hand below).
// The swap-AB small-H kernel runs fp8_ds_mla at H <= 32 (N = 16 up to 16 heads, N = 32 above:
// docs/perf-history.md#s14-swapab-n32) with a bf16 q, and with an e4m3 q under score precision auto or
// bf16 (auto resolves to bf16 there); fp8_e4m3 at H <= 32 with bf16 scores; nvfp4_ds_mla at H <= 16; fp8
// scores asked for explicitly, everything else, and the reasons of what nothing runs stay with the
// 64-head kernels.
TEST(Support, SwapAbTakesSmallHeadFp8DsMlaWithABf16Q) {
  const auto h200 = device(9, 0, "NVIDIA H200");
  const int hmax = smla::kSwapAbMaxHeads;
  EXPECT_EQ(hmax, 32);
  EXPECT_EQ(smla::swapab_max_heads(KvFormat::kFP8DsMla), 32);
  EXPECT_EQ(smla::swapab_max_heads(KvFormat::kFP8E4M3), 32);
  EXPECT_EQ(smla::swapab_max_heads(KvFormat::kNvFP4DsMla), 16);
  auto ds = [&](int H) -> std::string { return H <= 32 ? "swapab" : "h64.ws"; };
  for (int H : {1, 8, 16, 17, 20, 24, 31, 32, 33, 48, 64, 96, 128}) {
    const smla::CudaVariant* v = smla::cuda_variant_for(geo(KvFormat::kFP8DsMla, DType::kBF16, H), h200);
    ASSERT_NE(v, nullptr) << H;
    EXPECT_EQ(std::string(v->name), ds(H)) << H;
    for (int rope : {64, 0}) {  // D = 512 too
      v = smla::cuda_variant_for(geo(KvFormat::kFP8DsMla, DType::kBF16, H, rope, 77), h200);
      ASSERT_NE(v, nullptr) << H;
      EXPECT_EQ(std::string(v->name), ds(H)) << H << " rope " << rope;
    }
    EXPECT_STREQ(smla::cuda_variant_for(geo(KvFormat::kBF16, DType::kBF16, H), h200)->name, "h64.ws") << H;
    // nvfp4_ds_mla rows: on swapab at H <= 16 only (D = 512 too)
    const bool nv = H <= 16;
    for (int rope : {64, 0})
      EXPECT_EQ(std::string(smla::cuda_variant_for(geo(KvFormat::kNvFP4DsMla, DType::kBF16, H, rope, 77), h200)->name),
                nv ? "swapab" : "h64.ws")
          << H << " rope " << rope;
    // fp8_e4m3 rows: on swapab at H <= 32
    const bool e4 = H <= 32;
    EXPECT_EQ(std::string(smla::cuda_variant_for(geo(KvFormat::kFP8E4M3, DType::kBF16, H), h200)->name),
              e4 ? "swapab" : "h64.ws")
        << H;
    Geometry q8 = geo(KvFormat::kFP8DsMla, DType::kE4M3, H);
    EXPECT_EQ(std::string(smla::cuda_variant_for(q8, h200)->name), H <= 32 ? "swapab" : "h64.ws.q8")
        << H << " auto";
    EXPECT_EQ(smla::resolve_score_precision(q8), H <= 32 ? smla::ScorePrecision::kBF16 : smla::ScorePrecision::kFP8)
        << H;
    q8.score_precision = smla::ScorePrecision::kBF16;
    EXPECT_EQ(std::string(smla::cuda_variant_for(q8, h200)->name), ds(H)) << H << " bf16";
    q8.score_precision = smla::ScorePrecision::kFP8;  // asked for: the fp8 tensor-core path
    EXPECT_STREQ(smla::cuda_variant_for(q8, h200)->name, "h64.ws.q8") << H << " fp8";
    // fp8_e4m3 keeps its fp8 default at every H; with bf16 scores asked for, an e4m3 q runs swapab at H <= 32
    Geometry e8 = geo(KvFormat::kFP8E4M3, DType::kE4M3, H);
    EXPECT_STREQ(smla::cuda_variant_for(e8, h200)->name, "h64.ws.q8") << H;
    e8.score_precision = smla::ScorePrecision::kBF16;
    EXPECT_EQ(std::string(smla::cuda_variant_for(e8, h200)->name), e4 ? "swapab" : "h64.ws") << H << " bf16";
  }
  // Nothing runs H = 129: the reason is the 64-head kernel's, not swapab's.
  expect_reason(smla::support_cuda(geo(KvFormat::kFP8DsMla, DType::kBF16, 129), h200, true), "128 heads", "H = 129");
  Geometry g = geo(KvFormat::kFP8DsMla, DType::kBF16, 16);
  expect_reason(smla::supports_sm90_swapab(geo(KvFormat::kBF16, DType::kBF16, 16), h200), "fp8_ds_mla", "bf16 rows");
  Geometry fp8 = geo(KvFormat::kFP8DsMla, DType::kE4M3, 16);
  fp8.score_precision = smla::ScorePrecision::kFP8;
  expect_reason(smla::supports_sm90_swapab(fp8, h200), "not fp8", "fp8 scores asked for");
  for (KvFormat f : {KvFormat::kFP8DsMla, KvFormat::kFP8E4M3})
    expect_reason(smla::supports_sm90_swapab(geo(f, DType::kBF16, 33), h200), "H <= 32", "H = 33");
  expect_reason(smla::supports_sm90_swapab(geo(KvFormat::kNvFP4DsMla, DType::kBF16, 17), h200), "H <= 16",
                "nvfp4_ds_mla H = 17");
  expect_reason(smla::supports_sm90_swapab(g, device(8, 0, "NVIDIA A100")), "SM90", "sm_80");
}

// The small-call rule (smla/support.h, kSwapAbN32MinRows): a swapab geometry at H > 16 runs h64.ws for
// calls of fewer than 32 rows, unless batch-invariant (one kernel at every T); H <= 16, the other variants
// and T >= 32 keep the table's choice; the kernel name of a call follows it.
TEST(Support, SmallCallsAtMoreThan16HeadsRunH64Ws) {
  const auto h200 = device(9, 0, "NVIDIA H200");
  EXPECT_EQ(smla::kSwapAbN32MinRows, 32);
  for (KvFormat f : {KvFormat::kFP8DsMla, KvFormat::kFP8E4M3})
    for (int H : {1, 16, 17, 24, 32, 33, 64})
      for (int64_t T : {int64_t(0), int64_t(1), int64_t(2), int64_t(31), int64_t(32), int64_t(33), int64_t(4096)})
        for (bool bi : {false, true}) {
          const Geometry g = geo(f, DType::kBF16, H);
          const smla::CudaVariant* table = smla::cuda_variant_for(g, h200);
          const smla::CudaVariant* v = smla::cuda_variant_for(g, h200, T, bi);
          ASSERT_NE(v, nullptr);
          const bool small = H > 16 && H <= 32 && T < 32 && !bi;
          EXPECT_EQ(std::string(v->name), small ? "h64.ws" : std::string(table->name))
              << smla::to_string(f) << " H " << H << " T " << T << " bi " << bi;
          if (!bi)
            EXPECT_EQ(smla::cuda_kernel_for(g, h200, T), smla::cuda_kernel_name(g) + "/" + v->name) << H << " " << T;
        }
  // an e4m3 q with fp8_e4m3 (auto: fp8 scores) and nvfp4_ds_mla at H = 17: the table's h64.ws.q8 / h64.ws at every T
  EXPECT_STREQ(smla::cuda_variant_for(geo(KvFormat::kFP8E4M3, DType::kE4M3, 24), h200, 1, false)->name, "h64.ws.q8");
  EXPECT_STREQ(smla::cuda_variant_for(geo(KvFormat::kNvFP4DsMla, DType::kBF16, 17), h200, 1, false)->name, "h64.ws");
  EXPECT_STREQ(smla::cuda_variant_for(geo(KvFormat::kNvFP4DsMla, DType::kBF16, 16), h200, 1, false)->name, "swapab");
}

TEST(Support, ResolveScorePrecision) {
  using SP = smla::ScorePrecision;
  const auto h200 = device(9, 0, "NVIDIA H200");
  for (KvFormat f : kFormats)
    for (DType q : {DType::kBF16, DType::kFP16, DType::kE4M3}) {
      const bool fp8_pair = (f == KvFormat::kFP8E4M3 || f == KvFormat::kFP8DsMla) && q == DType::kE4M3;
      const std::string what = std::string(smla::to_string(f)) + " / " + std::string(smla::to_string(q));
      Geometry g = geo(f, q);
      g.score_precision = SP::kBF16;
      EXPECT_EQ(smla::resolve_score_precision(g), SP::kBF16) << what;
      g.score_precision = SP::kFP8;
      EXPECT_EQ(smla::resolve_score_precision(g), SP::kFP8) << what;
      g.score_precision = SP::kAuto;
      EXPECT_EQ(smla::resolve_score_precision(g), fp8_pair ? SP::kFP8 : SP::kBF16) << what;
      // auto never adds a refusal of its own: it is supported exactly where bf16 scores are (with
      // the same reason), except for the fp8 pairs, where it is the fp8 path.
      Geometry b = g;
      b.score_precision = fp8_pair ? SP::kFP8 : SP::kBF16;
      EXPECT_EQ(smla::support_common(g).reason, smla::support_common(b).reason) << what;
      EXPECT_EQ(smla::support_cuda(g, h200, true).reason, smla::support_cuda(b, h200, true).reason) << what;
      const smla::CudaVariant* va = smla::cuda_variant_for(g, h200);
      const smla::CudaVariant* vb = smla::cuda_variant_for(b, h200);
      EXPECT_EQ(va, vb) << what;
      if (va != nullptr)
        EXPECT_STREQ(va->name, fp8_pair ? "h64.ws.q8" : "h64.ws")
            << what;
    }
  // the pairs the table lists as runnable on an SM90 GPU under auto (by hand)
  EXPECT_NE(smla::cuda_variant_for(geo(KvFormat::kFP8DsMla, DType::kE4M3), h200), nullptr);
  EXPECT_NE(smla::cuda_variant_for(geo(KvFormat::kFP8E4M3, DType::kE4M3), h200), nullptr);
  EXPECT_NE(smla::cuda_variant_for(geo(KvFormat::kFP8DsMla, DType::kBF16), h200), nullptr);
  EXPECT_EQ(smla::cuda_variant_for(geo(KvFormat::kNvFP4DsMla, DType::kE4M3), h200), nullptr);
}

// ---- plan.h ---------------------------------------------------------------------------------------
TEST(Plan, ChooseNumSplitsWorkedExamples) {
  // the examples of plan.h (132 SMs), worked by hand from the cost waves x tiles + (s > 1)
  EXPECT_EQ(smla::choose_num_splits(1, 2, 2048, 132), 32);   // 64 blocks, 1 tile each: cost 2
  EXPECT_EQ(smla::choose_num_splits(32, 2, 2048, 132), 2);   // 1 wave x 16 tiles (3: 2 waves x 11)
  EXPECT_EQ(smla::choose_num_splits(32, 1, 2048, 132), 4);   // 1 wave x 8 (5: 2 waves x 7)
  EXPECT_EQ(smla::choose_num_splits(128, 2, 2048, 132), 1);  // 256 blocks cover 132 SMs
  EXPECT_EQ(smla::choose_num_splits(1, 2, 100, 132), 1);     // 2 tiles = 1 tile + the merge: fewer
  // more, by the rule
  EXPECT_EQ(smla::choose_num_splits(128, 1, 2048, 132), 1);  // 32 tiles vs 2 waves x 16 + 1
  EXPECT_EQ(smla::choose_num_splits(132, 1, 2048, 132), 1);
  EXPECT_EQ(smla::choose_num_splits(66, 2, 2048, 132), 1);
  EXPECT_EQ(smla::choose_num_splits(3, 4, 2048, 132), 11);   // 132 blocks x 3 tiles: cost 4
  EXPECT_EQ(smla::choose_num_splits(1, 1, 64, 132), 1);      // one split's worth of entries
  EXPECT_EQ(smla::choose_num_splits(1, 1, 65, 132), 1);      // 2 tiles vs 1 + the merge
  EXPECT_EQ(smla::choose_num_splits(1, 1, 192, 132), 3);     // 3 tiles vs 1 + the merge
  EXPECT_EQ(smla::choose_num_splits(1, 1, 2048, 16), 16);    // 2 tiles + 1 (32: 2 waves x 1 + 1, a tie)
  EXPECT_EQ(smla::choose_num_splits(0, 2, 2048, 132), 1);    // empty call
  EXPECT_EQ(smla::choose_num_splits(int64_t(1) << 40, 2, 2048, 132), 1);
}

TEST(Plan, ChooseNumSplitsBounds) {
  for (int64_t t : {1, 2, 5, 17, 64, 200})
    for (int bpr : {1, 2, 4, 8})
      for (int k : {1, 63, 64, 65, 500, 2048, 4096})
        for (int sms : {16, 78, 114, 132}) {
          const int s = smla::choose_num_splits(t, bpr, k, sms);
          ASSERT_GE(s, 1);
          ASSERT_LE(s, smla::kMaxSplits);
          ASSERT_LE(s, (k + 63) / 64);
          ASSERT_EQ(s, smla::choose_num_splits(t, bpr, k, sms));  // a pure function
          if (t * bpr >= sms) {
            ASSERT_EQ(s, 1);
          }
        }
}

TEST(Plan, SplitWorkspaceBytes) {
  EXPECT_EQ(smla::split_workspace_bytes(1, 1, 1), 0u);
  EXPECT_EQ(smla::split_workspace_bytes(100, 128, 1), 0u);
  EXPECT_EQ(smla::split_workspace_bytes(0, 128, 8), 0u);
  // bf16 partial outputs (1024 B per (row, head, split)), fp32 LSEs (4 B), each part 256-aligned.
  EXPECT_EQ(smla::split_workspace_bytes(1, 1, 2), 2304u);         // 2048 + 8 = 2056 -> 9 * 256
  EXPECT_EQ(smla::split_workspace_bytes(3, 3, 3), 27904u);        // 27 * 1024 = 27648 (108 * 256) + 108 -> 109 * 256
  EXPECT_EQ(smla::split_workspace_bytes(4, 128, 8), 4210688u);    // 4096 * 1028, already a multiple of 256
  EXPECT_EQ(smla::split_workspace_bytes(65536, 128, 32), size_t(65536) * 128 * 32 * 1028);  // no int overflow
}

TEST(Plan, RowBucket) {
  EXPECT_EQ(smla::row_bucket(0), 0);
  EXPECT_EQ(smla::row_bucket(-5), 0);
  EXPECT_EQ(smla::row_bucket(1), 1);
  EXPECT_EQ(smla::row_bucket(2), 2);
  EXPECT_EQ(smla::row_bucket(3), 4);
  EXPECT_EQ(smla::row_bucket(5), 8);
  EXPECT_EQ(smla::row_bucket(64), 64);
  EXPECT_EQ(smla::row_bucket(65), 128);
  EXPECT_EQ(smla::row_bucket(65535), 65536);
  EXPECT_EQ(smla::row_bucket(65537), 131072);
  EXPECT_EQ(smla::row_bucket((int64_t(1) << 40) + 1), int64_t(1) << 41);
}
