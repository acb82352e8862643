// Fixed-width types and small helpers for NVRTC, which compiles these templates without the
// toolkit's headers.
#pragma once

namespace moejit {

using int8 = signed char;
using uint8 = unsigned char;
using int16 = short;
using uint16 = unsigned short;
using int32 = int;
using uint32 = unsigned int;
using int64 = long long;
using uint64 = unsigned long long;

template <typename T>
__device__ __forceinline__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

template <typename T>
__device__ __forceinline__ constexpr T min_of(T a, T b) {
  return a < b ? a : b;
}

template <typename T>
__device__ __forceinline__ constexpr T max_of(T a, T b) {
  return a < b ? b : a;
}

}  // namespace moejit

namespace moejit {

template <bool C, typename A, typename B>
struct Select {
  using type = A;
};
template <typename A, typename B>
struct Select<false, A, B> {
  using type = B;
};

}  // namespace moejit
