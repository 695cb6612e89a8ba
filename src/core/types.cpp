#include "smla/types.h"

namespace smla {

std::string_view to_string(DType t) {
  switch (t) {
    case DType::kBF16: return "bf16";
    case DType::kFP16: return "fp16";
    case DType::kFP32: return "f32";
    case DType::kE4M3: return "e4m3";
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
  }
  return "?";
}

std::string_view to_string(KvFormat f) {
  switch (f) {
    case KvFormat::kBF16: return "bf16";
    case KvFormat::kFP16: return "fp16";
    case KvFormat::kFP8E4M3: return "fp8_e4m3";
    case KvFormat::kFP8DsMla: return "fp8_ds_mla";
    case KvFormat::kNvFP4DsMla: return "nvfp4_ds_mla";
  }
  return "?";
}

std::string_view to_string(LseMode m) {
  switch (m) {
    case LseMode::kOff: return "off";
    case LseMode::kBaseE: return "e";
    case LseMode::kBase2: return "2";
  }
  return "?";
}

std::string_view to_string(ScorePrecision s) {
  switch (s) {
    case ScorePrecision::kBF16: return "bf16";
    case ScorePrecision::kFP8: return "fp8";
    case ScorePrecision::kAuto: return "auto";
  }
  return "?";
}

int dtype_bytes(DType t) {
  switch (t) {
    case DType::kBF16:
    case DType::kFP16: return 2;
    case DType::kFP32:
    case DType::kI32: return 4;
    case DType::kE4M3:
    case DType::kU8: return 1;
  }
  return 0;
}

KvFormat parse_kv_format(std::string_view n) {
  if (n == "bf16" || n == "auto") return KvFormat::kBF16;
  if (n == "fp16") return KvFormat::kFP16;
  if (n == "fp8_e4m3" || n == "fp8") return KvFormat::kFP8E4M3;
  if (n == "fp8_ds_mla") return KvFormat::kFP8DsMla;
  if (n == "nvfp4_ds_mla") return KvFormat::kNvFP4DsMla;
  fail("unknown KV format '" + std::string(n) +
       "'; use one of bf16, fp16, fp8_e4m3, fp8_ds_mla, nvfp4_ds_mla");
}

DType parse_dtype(std::string_view n) {
  if (n == "bf16") return DType::kBF16;
  if (n == "fp16" || n == "f16") return DType::kFP16;
  if (n == "f32" || n == "fp32") return DType::kFP32;
  if (n == "e4m3" || n == "fp8_e4m3") return DType::kE4M3;
  if (n == "u8") return DType::kU8;
  if (n == "i32") return DType::kI32;
  fail("unknown dtype '" + std::string(n) + "'; use one of bf16, fp16, f32, e4m3, u8, i32");
}

ScorePrecision parse_score_precision(std::string_view n) {
  if (n == "bf16") return ScorePrecision::kBF16;
  if (n == "fp8") return ScorePrecision::kFP8;
  if (n == "auto") return ScorePrecision::kAuto;
  fail("unknown score precision '" + std::string(n) + "'; use auto, bf16 or fp8");
}

}  // namespace smla
