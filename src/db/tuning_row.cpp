#include "db/tuning_row.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/json_int.hpp"
#include "jit/nvrtc.hpp"
#include "jit/template_hash.hpp"
#include "moejit/error.hpp"
#include "moejit/version.hpp"

namespace moejit::db {
namespace {

nlohmann::json time_to_json(double ms) { return std::isnan(ms) ? nlohmann::json(nullptr) : nlohmann::json(ms); }

double time_from_json(const nlohmann::json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

}  // namespace

Provenance current_provenance(int driver_version) {
  return Provenance{jit::nvrtc_version(), driver_version, jit::template_hash(), kLibraryVersion, utc_timestamp()};
}

std::string utc_timestamp() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                     tm.tm_min, tm.tm_sec);
}

bool same_build(const Provenance& a, const Provenance& b) {
  return a.template_hash == b.template_hash && a.nvrtc_version == b.nvrtc_version;
}

bool is_stale(const TuningRow& row, const Provenance& current) { return !same_build(row.provenance, current); }

void validate_config(const TileConfig& c) {
  // Far past any real tile: an edited table's negative or huge sizes are refused here, before
  // a lookup could hand them to pruning's arithmetic or to NVRTC.
  struct Range {
    const char* field;
    int value, lo, hi;
  };
  for (const auto& [field, value, lo, hi] :
       {Range{"block_m", c.block_m, 0, 4096}, Range{"block_n", c.block_n, 0, 4096},
        Range{"block_k", c.block_k, 0, 4096}, Range{"stages", c.stages, 0, 64}, Range{"warps", c.warps, 0, 32},
        Range{"group_m", c.group_m, 0, 4096}, Range{"cluster", c.cluster, 1, 16}, Range{"items", c.items, 0, 1024}}) {
    if (value < lo || value > hi) {
      throw InvalidArgument(field, fmt::format("{}: must be in [{}, {}], got {}", c.name(), lo, hi, value));
    }
  }
  // Config names key the candidates table and spell warp specialization only with the Hopper
  // tag, the one pipeline that has it: any other config carrying it would share a name.
  if (c.warp_specialized && c.arch_tag != ArchTag::kHopper) {
    throw InvalidArgument("warp_specialized", fmt::format("{}: only Hopper (sm_90a) configs are warp-specialized",
                                                          c.name()));
  }
}

void validate(const TuningRow& row) {
  row.key.validate();
  auto check_time = [](const char* field, double ms) {
    if (!std::isfinite(ms) || ms < 0) throw InvalidArgument(field, fmt::format("must be a finite time >= 0, got {}", ms));
  };
  check_time("median_ms", row.median_ms);
  check_time("spread_ms", row.spread_ms);
  validate_config(row.winner);
  for (const CandidateResult& c : row.candidates) validate_config(c.config);
}

void to_json(nlohmann::json& j, const CandidateResult& c) {
  j = nlohmann::json{{"config", c.config},
                     {"median_ms", time_to_json(c.median_ms)},
                     {"spread_ms", time_to_json(c.spread_ms)},
                     {"rejected", c.rejected},
                     {"reason", c.reason}};
}

void from_json(const nlohmann::json& j, CandidateResult& c) {
  c.config = j.at("config").get<TileConfig>();
  c.median_ms = time_from_json(j.at("median_ms"));
  c.spread_ms = time_from_json(j.at("spread_ms"));
  c.rejected = j.at("rejected").get<bool>();
  c.reason = j.at("reason").get<std::string>();
}

void to_json(nlohmann::json& j, const Provenance& p) {
  j = nlohmann::json{{"nvrtc_version", p.nvrtc_version},
                     {"driver_version", p.driver_version},
                     {"template_hash", p.template_hash},
                     {"library_version", p.library_version},
                     {"created_at", p.created_at}};
}

void from_json(const nlohmann::json& j, Provenance& p) {
  p.nvrtc_version = j.at("nvrtc_version").get<std::string>();
  p.driver_version = json_int(j, "driver_version");
  p.template_hash = j.at("template_hash").get<std::string>();
  p.library_version = j.at("library_version").get<std::string>();
  p.created_at = j.at("created_at").get<std::string>();
}

void to_json(nlohmann::json& j, const TuningRow& r) {
  j = nlohmann::json{{"id", r.key.id()},
                     {"key", r.key},
                     {"winner", r.winner},
                     {"median_ms", r.median_ms},
                     {"spread_ms", r.spread_ms},
                     {"candidates", r.candidates},
                     {"provenance", r.provenance}};
}

void from_json(const nlohmann::json& j, TuningRow& r) {
  r.key = j.at("key").get<TuningKey>();
  if (auto id = j.at("id").get<std::string>(); id != r.key.id()) {
    throw InvalidArgument("id", fmt::format("'{}' does not match its key '{}'", id, r.key.id()));
  }
  r.winner = j.at("winner").get<TileConfig>();
  r.median_ms = j.at("median_ms").get<double>();
  r.spread_ms = j.at("spread_ms").get<double>();
  r.candidates = j.at("candidates").get<std::vector<CandidateResult>>();
  r.provenance = j.at("provenance").get<Provenance>();
  validate(r);
}

}  // namespace moejit::db
