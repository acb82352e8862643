// Block orderings over output tiles.
#pragma once

#include "common/types.cuh"

namespace moejit {

// Grouped ordering of a 1-D grid over (m, n) tiles: GROUP_M consecutive m tiles sweep all n
// tiles together, so co-resident blocks share operand tiles in L2.
__device__ __forceinline__ void grouped_tile(int64 pid, int64 m_tiles, int64 n_tiles, int group_m, int64& m,
                                             int64& n) {
  const int64 per_group = static_cast<int64>(group_m) * n_tiles;
  const int64 group = pid / per_group;
  const int64 first_m = group * group_m;
  const int64 rows = min_of<int64>(m_tiles - first_m, group_m);
  const int64 in_group = pid % per_group;
  m = first_m + in_group % rows;
  n = in_group / rows;
}

}  // namespace moejit
