// Host conversions between float/double and the 16-bit storage types (bf16, IEEE fp16), for
// tests and benchmarks that prepare device inputs and judge device outputs. All conversions
// round to nearest even, keep NaN a NaN and handle subnormals.
#pragma once

#include <cstdint>
#include <vector>

#include "moejit/types.hpp"

namespace moejit {

std::uint16_t float_to_bf16(float value);
float bf16_to_float(std::uint16_t bits);
std::uint16_t float_to_fp16(float value);  // overflows to +-inf
float fp16_to_float(std::uint16_t bits);

// value rounded once (not via float, which would round twice) to `type` and widened back.
double round_to(DType type, double value);

std::vector<std::uint16_t> to_storage(DType type, const std::vector<double>& values);
std::vector<double> from_storage(DType type, const std::vector<std::uint16_t>& bits);

}  // namespace moejit
