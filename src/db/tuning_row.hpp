// A tuned row: the winner of one tuning key with every candidate's result and the provenance
// that says whether the row still applies to this build.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

#include "db/tuning_key.hpp"
#include "tuner/tile_config.hpp"

namespace moejit::db {

struct CandidateResult {
  TileConfig config;
  double median_ms = 0;  // NaN when the candidate was rejected before it was timed
  double spread_ms = 0;  // NaN likewise
  bool rejected = false;
  std::string reason;    // why it was rejected (pruning, compile error, wrong result); empty otherwise
};

struct Provenance {
  std::string nvrtc_version;    // "13.0"
  int driver_version = 0;       // cuDriverGetVersion, e.g. 13000; 0 when unknown
  std::string template_hash;    // jit::template_hash() of the build that tuned
  std::string library_version;  // kLibraryVersion
  std::string created_at;       // ISO-8601 UTC, "2025-06-01T12:34:56Z"
};

struct TuningRow {
  TuningKey key;
  TileConfig winner;  // explicit fields, never an index into a config list
  double median_ms = 0;
  double spread_ms = 0;
  std::vector<CandidateResult> candidates;
  Provenance provenance;
};

// The provenance of rows tuned by this build now: linked NVRTC, embedded templates, library
// version and the current UTC time.
Provenance current_provenance(int driver_version);

// "2025-06-01T12:34:56Z" for the current time.
std::string utc_timestamp();

// Whether two provenances name the same build: the same templates and NVRTC. A database keeps
// one row per key and build, so builds that share a file keep their own rows.
bool same_build(const Provenance& a, const Provenance& b);

// A row is stale when it was tuned against other templates or another NVRTC: its winner may
// no longer be the fastest, or may no longer compile the same way.
bool is_stale(const TuningRow& row, const Provenance& current);

// Throws InvalidArgument naming the field: an invalid key, a winner time that is not a finite,
// non-negative number, or a config warp-specialized without the Hopper tag.
void validate(const TuningRow& row);
// The config part of validate(): sizes in range, warp specialization only with the Hopper tag.
void validate_config(const TileConfig& config);

// Times that are NaN are written as null and read back as NaN.
void to_json(nlohmann::json& j, const CandidateResult& c);
void from_json(const nlohmann::json& j, CandidateResult& c);
void to_json(nlohmann::json& j, const Provenance& p);
void from_json(const nlohmann::json& j, Provenance& p);
// Writes "id" (the key id) for readers and diffs; reading checks it matches the key.
void to_json(nlohmann::json& j, const TuningRow& r);
void from_json(const nlohmann::json& j, TuningRow& r);

}  // namespace moejit::db
