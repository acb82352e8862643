#include "moe/routing.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "moe/kernel_params.hpp"
#include "moe/launch.hpp"
#include "moejit/error.hpp"

namespace moejit {
namespace {

// The check's grid: 1024 blocks of 128-1024 threads cover an H200 several times over.
constexpr long long kMaxCheckBlocks = 1024;

// The fields both the routing and its check take: the problem's sizes and the tables.
params::Routing table_params(const RoutingBuffers& b, const RoutingLayout& l, long long pairs, int experts,
                             int block_m) {
  params::Routing p{};
  p.num_pairs = static_cast<std::int32_t>(pairs);
  p.num_experts = experts;
  p.block_m = block_m;
  p.max_tiles = static_cast<std::int32_t>(l.max_tiles);
  p.expert_offsets = b.expert_offsets;
  p.expert_tile_offsets = b.expert_tile_offsets;
  p.tile_expert = b.tile_expert;
  p.tile_row_begin = b.tile_row_begin;
  p.sorted_pairs = b.sorted_pairs;
  p.pair_rows = b.pair_rows;
  p.ranked_experts = b.ranked_experts;
  return p;
}

}  // namespace

RoutingBuffers routing_buffers(CUdeviceptr ws, const RoutingLayout& l) {
  auto at = [&](std::size_t off) { return reinterpret_cast<std::int32_t*>(ws + off); };
  return {at(l.chunk_counts), at(l.expert_counts),  at(l.expert_offsets), at(l.expert_tile_offsets),
          at(l.tile_expert),  at(l.tile_row_begin), at(l.sorted_pairs),   at(l.pair_rows),
          at(l.ranked_experts)};
}

RoutingLayout validate_routing_args(const RoutingArgs& a) {
  if (a.tokens < 1) throw InvalidArgument("tokens", fmt::format("must be at least 1, got {}", a.tokens));
  if (a.topk < 1) throw InvalidArgument("topk", fmt::format("must be at least 1, got {}", a.topk));
  if (a.experts < 1 || a.experts > kMaxExperts) {
    throw InvalidArgument("experts", fmt::format("must be in [1, {}], got {}", kMaxExperts, a.experts));
  }
  if (a.topk > a.experts) {
    throw InvalidArgument("topk", fmt::format("top-{} of {} experts", a.topk, a.experts));
  }
  if (a.tokens > kMaxPairs / a.topk) {
    throw InvalidArgument("tokens", fmt::format("tokens * topk = {} * {} must be at most 2^31 - {}", a.tokens, a.topk,
                                                kMaxBlockM));
  }
  if (a.block_m < 1 || a.block_m > kMaxBlockM) {
    throw InvalidArgument("block_m", fmt::format("must be in [1, {}], got {}", kMaxBlockM, a.block_m));
  }
  if (a.topk_ids == 0) throw InvalidArgument("topk_ids", "null device pointer");
  if (a.topk_ids % 4 != 0) throw InvalidArgument("topk_ids", "must be 4-byte aligned");
  if (a.workspace == 0) throw InvalidArgument("workspace", "null device pointer");
  if (a.workspace % 256 != 0) throw InvalidArgument("workspace", "must be 256-byte aligned");
  const RoutingLayout l = routing_layout(a.tokens * a.topk, a.experts, a.block_m);
  if (a.workspace_bytes < l.total_bytes) {
    throw InvalidArgument("workspace_bytes",
                          fmt::format("{} bytes given, routing needs {}", a.workspace_bytes, l.total_bytes));
  }
  return l;
}

void launch_routing(const jit::LoadedKernel& kernel, const TileConfig& config, const RoutingArgs& a,
                    cuda::WorkQueue* queue) {
  const RoutingLayout l = validate_routing_args(a);
  const long long pairs = a.tokens * a.topk;
  const RoutingBuffers b = routing_buffers(a.workspace, l);
  const long long chunk = static_cast<long long>(config.threads()) * config.items;
  if (chunk < kRoutingMinChunk) {
    throw InternalError(fmt::format("routing config {} has chunks below the workspace's minimum", config.name()));
  }
  params::Routing p = table_params(b, l, pairs, a.experts, a.block_m);
  p.topk_ids = reinterpret_cast<const std::int32_t*>(a.topk_ids);
  p.num_chunks = static_cast<std::int32_t>((pairs + chunk - 1) / chunk);
  p.scanned = routing_scans(p.num_chunks, a.experts) ? 1 : 0;
  p.chunk_counts = b.chunk_counts;
  p.expert_counts = b.expert_counts;
  if (!a.rank_experts) p.ranked_experts = nullptr;
  void* args[] = {&p};
  const unsigned threads = static_cast<unsigned>(config.threads());
  const unsigned chunks = static_cast<unsigned>(p.num_chunks);
  auto smem = [&](int phase) {
    return static_cast<unsigned>(routing_smem_bytes(phase, config.threads(), a.experts));
  };
  LaunchStream on{a.stream};
  on.queue = queue;
  // One chunk: the scatter phase counts its pairs itself, so the count launch is skipped.
  if (chunks > 1) launch_kernel(kernel, 0, {chunks}, {threads}, smem(0), on, args);
  if (p.scanned) launch_kernel(kernel, 2, {static_cast<unsigned>(a.experts + 1)}, {threads}, smem(2), on, args);
  launch_kernel(kernel, 1, {chunks}, {threads}, smem(1), on, args);
}

void launch_routing_check(const jit::LoadedKernel& kernel, const TileConfig& config, const RoutingCheckArgs& a) {
  const RoutingLayout& l = a.layout;
  params::Routing p = table_params(routing_buffers(a.tables, l), l, a.pairs, a.experts, a.block_m);
  p.stamp = reinterpret_cast<std::uint32_t*>(a.stamp);
  p.stamp_value = a.stamp_value;
  void* args[] = {&p};
  const long long threads = config.threads();
  const long long widest = std::max({a.pairs, l.max_tiles, static_cast<long long>(a.experts)});
  // Grid-stride: enough blocks to fill the device, each thread a few items at most.
  const auto blocks = static_cast<unsigned>(std::min<long long>((widest + threads - 1) / threads, kMaxCheckBlocks));
  kernel.launch(3, {blocks}, {static_cast<unsigned>(threads)}, 0, a.stream, args);
}

}  // namespace moejit
