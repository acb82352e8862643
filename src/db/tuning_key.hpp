// The tuning key: everything a tuned winner depends on (DESIGN.md, "The tuning database").
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

#include "jit/role.hpp"
#include "moejit/types.hpp"

namespace moejit::db {

inline constexpr int kMinTpeBucket = 16;
inline constexpr int kMaxTpeBucket = 4096;

struct TuningKey {
  std::string device;  // SKU name as the driver reports it: "NVIDIA H200"
  std::string arch;    // NVRTC target: "sm_90a"
  Role role = Role::kRouting;
  DType dtype = DType::kBF16;
  int hidden = 0;        // H
  int intermediate = 0;  // I
  int experts = 0;       // E
  int topk = 0;          // K
  int block_m = 0;       // token rows per tile the routing layout was built for
  bool use_tma = false;
  int tpe_bucket = 0;    // tokens-per-expert bucket, see tpe_bucket()
  std::string mode;      // "train", "infer" or "memeff"

  // Canonical and unique: "NVIDIA H200|sm_90a|fwd_up|bf16|H2048|I768|E128|K8|bm64|tma0|tpe64|train".
  // Stored in databases, so its format must never change.
  std::string id() const;

  // Throws InvalidArgument naming the first bad field: empty or '|'-containing strings,
  // non-positive dims, negative block_m, a bucket that is not a power of two in
  // [kMinTpeBucket, kMaxTpeBucket], an unknown mode.
  void validate() const;

  friend bool operator==(const TuningKey&, const TuningKey&) = default;
};

// The tokens-per-expert bucket for `pairs` = T·K (token, slot) pairs over `experts` experts:
// the mean load TK/E rounded UP to a power of two (so bucket b covers loads in (b/2, b]),
// then clamped to [16, 4096]. E.g. TK=8192, E=128 -> 64; TK=8193 -> ceil(64.01)=65 -> 128;
// TK=0 -> 16; TK=1<<20, E=128 -> 8192 -> 4096. Throws InvalidArgument when experts <= 0.
int tpe_bucket(long long pairs, int experts);

// Whether a row of bucket `candidate` serves a key of bucket `wanted` better than one of bucket
// `best`: nearer in log2 distance, ties to the larger bucket, whose tiles were measured with more
// work per expert. Buckets are positive.
bool closer_bucket(int candidate, int best, int wanted);

// Whether `mode` is one of the modes a key may carry.
bool is_valid_mode(const std::string& mode);

void to_json(nlohmann::json& j, const TuningKey& k);
// Requires every field; throws nlohmann::json exceptions or InvalidArgument (validate()).
void from_json(const nlohmann::json& j, TuningKey& k);

}  // namespace moejit::db
