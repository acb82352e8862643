// Problem options shared by the CLI's subcommands: --shape E,H,I,K, --tokens, --dtype, --mode.
#pragma once

#include <string>
#include <vector>

#include "args.hpp"
#include "moejit/moejit.hpp"

namespace moejit::cli {

// --shape E,H,I,K (default Qwen3-30B-A3B: 128,2048,768,8) and --dtype; tokens and mode are
// left at 1 and training. Throws InvalidArgument for a shape the library refuses (E past 4096,
// K past E, H or I from 2^28).
MoeProblem parse_dims(const Args& a);

// --tokens T1,T2,... or `fallback` when absent; each count must make a problem the library
// takes with `dims` (at least 1, T*K at most 2^31 - 256).
std::vector<long long> parse_tokens(const Args& a, const MoeProblem& dims, const std::vector<long long>& fallback);

// --tokens T for the commands that build one problem; a list is rejected, not cut to its first.
long long parse_token(const Args& a, const MoeProblem& dims, long long fallback);

// "train", "infer", "memeff".
Mode parse_mode(const std::string& name);

}  // namespace moejit::cli
