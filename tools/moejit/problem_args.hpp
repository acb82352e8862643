// Problem options shared by the CLI's subcommands: --shape E,H,I,K, --tokens, --dtype, --mode.
#pragma once

#include <string>
#include <vector>

#include "args.hpp"
#include "moejit/moejit.hpp"

namespace moejit::cli {

// --shape E,H,I,K (default Qwen3-30B-A3B: 128,2048,768,8) and --dtype; tokens and mode are
// left at 1 and training. Throws InvalidArgument.
MoeProblem parse_dims(const Args& a);

// --tokens T1,T2,... or `fallback` when absent; every count must be at least 1.
std::vector<long long> parse_tokens(const Args& a, const std::vector<long long>& fallback);

// --tokens T for the commands that build one problem; a list is rejected, not cut to its first.
long long parse_token(const Args& a, long long fallback);

// "train", "infer", "memeff".
Mode parse_mode(const std::string& name);

}  // namespace moejit::cli
