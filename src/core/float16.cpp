#include "core/float16.hpp"

#include <bit>
#include <cmath>

namespace moejit {
namespace {

// double -> float rounding to odd: the inexact result keeps a sticky last bit, so a second
// rounding to nearest into a format at least two bits narrower (bf16: 8, fp16: 11 of float's 24)
// equals rounding the double directly. Plain double -> float -> 16-bit can round twice wrongly.
float to_float_round_odd(double value) {
  float f = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(f) == value) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(value)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(f) | 1u);
}

std::uint16_t double_to_storage(DType type, double value) {
  const float f = to_float_round_odd(value);
  return type == DType::kFP16 ? float_to_fp16(f) : float_to_bf16(f);
}

double storage_to_double(DType type, std::uint16_t bits) {
  return type == DType::kFP16 ? fp16_to_float(bits) : bf16_to_float(bits);
}

}  // namespace

std::uint16_t float_to_bf16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  // Truncating a NaN whose payload sits in the low half would give inf: force the quiet bit.
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
  const std::uint32_t bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + bias) >> 16);
}

float bf16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

std::uint16_t float_to_fp16(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  const std::uint32_t exponent = abs >> 23;  // biased by 127
  if (abs > 0x7F800000u) return sign | 0x7E00u | static_cast<std::uint16_t>((abs >> 13) & 0x3FFu);
  if (exponent >= 143) return sign | 0x7C00u;  // |value| >= 2^16, inf included

  // Keep `shift` low bits off the 24-bit significand, rounding to nearest even. A carry out of
  // the mantissa lands in the exponent field, which is exactly the next binade (or inf).
  auto round_shift = [](std::uint32_t significand, std::uint32_t shift) {
    std::uint32_t kept = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) ++kept;
    return kept;
  };
  if (exponent >= 113) {  // normal half: rebias the exponent, keep 10 of 23 mantissa bits
    const std::uint32_t rebased = ((exponent - 112) << 23) | (abs & 0x7FFFFFu);
    return sign | static_cast<std::uint16_t>(round_shift(rebased, 13));
  }
  // Subnormal half, in units of 2^-24: significand * 2^(exponent - 126). Float subnormals
  // (exponent 0) and anything below 2^-25 round to zero.
  const std::uint32_t shift = 126 - exponent;
  if (shift > 24) return sign;
  return sign | static_cast<std::uint16_t>(round_shift((abs & 0x7FFFFFu) | 0x800000u, shift));
}

float fp16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

double round_to(DType type, double value) { return storage_to_double(type, double_to_storage(type, value)); }

std::vector<std::uint16_t> to_storage(DType type, const std::vector<double>& values) {
  std::vector<std::uint16_t> bits(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bits[i] = double_to_storage(type, values[i]);
  return bits;
}

std::vector<double> from_storage(DType type, const std::vector<std::uint16_t>& bits) {
  std::vector<double> values(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) values[i] = storage_to_double(type, bits[i]);
  return values;
}

}  // namespace moejit
