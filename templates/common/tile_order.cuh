// Block orderings over output tiles, and the division they decode with.
#pragma once

#include "common/types.cuh"

namespace moejit {

// Quotients by a divisor that stays fixed for a whole kernel, as a multiply-high and a shift.
// A persistent block decodes every work item it runs from the item's index; with hardware
// division that took three to six ~25-instruction dependent chains per item in every thread,
// 11 % of bwd_dw1's warp samples at T=1024, where an item has two k tiles (ncu, session 20).
// Numerators stay below 2^31 (grids are capped at 2^31 - 1 blocks, src/moe/launch.cpp) and
// divisors in [1, 2^31]. The multiplier is Granlund and Montgomery's round-up one,
// floor(2^(32 + s) / d) + 1 with s = ceil(log2 d), less its 2^32 term, which div() adds back as n.
struct FastDiv {
  uint32 divisor, mul, shift;

  __device__ __forceinline__ explicit FastDiv(uint32 d) : divisor(d) {
    shift = 32u - static_cast<uint32>(__clz(d - 1u));  // d = 1: __clz(0) = 32, shift 0
    mul = static_cast<uint32>((static_cast<uint64>((1ull << shift) - d) << 32) / d + 1u);
  }
  __device__ __forceinline__ uint32 div(uint32 n) const { return (__umulhi(n, mul) + n) >> shift; }
  __device__ __forceinline__ uint32 mod(uint32 n, uint32 quotient) const { return n - quotient * divisor; }
};

// FastDiv's interface on the hardware's division: a one-tile block decodes one item, which the
// multiplier's own 64-bit division would cost more than it saves.
struct PlainDiv {
  uint32 divisor;

  __device__ __forceinline__ explicit PlainDiv(uint32 d) : divisor(d) {}
  __device__ __forceinline__ uint32 div(uint32 n) const { return n / divisor; }
  __device__ __forceinline__ uint32 mod(uint32 n, uint32 quotient) const { return n - quotient * divisor; }
};

// Grouped ordering of a 1-D grid over (m, n) tiles: GROUP_M consecutive m tiles sweep all n
// tiles together, so co-resident blocks share operand tiles in L2. Div: FastDiv where a block
// decodes many items (persistent grids), PlainDiv where it decodes one.
template <int GROUP_M, typename Div>
struct GroupedOrder {
  uint32 m_tiles;
  Div per_group;   // GROUP_M * n_tiles tiles
  Div group_rows;  // GROUP_M m tiles
  Div last_rows;   // the m tiles of a short last group (unused, and 1, when there is none)

  __device__ __forceinline__ GroupedOrder(uint32 m_tiles_, uint32 n_tiles)
      : m_tiles(m_tiles_),
        per_group(GROUP_M * n_tiles),
        group_rows(GROUP_M),
        last_rows(max_of(m_tiles_ % GROUP_M, 1u)) {}

  // Tile `pid` (below m_tiles * n_tiles).
  __device__ __forceinline__ void tile(uint32 pid, uint32& m, uint32& n) const {
    const uint32 group = per_group.div(pid), in_group = per_group.mod(pid, group);
    const uint32 first_m = group * GROUP_M;
    const Div& rows = first_m + GROUP_M <= m_tiles ? group_rows : last_rows;
    n = rows.div(in_group);
    m = first_m + rows.mod(in_group, n);
  }
};

// A persistent grid's strided shares over P blocks with every other round walked backwards:
// block b runs positions b, P + b, 2P + b, ... and they name items b, 2P - 1 - b, 2P + b, ...
// Over items ordered by cost, dearest first, a backward round hands the cheapest of its items to
// the blocks that the round before gave the dearest, so the shares even out; plain strides give
// block 0 the dearest item of every round. A last backward round of fewer than P items reverses
// within itself, so every item below `items` is named once.
struct SnakeOrder {
  uint32 items;
  FastDiv blocks;

  __device__ __forceinline__ SnakeOrder(uint32 items_, uint32 blocks_) : items(items_), blocks(blocks_) {}

  // The item at position `i` < items.
  __device__ __forceinline__ uint32 item(uint32 i) const {
    const uint32 round = blocks.div(i);
    if ((round & 1u) == 0) return i;
    const uint32 first = round * blocks.divisor;
    return first + min_of(items - first, blocks.divisor) - 1u - blocks.mod(i, round);
  }
};

}  // namespace moejit
