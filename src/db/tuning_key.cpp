#include "db/tuning_key.hpp"

#include <fmt/format.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/json_int.hpp"
#include "moejit/error.hpp"

namespace moejit::db {
namespace {

void check_text(const char* field, const std::string& value) {
  if (value.empty()) throw InvalidArgument(field, "must not be empty");
  // '|' separates the fields of id(); allowing it would let two keys share one id.
  if (value.find('|') != std::string::npos) throw InvalidArgument(field, "must not contain '|': '" + value + "'");
}

void check_positive(const char* field, int value) {
  if (value <= 0) throw InvalidArgument(field, fmt::format("must be positive, got {}", value));
}

}  // namespace

std::string TuningKey::id() const {
  return fmt::format("{}|{}|{}|{}|H{}|I{}|E{}|K{}|bm{}|tma{}|tpe{}|{}", device, arch, role_name(role), dtype_name(dtype),
                     hidden, intermediate, experts, topk, block_m, use_tma ? 1 : 0, tpe_bucket, mode);
}

bool is_valid_mode(const std::string& mode) { return mode == "train" || mode == "infer" || mode == "memeff"; }

void TuningKey::validate() const {
  check_text("device", device);
  check_text("arch", arch);
  check_positive("hidden", hidden);
  check_positive("intermediate", intermediate);
  check_positive("experts", experts);
  check_positive("topk", topk);
  if (block_m < 0) throw InvalidArgument("block_m", fmt::format("must not be negative, got {}", block_m));
  if (tpe_bucket < kMinTpeBucket || tpe_bucket > kMaxTpeBucket || (tpe_bucket & (tpe_bucket - 1)) != 0) {
    throw InvalidArgument("tpe_bucket", fmt::format("must be a power of two in [{}, {}], got {}", kMinTpeBucket,
                                                    kMaxTpeBucket, tpe_bucket));
  }
  if (!is_valid_mode(mode)) throw InvalidArgument("mode", "must be train, infer or memeff, got '" + mode + "'");
}

int tpe_bucket(long long pairs, int experts) {
  if (experts <= 0) throw InvalidArgument("experts", fmt::format("must be positive, got {}", experts));
  const long long load = pairs <= 0 ? 0 : (pairs + experts - 1) / experts;
  int bucket = kMinTpeBucket;
  while (bucket < load && bucket < kMaxTpeBucket) bucket *= 2;
  return bucket;
}

bool closer_bucket(int candidate, int best, int wanted) {
  const auto distance = [wanted](int bucket) {
    return std::abs(std::log2(static_cast<double>(bucket)) - std::log2(static_cast<double>(wanted)));
  };
  const double to_candidate = distance(candidate), to_best = distance(best);
  return to_candidate < to_best || (to_candidate == to_best && candidate > best);
}

void to_json(nlohmann::json& j, const TuningKey& k) {
  j = nlohmann::json{{"device", k.device},
                     {"arch", k.arch},
                     {"role", role_name(k.role)},
                     {"dtype", dtype_name(k.dtype)},
                     {"hidden", k.hidden},
                     {"intermediate", k.intermediate},
                     {"experts", k.experts},
                     {"topk", k.topk},
                     {"block_m", k.block_m},
                     {"use_tma", k.use_tma},
                     {"tpe_bucket", k.tpe_bucket},
                     {"mode", k.mode}};
}

void from_json(const nlohmann::json& j, TuningKey& k) {
  k.device = j.at("device").get<std::string>();
  k.arch = j.at("arch").get<std::string>();
  k.role = parse_role(j.at("role").get<std::string>());
  k.dtype = parse_dtype(j.at("dtype").get<std::string>());
  k.hidden = json_int(j, "hidden");
  k.intermediate = json_int(j, "intermediate");
  k.experts = json_int(j, "experts");
  k.topk = json_int(j, "topk");
  k.block_m = json_int(j, "block_m");
  k.use_tma = j.at("use_tma").get<bool>();
  k.tpe_bucket = json_int(j, "tpe_bucket");
  k.mode = j.at("mode").get<std::string>();
  k.validate();
}

}  // namespace moejit::db
