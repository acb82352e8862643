#include "problem_args.hpp"

#include <fmt/format.h>

#include <limits>

namespace moejit::cli {

MoeProblem parse_dims(const Args& a) {
  MoeProblem p{1, 128, 2048, 768, 8, DType::kBF16, Mode::kTraining};
  if (a.has("shape")) {
    // Each dimension is an int in MoeProblem: 2^32 + 128 must not wrap to 128.
    auto v = a.get_ints("shape", 1, std::numeric_limits<int>::max());
    if (v.size() != 4) throw InvalidArgument("--shape", "expected E,H,I,K");
    p.experts = static_cast<int>(v[0]);
    p.hidden = static_cast<int>(v[1]);
    p.intermediate = static_cast<int>(v[2]);
    p.topk = static_cast<int>(v[3]);
  }
  if (a.has("dtype")) p.dtype = parse_dtype(a.get("dtype"));
  if (p.topk > p.experts) {
    throw InvalidArgument("--shape", fmt::format("E={} H={} I={} K={} is not a valid problem", p.experts, p.hidden,
                                                 p.intermediate, p.topk));
  }
  return p;
}

std::vector<long long> parse_tokens(const Args& a, const std::vector<long long>& fallback) {
  return a.has("tokens") ? a.get_ints("tokens", 1, kNoMax) : fallback;
}

long long parse_token(const Args& a, long long fallback) { return a.get_int("tokens", fallback, 1, kNoMax); }

Mode parse_mode(const std::string& name) {
  if (name == "train") return Mode::kTraining;
  if (name == "infer") return Mode::kInference;
  if (name == "memeff") return Mode::kMemoryEfficient;
  throw InvalidArgument("--mode", fmt::format("unknown mode '{}' (train, infer, memeff)", name));
}

}  // namespace moejit::cli
