// Shared pieces of the GPU tests: a fresh random seed per test (printed by each test on failure),
// and the skip rule: GPU tests run only on an SM90 device and say so when they skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>

#include "smla/cuda.h"

namespace smla::test {

// A fresh seed per test (printed by the tests' traces); SMLA_TEST_SEED=<n> replays a failing one.
inline uint64_t fresh_seed() {
  if (const char* e = std::getenv("SMLA_TEST_SEED"); e != nullptr && *e != '\0') return std::strtoull(e, nullptr, 10);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

inline bool have_sm90() {
  if (smla::cuda::device_count() == 0) return false;
  const auto d = smla::cuda::device_info(0);
  return d.cc_major == 9 && d.cc_minor == 0;
}

}  // namespace smla::test

#define REQUIRE_GPU()                                                                                  \
  do {                                                                                                 \
    if (!smla::test::have_sm90()) GTEST_SKIP() << "no SM90 CUDA device: GPU tests need an H100/H200"; \
  } while (0)
