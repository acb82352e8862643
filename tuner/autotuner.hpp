// The autotuner: for each role of a problem, every config of its space (or of the first call's
// narrower one) is pruned for the device, compiled in parallel, run once on a scratch problem and
// compared with the heuristic default's output (a miscompiled or wrong config, or one whose
// launch the device refuses, is rejected, not chosen), timed with CUDA events, the fastest few
// timed again in turns, and the winner picked among those with a deterministic tie-break
// (tuner/winner.hpp).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <cuda.h>

#include "cuda/device.hpp"
#include "db/tuning_row.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

struct TuneOptions {
  // Wall clock from the start, compiling included; once spent, candidates not yet timed are recorded
  // as skipped (each role's reference and finalist rounds still run), which marks the row as
  // tuned partly (tuner/prune.hpp: tuned_partly). Each role first gets an equal share of what is
  // left when it starts (budget_share_s), then the roles cut short what remains, in pipeline order.
  double budget_s = 60;
  int reps = 7;          // timed launches per candidate (the median is kept)
  int final_rounds = 7;  // rounds of the finalists' timing in turns (tuner/winner.hpp: finalists)
  // Time candidates back to back after a warm-up burst instead of after an L2 flush each
  // (TuningSession::time); `moejit tune --timing sustained`.
  bool sustained = false;
  // Time only the first call's space (tuner/prune.hpp: first_call_exclusion), recording the rest
  // as rejected: a plan's self-tune, whose cold start is mostly compiling.
  bool first_call_space = false;
  // The config each role used before this tuning: kept when it ties with the fastest.
  std::map<Role, TileConfig> incumbents;
  std::function<void(const std::string&)> progress;  // optional progress lines
  // Called after a candidate's first run, before its outputs are checked, once per output
  // (TuningSession::outputs_of: 0 the main one) with its device address and size (tests use it
  // to corrupt one candidate).
  std::function<void(Role, const TileConfig&, int output, CUdeviceptr address, std::size_t bytes)> inspect;
};

// Outputs may differ from the reference config's by accumulation order only.
inline constexpr double kTuneTolerance = 1e-2;

// Tunes `roles` of `problem` in the current CUDA context (whose device is `device`). One row
// per role that had at least one correct candidate, each with every candidate's result.
// Throws CudaError (e.g. the scratch problem does not fit in memory).
std::vector<db::TuningRow> autotune(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                    const std::vector<Role>& roles, const TuneOptions& options);

}  // namespace moejit
