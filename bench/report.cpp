#include "report.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "moejit/error.hpp"
#include "moejit/version.hpp"

namespace moejit::bench {
namespace {

double mib(std::size_t bytes) { return double(bytes) / (1 << 20); }

double tflops(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

std::string driver_string(int version) { return fmt::format("{}.{}", version / 1000, (version % 1000) / 10); }

// The first line of an error, cut to fit a table row; the JSON keeps the whole message.
std::string first_line(const std::string& message, std::size_t width = 160) {
  std::string line = message.substr(0, message.find('\n'));
  return line.size() > width ? line.substr(0, width - 3) + "..." : line;
}

std::string join_configs(const std::map<std::string, std::string>& configs) {
  std::string out;
  for (const auto& [role, config] : configs) out += fmt::format(" {}={}", role, config);
  return out;
}

// Roles whose config differs from the training plan's, so each T prints the training configs once
// and the other plans only where they chose differently.
std::map<std::string, std::string> differing(const std::map<std::string, std::string>& configs,
                                             const std::map<std::string, std::string>& train) {
  std::map<std::string, std::string> out;
  for (const auto& [role, config] : configs) {
    auto it = train.find(role);
    if (it == train.end() || it->second != config) out[role] = config;
  }
  return out;
}

void print_token_block(const TokenResult& r) {
  std::string memory;
  if (r.train_memory && r.memeff_memory) {
    const double train = mib(r.train_memory->full_step_bytes), memeff = mib(r.memeff_memory->full_step_bytes);
    memory = fmt::format("  full-step MiB: train {:.1f} memeff {:.1f} ({:+.1f})", train, memeff, memeff - train);
  }
  fmt::print("T={}  plans {:.1f} s  forward() enqueue {:.1f} us  backward() {:.1f} us  graph of both {:.1f} us  "
             "input copies {} (dense {}){}\n",
             r.tokens, r.plan_seconds, r.forward_enqueue_us, r.backward_enqueue_us, r.graph_step_us, r.copies,
             r.dense_copies, memory);
  const auto train = r.configs.find(mode_name(Mode::kTraining));
  if (train != r.configs.end()) {
    fmt::print("  {}:{}\n", train->first, join_configs(train->second));
    for (const auto& [mode, configs] : r.configs) {
      if (mode == train->first) continue;
      const auto diff = differing(configs, train->second);
      fmt::print("  {}:{}\n", mode, diff.empty() ? " as train" : join_configs(diff));
    }
  }
  if (!r.error.empty()) fmt::print("  error: {}\n", first_line(r.error));
  for (const StepResult& s : r.steps) {
    if (!s.ours_error.empty()) fmt::print("  {} error: {}\n", step_name(s.kind), first_line(s.ours_error));
    if (!s.dense_error.empty()) fmt::print("  {} dense error: {}\n", step_name(s.kind), first_line(s.dense_error));
    if (!s.check) continue;
    if (s.check->ok) {
      fmt::print("  {} check: ok (max rel err {:.2e})\n", step_name(s.kind), s.check->max_rel_err);
    } else {
      fmt::print("  {} check: FAILED ({})\n", step_name(s.kind), first_line(s.check->failure, 200));
    }
  }
}

std::string check_cell(const StepResult& s) {
  if (!s.check) return "-";
  return s.check->ok ? "ok" : "FAILED";
}

nlohmann::json check_json(const std::optional<CheckResult>& c) {
  if (!c) return nullptr;
  nlohmann::json j = {{"ok", c->ok},
                      {"max_rel_err", std::isfinite(c->max_rel_err) ? nlohmann::json(c->max_rel_err) : nullptr}};
  if (!c->ok) j["failure"] = c->failure;
  return j;
}

// A time with one trailing mark column: '*' when the host could not stay ahead of the GPU.
std::string ms_cell(const std::optional<Stats>& s, double Stats::*field) {
  if (!s) return "- ";
  return fmt::format("{:.4f}{}", (*s).*field, s->host_bound ? '*' : ' ');
}

nlohmann::json stats_json(const Stats& s, double flops) {
  return {{"median_ms", s.median_ms},
          {"min_ms", s.min_ms},
          {"p90_ms", s.p90_ms},
          {"tflops", tflops(flops, s.median_ms)},
          {"host_us_per_iter", s.host_us_per_iter},
          {"host_bound", s.host_bound},
          {"samples_ms", s.samples_ms},
          {"spans_unix_s", s.spans_unix_s}};
}

nlohmann::json memory_json(const Footprint& f) {
  return {{"saved_bytes", f.plan.saved_bytes},
          {"forward_workspace_bytes", f.plan.forward_workspace_bytes},
          {"backward_workspace_bytes", f.plan.backward_workspace_bytes},
          {"full_step_bytes", f.full_step_bytes},
          {"full_step_mib", mib(f.full_step_bytes)}};
}

}  // namespace

bool any_check_failed(const std::vector<TokenResult>& results) {
  for (const TokenResult& r : results) {
    for (const StepResult& s : r.steps) {
      if (s.check && !s.check->ok) return true;
    }
  }
  return false;
}

bool any_error(const std::vector<TokenResult>& results) {
  for (const TokenResult& r : results) {
    if (!r.error.empty()) return true;
    for (const StepResult& s : r.steps) {
      if (!s.ours_error.empty() || !s.dense_error.empty()) return true;
    }
  }
  return false;
}

void print_report(const RunInfo& info, const std::vector<TokenResult>& results) {
  const cuda::DeviceInfo& d = info.device;
  const MoeProblem& p = info.problem;
  fmt::print("\n== moejit_bench {} | {} ({}, {} SMs, {} MiB L2) | driver {} | cuBLAS {} | {}{}\n", kLibraryVersion,
             d.name, d.arch(), d.sm_count, d.l2_bytes >> 20, driver_string(d.driver_version), info.cublas_version,
             info.date_utc,
             info.green_sms > 0 ? fmt::format(" | on a green context of {} SMs", info.green_sms) : std::string());
  fmt::print("== E={} H={} I={} K={} {} routing={} | warmup {} iters {} in {} rounds | ms: CUDA-event median, min, "
             "p90{}{}\n",
             p.experts, p.hidden, p.intermediate, p.topk, dtype_name(p.dtype), routing_name(info.routing),
             info.warmup, info.iters, info.rounds,
             info.overrides.empty() ? "" : " | overrides:" + join_configs(info.overrides),
             info.check ? "" : " | outputs not checked (--no-check)");
  for (const TokenResult& r : results) print_token_block(r);

  bool host_bound = false;
  fmt::print("{:>6} {:<9} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>6} {:>6} {:<6}\n", "T", "mode", "ms ", "min ",
             "p90 ", "TFLOP/s", "dense_ms ", "dense_TF", "ratio", "wTB/s", "check");
  for (const TokenResult& r : results) {
    for (const StepResult& s : r.steps) {
      host_bound |= (s.ours && s.ours->host_bound) || (s.dense && s.dense->host_bound);
      const std::string ours_tf = s.ours ? fmt::format("{:.1f}", tflops(s.flops, s.ours->median_ms)) : "-";
      const std::string dense_tf = s.dense ? fmt::format("{:.1f}", tflops(s.flops, s.dense->median_ms)) : "-";
      const std::string ratio = s.round_ratios.empty() ? "-" : fmt::format("{:.3f}", median_of(s.round_ratios));
      const std::string weights_tbps =
          s.ours && s.ours->median_ms > 0 ? fmt::format("{:.2f}", s.weight_bytes / (s.ours->median_ms * 1e-3) / 1e12)
                                          : "-";
      fmt::print("{:>6} {:<9} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>6} {:>6} {:<6}\n", r.tokens,
                 step_name(s.kind), ms_cell(s.ours, &Stats::median_ms), ms_cell(s.ours, &Stats::min_ms),
                 ms_cell(s.ours, &Stats::p90_ms), ours_tf, ms_cell(s.dense, &Stats::median_ms), dense_tf, ratio,
                 weights_tbps, check_cell(s));
    }
  }
  fmt::print("ratio = the median over rounds of dense_ms / ms in the round (the fraction of the dense cuBLAS\n"
             "ceiling reached); ms, min, p90 and TFLOP/s over all rounds' samples\n"
             "wTB/s = the expert weights' unavoidable traffic per second (W1, W2 read per pass, dW1, dW2 written):\n"
             "the bound at small T, against the HBM's peak{}{}\n",
             info.check ? "\ncheck = after the timing, one more step on input set 0, its outputs poisoned first, "
                          "sampled against\nan fp64 host reference (why one failed: above, by T)"
                        : "",
             host_bound ? "\n* host-bound: enqueuing outlasted the GPU's head start, so times may include launch gaps"
                        : "");
  std::fflush(stdout);
}

void write_json(const std::string& path, const RunInfo& info, const std::vector<TokenResult>& results) {
  const cuda::DeviceInfo& d = info.device;
  const MoeProblem& p = info.problem;
  nlohmann::json j;
  j["command"] = info.command;
  j["date_utc"] = info.date_utc;
  j["moejit_version"] = kLibraryVersion;
  j["device"] = {{"name", d.name},
                 {"arch", d.arch()},
                 {"sm_count", d.sm_count},
                 {"l2_bytes", d.l2_bytes},
                 {"memory_bytes", d.total_memory},
                 {"driver_version", driver_string(d.driver_version)}};
  j["cublas_version"] = info.cublas_version;
  j["problem"] = {{"experts", p.experts},       {"hidden", p.hidden},
                  {"intermediate", p.intermediate}, {"topk", p.topk},
                  {"dtype", dtype_name(p.dtype)},   {"routing", routing_name(info.routing)}};
  j["warmup"] = info.warmup;
  j["iters"] = info.iters;
  j["rounds"] = info.rounds;
  j["config_overrides"] = info.overrides;
  j["green_context_sms"] = info.green_sms > 0 ? nlohmann::json(info.green_sms) : nlohmann::json(nullptr);
  j["flop_model"] = "per (token, slot) pair: forward 6*H*I, backward and frozen 12*H*I, full and memeff 18*H*I";
  j["weight_bytes_model"] = "W1 and W2 read by the forward and again by the backward, dW1 and dW2 written once";
  j["check"] = info.check ? nlohmann::json{{"tolerance", check_tolerance(p.dtype)},
                                           {"row_tolerance", 3 * check_tolerance(p.dtype)},
                                           {"tokens", kCheckTokens},
                                           {"experts", kCheckExperts},
                                           {"columns_per_expert", kCheckColumns},
                                           {"model", "after the timing, one step per mode on input set 0, its outputs "
                                                     "poisoned (0xff), against an fp64 host reference: the sampled "
                                                     "tokens' out, dx and d_topk_weights, dW1 rows i and I+i and dW2 "
                                                     "column i of the sampled experts' columns; relative L2 error of "
                                                     "each output's sample <= tolerance, of each row <= row_tolerance"}}
                          : nlohmann::json(nullptr);
  nlohmann::json rows = nlohmann::json::array();
  for (const TokenResult& r : results) {
    nlohmann::json t = {{"tokens", r.tokens},
                        {"pairs", r.tokens * p.topk},
                        {"rotation_copies", r.copies},
                        {"dense_rotation_copies", r.dense_copies},
                        {"plan_seconds", r.plan_seconds},
                        {"forward_enqueue_us", r.forward_enqueue_us},
                        {"backward_enqueue_us", r.backward_enqueue_us},
                        {"graph_step_us", r.graph_step_us},
                        {"check_seconds", r.check_seconds},
                        {"configs", r.configs}};
    if (r.train_memory) t["memory"]["train"] = memory_json(*r.train_memory);
    if (r.memeff_memory) t["memory"]["memeff"] = memory_json(*r.memeff_memory);
    if (!r.error.empty()) t["error"] = r.error;
    nlohmann::json steps = nlohmann::json::array();
    for (const StepResult& s : r.steps) {
      nlohmann::json e = {{"mode", step_name(s.kind)}, {"flops", s.flops}, {"weight_bytes", s.weight_bytes}};
      if (s.ours) e["ours"] = stats_json(*s.ours, s.flops);
      if (s.dense) e["dense"] = stats_json(*s.dense, s.flops);
      if (!s.round_ratios.empty()) {
        e["ratio"] = median_of(s.round_ratios);
        e["round_ratios"] = s.round_ratios;
      }
      if (s.ours && s.dense && s.ours->median_ms > 0) e["ratio_pooled"] = s.dense->median_ms / s.ours->median_ms;
      if (!s.ours_error.empty()) e["ours_error"] = s.ours_error;
      if (!s.dense_error.empty()) e["dense_error"] = s.dense_error;
      e["check"] = check_json(s.check);
      steps.push_back(std::move(e));
    }
    t["steps"] = std::move(steps);
    rows.push_back(std::move(t));
  }
  j["results"] = std::move(rows);

  std::ofstream out(path);
  out << j.dump(2) << '\n';
  if (!out) throw IoError("cannot write " + path);
}

}  // namespace moejit::bench
