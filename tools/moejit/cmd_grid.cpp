// moejit grid: the token counts `moejit tune` takes by default for a shape (table_token_counts,
// tuner/tune_plan.hpp), on one line, comma-separated, so scripts (tools/precompile.sh) cover the
// keys a table will hold. No GPU needed.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "args.hpp"
#include "commands.hpp"
#include "problem_args.hpp"
#include "tuner/tune_plan.hpp"

namespace moejit::cli {

int run_grid(int argc, char** argv, int start) {
  const Args a = parse_args(argc, argv, start, {}, {"shape"});
  const MoeProblem dims = parse_dims(a);
  fmt::print("{}\n", fmt::join(table_token_counts(dims.experts, dims.topk, kTableMaxTokens), ","));
  return 0;
}

}  // namespace moejit::cli
