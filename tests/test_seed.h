// The seed of a randomised test: SY_TEST_SEED=N reruns a failure exactly; otherwise a fresh seed
// every run. SY_SEED_TRACE(seed) names it in every failure of the enclosing scope, with the rerun
// line.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace sy::test {

inline uint64_t test_seed() {
  if (const char* env = std::getenv("SY_TEST_SEED"); env && *env)
    return std::strtoull(env, nullptr, 10);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

inline std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (rerun with SY_TEST_SEED=" + std::to_string(seed) + ")";
}

}  // namespace sy::test

#define SY_SEED_TRACE(seed) SCOPED_TRACE(::sy::test::seed_note(seed))
