#include "moejit/types.hpp"

#include "moejit/moejit.hpp"

#include "moejit/error.hpp"

namespace moejit {

const char* dtype_name(DType d) noexcept { return d == DType::kFP16 ? "fp16" : "bf16"; }

DType parse_dtype(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "fp16") return DType::kFP16;
  throw InvalidArgument("dtype", "unknown dtype '" + name + "' (bf16, fp16)");
}

const char* mode_name(Mode m) noexcept {
  switch (m) {
    case Mode::kTraining: return "train";
    case Mode::kInference: return "infer";
    case Mode::kMemoryEfficient: return "memeff";
  }
  return "unknown";
}

}  // namespace moejit
