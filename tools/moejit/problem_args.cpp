#include "problem_args.hpp"

#include <fmt/format.h>

#include <limits>

#include "moe/validate.hpp"

namespace moejit::cli {
namespace {

// The library's own checks (limits in README), reported against the option that set the value.
void check_problem(const char* option, const MoeProblem& p) {
  try {
    validate_problem(p);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(option, e.what());
  }
}

}  // namespace

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
  if (a.has("dtype")) p.dtype = as_option("--dtype", [&] { return parse_dtype(a.get("dtype")); });
  check_problem("--shape", p);
  return p;
}

std::vector<long long> parse_tokens(const Args& a, const MoeProblem& dims, const std::vector<long long>& fallback) {
  const std::vector<long long> tokens = a.has("tokens") ? a.get_ints("tokens", 1, kNoMax) : fallback;
  for (long long t : tokens) {
    MoeProblem p = dims;
    p.tokens = t;
    check_problem("--tokens", p);
  }
  return tokens;
}

long long parse_token(const Args& a, const MoeProblem& dims, long long fallback) {
  MoeProblem p = dims;
  p.tokens = a.get_int("tokens", fallback, 1, kNoMax);
  check_problem("--tokens", p);
  return p.tokens;
}

Mode parse_mode(const std::string& name) {
  if (name == "train") return Mode::kTraining;
  if (name == "infer") return Mode::kInference;
  if (name == "memeff") return Mode::kMemoryEfficient;
  throw InvalidArgument("--mode", fmt::format("unknown mode '{}' (train, infer, memeff)", name));
}

}  // namespace moejit::cli
