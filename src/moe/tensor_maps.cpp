#include "moe/tensor_maps.hpp"

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>

#include "cuda/driver.hpp"
#include "moe/kernel_params.hpp"
#include "moejit/error.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

constexpr std::uint64_t kElem = 2;  // bf16 / fp16 bytes

// A K-major tile: boxes of `rows` rows by BLOCK_K elements (64 or 128 bytes per row), or by 64
// of them twice at BLOCK_K 128 (templates' for_each_k_box).
TensorMapSpec k_major(int rank, std::array<std::uint64_t, 4> dims, std::array<std::uint64_t, 3> strides,
                      std::uint32_t rows, const TileConfig& c) {
  const std::uint32_t cols = static_cast<std::uint32_t>(std::min(c.block_k, 64));
  return {rank, dims, strides, {cols, rows, 1, 1}, static_cast<int>(cols) * 2};
}

// An MN-major tile as 64-column panels: boxes of 64 columns (128 bytes) by BLOCK_K rows.
TensorMapSpec panels(int rank, std::array<std::uint64_t, 4> dims, std::array<std::uint64_t, 3> strides,
                     const TileConfig& c) {
  return {rank, dims, strides, {64, static_cast<std::uint32_t>(c.block_k), 1, 1}, 128};
}

CUtensorMapDataType data_type(DType d) {
  return d == DType::kFP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

params::TensorMap encode(const TensorMapSpec& s, const void* base, DType dtype) {
  const std::array<cuuint32_t, 4> element_strides = {1, 1, 1, 1};
  const CUtensorMapSwizzle swizzle = s.swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  CUtensorMap map;
  MOEJIT_CU(cuda::driver().cuTensorMapEncodeTiled(
      &map, data_type(dtype), static_cast<cuuint32_t>(s.rank), const_cast<void*>(base), s.dims.data(), s.strides.data(),
      s.box.data(), element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  static_assert(sizeof(CUtensorMap) == sizeof(params::TensorMap), "a tensor map is 128 opaque bytes");
  params::TensorMap out;
  std::memcpy(&out, &map, sizeof(out));
  return out;
}

// An output tile's TMA store box as 64-column panels: 64 columns (128 bytes, swizzled) by BLOCK_M
// rows, or by the rows of one MMA warpgroup where each stores its own (the expert GEMMs' staggered
// warpgroups; templates/common/epilogue_sm90.cuh).
TensorMapSpec out_panels(int rank, std::array<std::uint64_t, 4> dims, std::array<std::uint64_t, 3> strides,
                         const TileConfig& c, int row_groups = 1) {
  return {rank, dims, strides, {64, static_cast<std::uint32_t>(c.block_m / row_groups), 1, 1}, 128};
}

// The maps of tensor_map_specs, unchecked.
std::vector<TensorMapSpec> role_maps(Role role, const TileConfig& c, const MoeShape& shape) {
  const std::uint64_t tk = static_cast<std::uint64_t>(shape.pairs()), h = shape.hidden, i = shape.intermediate,
                      e = shape.experts;
  const std::uint32_t bm = c.block_m, bn = c.block_n;
  const int wgm = std::max(1, gemm_warp_rows(role, c));
  switch (role) {
    case Role::kFwdUp:
      // W1 [E, 2I, H] as [E, 2, I, H]; each warpgroup's gate and up halves are one box each. A
      // persistent grid's TMA stores write act [TK, I] and pre_act [TK, 2I] as [TK, 2, I] (a g
      // box ends at column I) in 64-column panels of BLOCK_M rows.
      return {k_major(4, {h, i, 2, e}, {h * kElem, i * h * kElem, 2 * i * h * kElem},
                      static_cast<std::uint32_t>(gemm_wgmma_n(role, c) / 2), c),
              k_major(2, {h, tk, 1, 1}, {h * kElem, 0, 0}, bm, c),  // x_rows [TK, H]
              out_panels(2, {i, tk, 1, 1}, {i * kElem, 0, 0}, c),
              {3, {i, 2, tk, 1}, {i * kElem, 2 * i * kElem, 0}, {64, 1, bm, 1}, 128}};
    case Role::kFwdDown:
      return {k_major(2, {i, tk, 1, 1}, {i * kElem, 0, 0}, bm, c),                          // act [TK, I]
              k_major(3, {i, h, e, 1}, {i * kElem, h * i * kElem, 0}, bn / c.cluster, c),  // W2 [E, H, I]
              out_panels(2, {h, tk, 1, 1}, {h * kElem, 0, 0}, c)};                          // Y [TK, H]
    case Role::kBwdDown: {
      // pre_act and d_pre_act [TK, 2I] as [TK, 2, I]: a g box ends at column I (its columns past I
      // load as zeros and are not stored) instead of running on into the u half.
      const TensorMapSpec halves{3, {i, 2, tk, 1}, {i * kElem, 2 * i * kElem, 0}, {64, 1, bm, 1}, 128};
      return {panels(3, {i, h, e, 1}, {i * kElem, h * i * kElem, 0}, c),  // W2 [E, H, I]
              k_major(2, {h, tk, 1, 1}, {h * kElem, 0, 0}, bm, c),       // d_out_rows [TK, H]
              halves, halves};                                             // pre_act, d_pre_act
    }
    case Role::kBwdDw2:
      return {panels(2, {h, tk, 1, 1}, {h * kElem, 0, 0}, c),                           // d_out_rows [TK, H]
              panels(2, {i, tk, 1, 1}, {i * kElem, 0, 0}, c),                           // weighted_act [TK, I]
              out_panels(3, {i, h, e, 1}, {i * kElem, h * i * kElem, 0}, c, wgm)};      // dW2 [E, H, I]
    case Role::kBwdDx:
      return {k_major(2, {2 * i, tk, 1, 1}, {2 * i * kElem, 0, 0}, bm, c),          // d_pre_act [TK, 2I]
              panels(3, {h, 2 * i, e, 1}, {h * kElem, 2 * i * h * kElem, 0}, c),  // W1 [E, 2I, H]
              out_panels(2, {h, tk, 1, 1}, {h * kElem, 0, 0}, c)};                 // dx_rows [TK, H]
    case Role::kBwdDw1:
      return {panels(2, {2 * i, tk, 1, 1}, {2 * i * kElem, 0, 0}, c),                   // d_pre_act [TK, 2I]
              panels(2, {h, tk, 1, 1}, {h * kElem, 0, 0}, c),                           // x_rows [TK, H]
              out_panels(3, {h, 2 * i, e, 1}, {h * kElem, 2 * i * h * kElem, 0}, c, wgm)};  // dW1 [E, 2I, H]
    default: break;
  }
  throw InternalError(fmt::format("{} has no TMA copies", role_name(role)));
}

}  // namespace

std::optional<std::string> tensor_map_problem(const TensorMapSpec& s) {
  if (s.rank < 1 || s.rank > 4) return fmt::format("rank {} (1 to 4 here)", s.rank);
  if (s.swizzle_bytes != 64 && s.swizzle_bytes != 128) return fmt::format("swizzle of {} bytes", s.swizzle_bytes);
  for (int d = 0; d < s.rank; ++d) {
    if (s.dims[d] < 1 || s.dims[d] > (1ULL << 32)) return fmt::format("dimension {} of {} elements", d, s.dims[d]);
    if (s.box[d] < 1 || s.box[d] > 256) return fmt::format("box of {} elements in dimension {}", s.box[d], d);
    if (d > 0 && (s.strides[d - 1] % 16 != 0 || s.strides[d - 1] >= (1ULL << 40))) {
      return fmt::format("stride of {} bytes in dimension {}", s.strides[d - 1], d);
    }
  }
  const std::uint64_t row_bytes = s.box[0] * kElem;
  if (row_bytes % 16 != 0 || row_bytes > static_cast<std::uint64_t>(s.swizzle_bytes)) {
    return fmt::format("box rows of {} bytes with a {}-byte swizzle", row_bytes, s.swizzle_bytes);
  }
  return std::nullopt;
}

std::vector<TensorMapSpec> tensor_map_specs(Role role, const TileConfig& c, const MoeShape& shape) {
  if (!c.use_tma || !tma_eligible(role, shape)) {
    throw InternalError(fmt::format("{} config '{}' copies no tile with TMA for this shape", role_name(role), c.name()));
  }
  std::vector<TensorMapSpec> maps = role_maps(role, c, shape);
  for (const TensorMapSpec& m : maps) {
    if (auto why = tensor_map_problem(m)) {
      throw InternalError(fmt::format("{} config '{}': a tensor map the driver would reject: {}", role_name(role),
                                      c.name(), *why));
    }
  }
  return maps;
}


namespace {

// A map field of a role's parameters and the tensor it maps, in tensor_map_specs' order.
struct MapBinding {
  params::TensorMap* map;
  const void* base;
};

// Encodes each spec into its binding; a null base (a tensor the variant does not have, such as
// the memory-efficient bwd_dw2's weighted activation) leaves its map unset.
void bind_all(const std::vector<TensorMapSpec>& specs, DType dtype, std::initializer_list<MapBinding> bindings) {
  if (bindings.size() != specs.size()) throw InternalError("tensor maps and their bindings differ in number");
  std::size_t i = 0;
  for (const MapBinding& b : bindings) {
    if (b.base != nullptr) *b.map = encode(specs[i], b.base, dtype);
    ++i;
  }
}

}  // namespace

void bind_tensor_maps(Role role, const TileConfig& c, const MoeShape& shape, void* params) {
  if (!c.use_tma) return;
  const std::vector<TensorMapSpec> s = tensor_map_specs(role, c, shape);
  const DType dt = shape.dtype;
  switch (role) {
    case Role::kFwdUp: {
      auto& p = *static_cast<params::FwdUp*>(params);
      return bind_all(s, dt,
                      {{&p.w1_map, p.w1},
                       {&p.x_rows_map, p.x_rows},
                       {&p.act_map, p.act},
                       {&p.pre_act_map, p.pre_act}});
    }
    case Role::kFwdDown: {
      auto& p = *static_cast<params::FwdDown*>(params);
      return bind_all(s, dt, {{&p.act_map, p.act}, {&p.w2_map, p.w2}, {&p.y_map, p.y}});
    }
    case Role::kBwdDown: {
      auto& p = *static_cast<params::BwdDown*>(params);
      return bind_all(s, dt,
                      {{&p.w2_map, p.w2},
                       {&p.d_out_rows_map, p.d_out_rows},
                       {&p.pre_act_map, p.pre_act},
                       {&p.d_pre_act_map, p.d_pre_act}});
    }
    case Role::kBwdDw2: {
      auto& p = *static_cast<params::BwdDw2*>(params);
      // weighted_act's rows are its buffer's: dW1's room in a memory-efficient chunk (rows past
      // it read as zeros), of a column chunk's width. A chunk's dw2 starts at its first expert; it
      // stores only its own.
      std::vector<TensorMapSpec> maps = s;
      maps[1].dims[0] = static_cast<std::uint64_t>(p.wact_ld);
      maps[1].strides[0] = static_cast<std::uint64_t>(p.wact_ld) * kElem;
      maps[1].dims[1] = static_cast<std::uint64_t>(p.weighted_act_rows);
      return bind_all(maps, dt,
                      {{&p.d_out_rows_map, p.d_out_rows}, {&p.weighted_act_map, p.weighted_act}, {&p.dw2_map, p.dw2}});
    }
    case Role::kBwdDx: {
      auto& p = *static_cast<params::BwdDx*>(params);
      return bind_all(s, dt, {{&p.d_pre_act_map, p.d_pre_act}, {&p.w1_map, p.w1}, {&p.dx_rows_map, p.dx_rows}});
    }
    case Role::kBwdDw1: {
      auto& p = *static_cast<params::BwdDw1*>(params);
      return bind_all(s, dt, {{&p.d_pre_act_map, p.d_pre_act}, {&p.x_rows_map, p.x_rows}, {&p.dw1_map, p.dw1}});
    }
    default: break;
  }
  throw InternalError(fmt::format("{} has no TMA copies", role_name(role)));
}

}  // namespace moejit
