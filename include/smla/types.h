// smla/types.h — element types, KV row formats, LSE modes and the one error type.
// Host-only, no CUDA headers: every layer may include it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace smla {

// Element types that cross the API.
enum class DType : uint8_t { kBF16, kFP16, kFP32, kE4M3, kU8, kI32 };

// KV cache row formats (DESIGN.md §3).
enum class KvFormat : uint8_t { kBF16, kFP16, kFP8E4M3, kFP8DsMla, kNvFP4DsMla };

// What the kernel returns as LSE: nothing, natural log, or log2.
enum class LseMode : uint8_t { kOff, kBaseE, kBase2 };

// How the scores S = q·k are multiplied (a plan option, DESIGN.md §6): kBF16 widens every operand
// to bf16 (products exact, fp32 sums); kFP8 multiplies an e4m3 q with fp8 rows on the fp8 tensor
// cores (faster; products exact, but summed with fewer bits: DESIGN.md §8's fp8-product bar);
// kAuto (the default) is kFP8 for an e4m3 q with an fp8 cache, kBF16 otherwise, except fp8_ds_mla
// at H <= 32 (the swap-AB kernel's widened bf16 scores are faster there): resolve_score_precision in
// smla/support.h.
enum class ScorePrecision : uint8_t { kBF16, kFP8, kAuto };

inline constexpr int kLatentDim = 512;  // NoPE / V width
inline constexpr int kRopeDim = 64;     // RoPE width when present
inline constexpr int kMaxNativeHeads = 128;

// The one exception type. Messages name the argument and the fix; kind() tells a bad argument
// from a geometry that no backend here supports (the C ABI maps it to a status code).
class Error : public std::runtime_error {
 public:
  enum class Kind { kInvalidArgument, kUnsupported, kInternal };
  explicit Error(const std::string& msg, Kind kind = Kind::kInvalidArgument)
      : std::runtime_error(msg), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

[[noreturn]] inline void fail(const std::string& msg) { throw Error(msg); }
[[noreturn]] inline void fail_unsupported(const std::string& msg) { throw Error(msg, Error::Kind::kUnsupported); }

#define SMLA_CHECK(cond, msg)                 \
  do {                                        \
    if (!(cond)) ::smla::fail(std::string(msg)); \
  } while (0)

std::string_view to_string(DType t);
std::string_view to_string(KvFormat f);
std::string_view to_string(LseMode m);
std::string_view to_string(ScorePrecision s);  // "bf16" | "fp8" | "auto"
int dtype_bytes(DType t);

// Parse the names used on the CLI, in safetensors metadata and in Python
// ("bf16", "fp16", "fp8_e4m3", "fp8_ds_mla", "nvfp4_ds_mla"). Throws Error on unknown names.
KvFormat parse_kv_format(std::string_view name);
DType parse_dtype(std::string_view name);  // "bf16", "fp16", "f32", "e4m3", "u8", "i32"
ScorePrecision parse_score_precision(std::string_view name);  // "auto", "bf16", "fp8"

}  // namespace smla
