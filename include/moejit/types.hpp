#pragma once

#include <string>

namespace moejit {

enum class DType : int { kBF16 = 0, kFP16 = 1 };

const char* dtype_name(DType d) noexcept;  // "bf16", "fp16"
DType parse_dtype(const std::string& name);  // throws InvalidArgument

}  // namespace moejit
