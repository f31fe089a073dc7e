// Small numeric helpers shared by the CPU kernels' sources.
#pragma once

#include <type_traits>

// 2^f for f in [0, 1): degree-6 least-squares coefficients, highest first (error 3e-9).
constexpr float EXP2_FRACTION[] = {2.1877504771450245e-4f, 1.2387821474991664e-3f, 9.684580453165878e-3f,
                                   5.548042632518072e-2f,  2.4023050204515808e-1f, 6.931469286930156e-1f,
                                   1.0000000025868891f};

// x rounded to T's precision, as a float (the identity for float): where torch's op-by-op reference rounds.
template <typename T>
inline float round_to(float x) {
  if constexpr (std::is_same_v<T, float>) return x;
  else return static_cast<float>(static_cast<T>(x));
}
