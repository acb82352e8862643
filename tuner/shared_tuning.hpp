// Tuning shared by the processes of one host: the roles of a problem are tuned by whichever
// process takes the problem's file lock first; the others wait on the lock and then read the
// rows it wrote to the user database. A crashed holder releases the lock with its process; a
// holder that hangs is waited for problem_lock_timeout, then this process tunes without the lock
// (the database's transactions keep both writers' rows whole).
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <vector>

#include "core/fs.hpp"
#include "cuda/device.hpp"
#include "db/tuning_lookup.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

// Several times a cold self-tune of the largest shipped shapes (~20 s).
inline constexpr std::chrono::minutes kTuningLockTimeout{5};

// How long one tuner waits on another: kTuningLockTimeout, or the holder's budget
// (MOEJIT_TUNE_BUDGET_S, which tune_shared takes; the same for the processes of one job) and a
// minute more where that is longer. Waiters that gave up on a holder still inside its budget
// would tune beside it on the same GPU, each timing the other's kernels into its own.
std::chrono::seconds tuning_lock_timeout(double budget_s);

// The lock on timing one GPU, held while a tuner times candidates on it (not while it compiles
// them): two threads or processes tuning different problems on one GPU, or `moejit tune` beside a
// plan's self-tune, would each time the other's kernels into its own. Named by the GPU's UUID
// under env::gpu_lock_dir() (per user and temporary folder), so the GPUs of one host, and MIG
// instances of one, are tuned at once. Waited for tuning_lock_timeout(budget_s), then throws
// fs::LockTimeout: nothing is run beside the holder, and no row is made (a plan falls back as when
// the GPU has no memory for the tuner, `moejit tune` counts the item failed). No lock for a
// fabricated device or where the folder cannot be had (said once).
std::optional<fs::FileLock> lock_gpu_timing(const cuda::DeviceInfo& device, double budget_s);

// How long a process waits on another's tuning of the same problem: the holder may first wait
// tuning_lock_timeout for the GPU's timing lock, then tune for its budget.
std::chrono::seconds problem_lock_timeout(double budget_s);

using TuneFn = std::function<std::vector<db::TuningRow>(const std::vector<Role>& roles)>;

// The lock file of a problem's tuning, the same for all its modes: next to the user database
// `user_db`, named by a hash of the routing key.
std::filesystem::path tuning_lock_path(const std::filesystem::path& user_db, const MoeProblem& problem,
                                       const cuda::DeviceInfo& device);

// Under the lock: rows for `missing` that are now in the user DB (or this process's memory) and
// that `accept` allows, plus tune(rest), which are recorded in the user DB in one transaction
// (TuningDb::open_for_saving: a damaged file is emptied, a copy kept) and remembered by `lookup`. A partial
// tuned row (tuned_partly) gives way to a row of its key recorded meanwhile that was tuned whole
// and that `accept` allows: that row is kept and returned. Without a user database
// (the lookup's user_db_path() is empty) it tunes unlocked and records nothing on disk; with one this
// process cannot write, it records nothing there and says so once. The user database is the
// lookup's (TuningLookup::user_db_path), not the setting's now: MOEJIT_DB changed by set_option
// while a plan builds would otherwise lock and save one tune in a database its rows were not
// looked up in. `budget_s`: the tune's (problem_lock_timeout).
std::vector<db::TuningRow> tune_shared(const MoeProblem& problem, const cuda::DeviceInfo& device,
                                       const std::vector<Role>& missing, db::TuningLookup& lookup, const TuneFn& tune,
                                       const db::TuningDb::RowFilter& accept, double budget_s);

}  // namespace moejit
