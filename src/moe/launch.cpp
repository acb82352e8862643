#include "moe/launch.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "moe/tensor_maps.hpp"
#include "moejit/error.hpp"
#include "tuner/role_traits.hpp"

namespace moejit {
namespace {

// A role's kernel is its module's first function; gather_sum's module has the scatter second
// (jit/codegen.cpp's instantiation order).
constexpr int kRoleKernel = 0;
constexpr int kScatterRowsKernel = 1;

long long cdiv(long long a, long long b) { return (a + b - 1) / b; }

// CUDA's limit on a grid's x extent (y's is kMaxGatherColumnBlocks).
constexpr long long kMaxGridX = std::numeric_limits<int>::max();

unsigned grid_extent(long long blocks, Role role, long long limit = kMaxGridX) {
  if (blocks < 1 || blocks > limit) {
    throw UnsupportedError(fmt::format("{} would need {} blocks along one grid axis; at most {}", role_name(role),
                                       blocks, limit));
  }
  return static_cast<unsigned>(blocks);
}

}  // namespace

LaunchGeometry launch_geometry(Role role, const TileConfig& c, const MoeShape& shape, long long max_tiles,
                               bool vector) {
  LaunchGeometry g;
  g.block = {static_cast<unsigned>(role_block_threads(role, c))};
  g.smem_bytes = static_cast<unsigned>(role_smem_bytes(role, c, shape));
  const GemmDims d = gemm_dims(role, shape);
  switch (role_kind(role)) {
    case RoleKind::kTokenGemm:
      // A cluster's padding block has no tile and exits at once (templates/common/moe_tiles.cuh).
      g.cluster = static_cast<unsigned>(c.cluster);
      g.grid = {grid_extent(cdiv(max_tiles * cdiv(d.n, c.block_n), c.cluster) * c.cluster, role)};
      break;
    case RoleKind::kExpertGemm:
      g.grid = {grid_extent(static_cast<long long>(shape.experts) * cdiv(d.m, c.block_m) * cdiv(d.n, c.block_n), role)};
      break;
    case RoleKind::kGather:
      // The column blocks run along y: a launch past its limit would fail only when enqueued.
      g.grid = {grid_extent(shape.tokens, role),
                grid_extent(gather_column_blocks(c, shape.hidden, vector), role, kMaxGatherColumnBlocks)};
      break;
    case RoleKind::kRouting:
    case RoleKind::kUtility:
      throw InternalError(fmt::format("{} has its own launcher", role_name(role)));
  }
  return g;
}

LaunchGeometry expert_subset(const LaunchGeometry& g, int of, int experts) {
  LaunchGeometry out = g;
  out.grid.x = g.grid.x / static_cast<unsigned>(of) * static_cast<unsigned>(experts);
  return out;
}

LaunchGeometry column_subset(const LaunchGeometry& g, int of, int columns, int block_n) {
  LaunchGeometry out = g;
  const long long all = cdiv(of, block_n), part = cdiv(columns, block_n);
  out.grid.x = static_cast<unsigned>(cdiv(cdiv(static_cast<long long>(g.grid.x) * part, all), g.cluster) * g.cluster);
  return out;
}

unsigned clusters_on_share(unsigned whole_device, int share_sms, int device_sms) {
  if (share_sms <= 0 || device_sms <= 0 || share_sms >= device_sms) return whole_device;
  const unsigned long long part = static_cast<unsigned long long>(whole_device) * static_cast<unsigned>(share_sms) /
                                  static_cast<unsigned>(device_sms);
  return std::max(1u, static_cast<unsigned>(part));
}

void launch_role(Role role, const TileConfig& config, const MoeShape& shape, const jit::LoadedKernel& kernel,
                 const LaunchGeometry& g, void* params, const LaunchStream& on) {
  bind_tensor_maps(role, config, shape, params);
  void* args[] = {params};
  jit::Dim3 grid = g.grid;
  if (persistent_grid(role, config)) {
    // Blocks beyond those resident would only wait for a slot; the persistent ones loop over the tiles.
    unsigned clusters = kernel.resident_clusters(kRoleKernel, g.block, g.smem_bytes, g.cluster);
    clusters = clusters_on_share(clusters, on.share_sms, on.device_sms);
    grid.x = std::min(grid.x, g.cluster * clusters);
  }
  launch_kernel(kernel, kRoleKernel, grid, g.block, g.smem_bytes, on, args, g.cluster);
}

void launch_kernel(const jit::LoadedKernel& kernel, std::size_t index, jit::Dim3 grid, jit::Dim3 block,
                   unsigned smem_bytes, const LaunchStream& on, void** args, unsigned cluster) {
  if (on.queue != nullptr) {
    kernel.launch(index, grid, block, smem_bytes, *on.queue, args, cluster);
  } else {
    kernel.launch(index, grid, block, smem_bytes, on.stream, args, cluster);
  }
}

void launch_scatter_rows(const jit::LoadedKernel& gather_sum, const LaunchGeometry& g, params::GatherSum& params,
                         const LaunchStream& on) {
  void* args[] = {&params};
  launch_kernel(gather_sum, kScatterRowsKernel, g.grid, g.block, g.smem_bytes, on, args);
}

}  // namespace moejit
