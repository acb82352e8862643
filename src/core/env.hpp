// The one place moejit reads environment variables. Each accessor reads the variable when
// called (tests and long-lived processes may change it), set_option's override (moejit.hpp) in
// place of the environment's value where there is one; the README lists them all.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace moejit::env {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// MOEJIT_CACHE_DIR, else $XDG_CACHE_HOME/moejit/kernels, else ~/.cache/moejit/kernels, else
// moejit-cache-<euid>/kernels in the temporary folder, made private to the user (mode 0700);
// nothing where there is no temporary folder or that folder is not private (a warning says why).
std::optional<std::filesystem::path> kernel_cache_dir();
// MOEJIT_DISK_CACHE=0 turns the on-disk cubin cache off (the in-process cache stays).
bool disk_cache_enabled();
// MOEJIT_DB, else $XDG_CACHE_HOME/moejit/tuning.sqlite, else ~/.cache/moejit/tuning.sqlite, else
// moejit-cache-<euid>/tuning.sqlite in the temporary folder, on the terms kernel_cache_dir's is.
std::optional<std::filesystem::path> user_db_path();
// moejit-cache-<euid>/gpu-locks in the temporary folder, private to the user: the per-GPU tuning
// locks, one folder for the user's processes that share a temporary folder (TMPDIR), whatever
// MOEJIT_DB and the cache folders name. Nothing where the temporary folder has no private one.
std::optional<std::filesystem::path> gpu_lock_dir();
// MOEJIT_SHIPPED_DB_DIR, else the db/ folder this build was configured from.
std::filesystem::path shipped_db_dir();
// MOEJIT_JOBS: NVRTC compile threads; default: hardware threads.
unsigned compile_jobs();
// MOEJIT_LOG: error|warn|info|debug; default warn.
LogLevel log_level();
// MOEJIT_CUDA_DRIVER: path of the driver library to dlopen instead of libcuda.so.1.
std::string cuda_driver_library();
// MOEJIT_AUTOTUNE=0 turns self-tuning off (the tuning database is still read); any other
// integer leaves it on. Like MOEJIT_DISK_CACHE it takes integers only: "false" or "off" throw
// InvalidArgument naming the variable (config_resolver reads it at every resolve, so they fail
// every plan at once, not only plans the tables do not cover).
bool autotune_enabled();
// MOEJIT_CHECK_ADOPTED=0: a backward over a state declared with adopt_saved, or written by a
// captured forward, takes it without reading its stamp back (one stream synchronisation each); any other integer, or unset, checks.
bool check_adopted_states();
// MOEJIT_CALL_GRAPHS=0: a plan enqueues each kernel of an eager forward() or backward() on the
// stream, instead of launching the call as one graph kept from call to call
// (src/cuda/call_graph.hpp); any other integer, or unset, uses the graphs. Read when a plan is built.
bool call_graphs();
// MOEJIT_TUNE_BUDGET_S: wall-clock seconds one self-tuning run may take; default 60.
double tune_budget_s();
// A tuning budget in seconds from text ("30", "2.5"): above 0 and at most kMaxTuneBudgetS (the
// tuner's deadline is a clock time point). Throws InvalidArgument naming `what` otherwise.
inline constexpr double kMaxTuneBudgetS = 1e6;
double parse_tune_budget_s(const std::string& text, const std::string& what);

// MOEJIT_JOBS's count from text, a positive integer, capped at 1024 (more threads than any machine
// has cores only cost stacks). Throws InvalidArgument naming `what` otherwise.
unsigned parse_jobs(const std::string& text, const std::string& what);

// Per library variable set to a value its accessor would refuse, what that accessor's
// InvalidArgument says ("MOEJIT_JOBS: expected a positive count, got 0"); empty when none is.
std::vector<std::string> setting_errors();

// Parses an integer variable; nullopt when unset or empty. Throws InvalidArgument naming the
// variable when it is set to something that is not an integer.
std::optional<long long> get_int(const char* name);

}  // namespace moejit::env
