// Grid, block and shared memory of each GEMM and gather role for a problem (pure), and the
// launch itself.
#pragma once

#include <cuda.h>

#include "jit/loaded_kernel.hpp"
#include "jit/role.hpp"
#include "moe/kernel_params.hpp"
#include "moe/shape.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

struct LaunchGeometry {
  jit::Dim3 grid;
  jit::Dim3 block;
  unsigned smem_bytes = 0;
  unsigned cluster = 1;  // blocks per cluster along x; grid.x is a multiple of it
};

// max_tiles: the routing bound on token tiles (token GEMMs' m extent). vector: gather_sum's
// 8-element path.
LaunchGeometry launch_geometry(Role role, const TileConfig& config, const MoeShape& shape, long long max_tiles,
                               bool vector);

// An expert GEMM's geometry for a launch over `experts` of the shape's `of` experts alone (the
// memory-efficient backward's chunks): its grid holds only their tiles, so that no block looks
// up an expert past them.
LaunchGeometry expert_subset(const LaunchGeometry& g, int of, int experts);

// A GEMM's geometry for a launch over `columns` of its `of` output columns alone (the
// memory-efficient backward's column chunks), in tiles of block_n: at least every tile of
// those columns, in whole clusters (a token grid's blocks past its tiles exit at once).
LaunchGeometry column_subset(const LaunchGeometry& g, int of, int columns, int block_n);

// A persistent grid's clusters on a share of `share_sms` of the device's `device_sms` SMs (a
// green context), from the `whole_device` clusters resident on all of them: in proportion,
// rounded down, at least one. A grid sized for the whole device would run in rounds there, the
// last one short.
unsigned clusters_on_share(unsigned whole_device, int share_sms, int device_sms);

// Where a call's kernels run: its stream, and the SMs that stream may use, asked once per call.
// share_sms 0: the whole device.
struct LaunchStream {
  CUstream stream = nullptr;
  int share_sms = 0;  // a green context's stream: its share, of the device's device_sms
  int device_sms = 0;
  bool green = false;  // the stream runs on a green context (share_sms is 0 where the driver cannot tell its SMs)
  cuda::WorkQueue* queue = nullptr;  // where the launches go (a call's graph); null: straight onto `stream`
};

// Launches functions[index] of `kernel` where `on` sends its work.
void launch_kernel(const jit::LoadedKernel& kernel, std::size_t index, jit::Dim3 grid, jit::Dim3 block,
                   unsigned smem_bytes, const LaunchStream& on, void** args, unsigned cluster = 1);

// Enqueues the role's kernel, compiled for `config`, with `params` (a pointer to its parameter
// struct; a TMA config's tensor maps are encoded into it first). gather_sum: the sum. A persistent
// grid holds the blocks resident on the SMs `on` names.
void launch_role(Role role, const TileConfig& config, const MoeShape& shape, const jit::LoadedKernel& kernel,
                 const LaunchGeometry& g, void* params, const LaunchStream& on);

// Enqueues the gather_sum module's scatter (templates/gather_sum.cuh) with `params`, on the
// gather_sum geometry `g`.
void launch_scatter_rows(const jit::LoadedKernel& gather_sum, const LaunchGeometry& g, params::GatherSum& params,
                         const LaunchStream& on);

}  // namespace moejit
