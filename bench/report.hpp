// What one benchmark run measured, and its two renderings: a compact table on stdout (the GPU
// machine returns only the tail of the output, so the table comes last) and a JSON file with
// every number, the samples included.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "check.hpp"
#include "cuda/device.hpp"
#include "inputs.hpp"
#include "moe_steps.hpp"
#include "moejit/moejit.hpp"
#include "steps.hpp"
#include "timing.hpp"

namespace moejit::bench {

struct StepResult {
  StepKind kind = StepKind::kForward;
  double flops = 0;
  double weight_bytes = 0;  // step_weight_bytes
  std::optional<Stats> ours, dense;    // empty when that side failed
  std::vector<double> round_ratios;    // dense / ours per round (timing.hpp round_ratios)
  std::string ours_error, dense_error;
  std::optional<CheckResult> check;  // empty under --no-check or when nothing was timed
};

struct TokenResult {
  long long tokens = 0;
  int copies = 0, dense_copies = 0;  // rotation copies of the per-step inputs
  double plan_seconds = 0;
  double forward_enqueue_us = 0;   // host cost of one training forward() call
  double backward_enqueue_us = 0;  // and of one backward() call
  double graph_step_us = 0;        // and of replaying a CUDA graph of one forward() and backward()
  double check_seconds = 0;        // the steps' checks, their reference included
  std::map<std::string, std::map<std::string, std::string>> configs;  // plan mode -> role -> config
  std::optional<Footprint> train_memory, memeff_memory;
  std::vector<StepResult> steps;
  std::string error;  // the plans or inputs could not be set up, so no fused step ran
};

struct RunInfo {
  std::string command, date_utc;
  cuda::DeviceInfo device;
  int cublas_version = 0;
  MoeProblem problem;  // tokens vary per TokenResult
  RoutingSpec routing;
  int warmup = 0, iters = 0, rounds = 0;
  std::map<std::string, std::string> overrides;
  int green_sms = 0;  // SMs of the green context every step ran on; 0: the whole device
  bool check = true;  // false under --no-check
};

bool any_error(const std::vector<TokenResult>& results);
bool any_check_failed(const std::vector<TokenResult>& results);
void print_report(const RunInfo& info, const std::vector<TokenResult>& results);
// Throws IoError when the file cannot be written.
void write_json(const std::string& path, const RunInfo& info, const std::vector<TokenResult>& results);

}  // namespace moejit::bench
