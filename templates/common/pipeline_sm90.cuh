// The Hopper (sm_90a) warp-specialized main loop: one producer warpgroup fills the pipeline
// stages while the MMA warpgroups consume them, synchronized per stage by mbarriers instead of
// a block barrier per k tile. The producer fills the stages in k order (an mbarrier parity wait
// may run at most one phase ahead). Each stage has two barriers:
//   full[s]   the producer's copies into stage s landed (one cp.async-completion arrival per
//             producer thread, one arrival per producer warp covering synchronous fills, and,
//             when the role copies tiles with TMA, the first producer thread's arrival that
//             expects their bytes)
//   empty[s]  every MMA warp is done reading stage s (its wgmmas completed); in a cluster
//             pair (ClusterPair::paired) the other block's MMA warps too, since its producer
//             may copy into this block's stage s
// so the producer runs up to STAGES k tiles ahead of the tensor cores.
#pragma once

#include "common/gemm_sm80.cuh"
#include "common/tma_sm90.cuh"

namespace moejit {

constexpr int kProducerThreads = 128;  // one warpgroup, the unit setmaxnreg works on
constexpr int kProducerWarps = kProducerThreads / 32;

__device__ __forceinline__ void mbarrier_init(uint64* bar, uint32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes the initialized barriers visible to the other threads' and the async proxy's arrivals.
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void mbarrier_arrive(uint64* bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}

// Arrives on the barrier at the same offset in CTA `rank` of the cluster. The release is the
// default CTA-scope one: the stage's reads it publishes are this CTA's own wgmmas, complete by
// then, and a cluster-scope release once per k tile cost the pairs a quarter of their time.
__device__ __forceinline__ void mbarrier_arrive_remote(uint64* bar, uint32 rank) {
  uint32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// Arrives once this thread's earlier cp.asyncs have completed; the arrival is counted in the
// barrier's initial count (noinc).
__device__ __forceinline__ void mbarrier_arrive_on_cp_async(uint64* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(uint64* bar, uint32 parity) {
  uint32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ uint64 global_timer_ns() {
  uint64 t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

// Until the barrier's phase of `parity` has completed: the MMA warps' wait, a bare spin, since
// they wait with every accumulator live and a timer's registers would spill them.
__device__ __forceinline__ void mbarrier_wait(uint64* bar, uint32 parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

// A producer's wait that lasts this long is a bug (a stage whose copies never all land, a
// release that never comes), never a slow kernel: every wait covers microseconds of work.
constexpr uint64 kBarrierTimeoutNs = 10ull * 1000 * 1000 * 1000;

// mbarrier_wait for the producer warps and an epilogue group's warps, which have registers to
// spare: after kBarrierTimeoutNs the thread traps, so the launch fails with an error (the host
// throws CudaError) instead of hanging the process. The epilogue group's wait for a tile's
// handoff still pends after the producer's last wait, so a handoff lost at a block's last tile
// traps too. Inline and silent on purpose: a call or a printf in a kernel makes ptxas serialize
// every wgmma and ignore setmaxnreg (C7510, C7507). The clock is read only once a try_wait (which
// itself suspends a while in hardware) has failed.
__device__ __forceinline__ void mbarrier_wait_or_trap(uint64* bar, uint32 parity) {
  if (mbarrier_try_wait(bar, parity)) return;
  const uint64 start = global_timer_ns();
  while (!mbarrier_try_wait(bar, parity)) {
    if (global_timer_ns() - start > kBarrierTimeoutNs) asm volatile("trap;");
  }
}

// A producer's last step: until the copies into the last min(STAGES, filled) stages have landed
// (stage j of the ring: full[j % STAGES], phase j / STAGES). A stage short of its bytes then traps
// here even where the producer has no later wait, since the MMA warps' waits never time out.
template <int STAGES>
__device__ __forceinline__ void await_last_stages(uint64* full, uint32 filled) {
  for (uint32 j = filled > STAGES ? filled - STAGES : 0; j < filled; ++j) {
    mbarrier_wait_or_trap(full + j % STAGES, (j / STAGES) & 1);
  }
}

template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

// Register split between the producer and the MMA warpgroups: the producer gives back what
// the MMA warpgroups take. The cp.async producer needs ~90-110 registers for its unrolled
// address arithmetic (ptxas spills below that).
//   2 MMA warpgroups, one block per SM, launched at 168 (65536 / 384): 3 * 168 = 120 + 2 * 192.
//   1 MMA warpgroup, two blocks per SM so one's prologue and epilogue overlap the other's main
//   loop, launched at 128 (65536 / 512): 2 * 128 = 88 + 168, room for 128 x 128 accumulators.
//   2 MMA warpgroups and an epilogue warpgroup (bwd_down's, below), launched at 128 (65536 / 512),
//   which is all ptxas gives any of them: 4 * 128 >= 40 (a TMA-only producer) + 2 * 168 + 128.
template <int MMA_WARPS, bool EPILOGUE_GROUP = false>
struct RegisterSplit {
  static_assert(MMA_WARPS == 4 || MMA_WARPS == 8, "one or two MMA warpgroups");
  static_assert(!EPILOGUE_GROUP || MMA_WARPS == 8, "an epilogue warpgroup beside two MMA warpgroups");
  static constexpr int kProducer = EPILOGUE_GROUP ? 40 : MMA_WARPS == 8 ? 120 : 88;
  static constexpr int kMma = MMA_WARPS == 8 && !EPILOGUE_GROUP ? 192 : 168;
  static constexpr int kEpilogue = 128;
  static constexpr int kBlocksPerSm = MMA_WARPS == 8 ? 1 : 2;
};

// Where an epilogue group's warps run (persistent_main_loop): none; a warpgroup added to the
// block (bwd_down: 512 threads, every warp at the 128 registers the block starts with); or the
// producer warpgroup's warps beside the TMA warp (fwd_up: 384 threads, at the producer's
// registers, RegisterSplit's split kept).
enum class EpilogueWarps { kNone, kAddedWarpgroup, kSpareProducerWarps };

// The producer warpgroup's warps an epilogue group of EpilogueWarps::kSpareProducerWarps takes.
constexpr int kSpareProducerWarps = kProducerWarps - 1;

// An epilogue group: run(work) in its warps, for every work item in turn.
template <EpilogueWarps WHERE, typename Run>
struct EpilogueGroup {
  static constexpr EpilogueWarps kWhere = WHERE;
  Run run;
  template <typename Work>
  __device__ __forceinline__ void operator()(const Work& w) const {
    run(w);
  }
};
template <EpilogueWarps WHERE, typename Run>
__device__ __forceinline__ EpilogueGroup<WHERE, Run> make_epilogue_group(Run run) {
  return {run};
}

// Stands for "no epilogue group" in persistent_main_loop.
struct NoEpilogueGroup {
  static constexpr EpilogueWarps kWhere = EpilogueWarps::kNone;
  template <typename Work>
  __device__ __forceinline__ void operator()(const Work&) const {}
};

// The producer thread that issues a stage's TMA copies (the first one).
template <int MMA_THREADS>
__device__ __forceinline__ bool tma_thread() {
  return threadIdx.x == MMA_THREADS;
}

// Thread 0 initializes the stages' barriers: `full` waits for the producer's arrivals (see
// above), `empty` for `releases` arrivals. The caller publishes them (block or cluster barrier).
template <int STAGES, int TMA_BYTES>
__device__ __forceinline__ void init_stage_barriers(uint64* full, uint64* empty, uint32 releases,
                                                    uint32 producer_threads = kProducerThreads) {
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    mbarrier_init(full + s, producer_threads + producer_threads / 32 + (TMA_BYTES > 0 ? 1 : 0));
    mbarrier_init(empty + s, releases);
  }
  mbarrier_init_fence();
}

// What a main loop's `landed` step returns when the MMAs need every k row of the stage.
constexpr int kWholeKTile = 1 << 30;

// Barriers live in 2 * STAGES uint64 of shared memory (tuner/role_traits.cpp counts them), the
// `full` ones first. TMA_BYTES: what the TMA copies of one stage bring, which load(stage, kt)
// issues in tma_thread() on barrier `barriers + stage` (0: the role copies no tile with TMA).
// landed(stage, kt) runs in every MMA thread once stage kt has landed, before its MMAs: where a
// copy brought more than the tile should hold. It returns the k rows the MMAs need (kWholeKTile:
// all; fewer: the k16 steps past them are not issued, their rows need no zeroing), the same in
// every thread of a warp (WgmmaMma::compute_k_rows branches on it).
// `paired` (a ClusterPair's): both blocks of the pair run this loop over the same k tiles, and
// leave it together, so neither exits while the other may still arrive on its barriers.
// Returns true in the MMA threads, which go on to the epilogue with complete accumulators, and
// false in the producer threads, which have nothing more to do.
template <int STAGES, int TMA_BYTES, typename Mma, typename T, typename Load, typename Landed>
__device__ __forceinline__ bool warp_specialized_main_loop(Mma& mma, const T* sa, const T* sb, uint64* barriers,
                                                           int k_tiles, Load load, Landed landed, bool paired) {
  constexpr int kMmaThreads = Mma::kThreads;
  constexpr int kMmaWarps = kMmaThreads / 32;
  uint64* full = barriers;
  uint64* empty = barriers + STAGES;
  init_stage_barriers<STAGES, TMA_BYTES>(full, empty, kMmaWarps * (paired ? 2 : 1));
  if (paired) {
    cluster_sync();
  } else {
    __syncthreads();
  }
  const bool lane0 = (threadIdx.x & 31) == 0;
  const uint32 peer = cluster_rank() ^ 1;

  if (threadIdx.x >= kMmaThreads) {
    setmaxnreg_dec<RegisterSplit<kMmaWarps>::kProducer>();
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int s = kt % STAGES;
      if (kt >= STAGES) mbarrier_wait_or_trap(empty + s, ((kt / STAGES) - 1) & 1);
      if (TMA_BYTES > 0 && tma_thread<kMmaThreads>()) mbarrier_arrive_expect_tx(full + s, TMA_BYTES);
      load(s, kt);
      mbarrier_arrive_on_cp_async(full + s);
      __syncwarp();  // the warp's synchronous shared-memory fills, if any, precede lane 0's arrival
      if (lane0) mbarrier_arrive(full + s);
    }
    if (tma_thread<kMmaThreads>()) await_last_stages<STAGES>(full, static_cast<uint32>(k_tiles));
    cp_async_wait<0>();
    if (paired) cluster_sync();
    return false;
  }

  setmaxnreg_inc<RegisterSplit<kMmaWarps>::kMma>();
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % STAGES;
    mbarrier_wait(full + s, (kt / STAGES) & 1);
    const int k_rows = landed(s, kt);
    // The stage was written by cp.async / st.shared (generic proxy); wgmma reads it through
    // the async proxy.
    fence_proxy_async_shared();
    mma.compute_k_rows(sa + s * Mma::ATile::kElems, sb + s * Mma::BTile::kElems, kt > 0, mma.m0, k_rows);
    // compute() returns with k tile kt - 1's wgmmas complete: its stage may be refilled.
    if (kt > 0 && lane0) {
      mbarrier_arrive(empty + (kt - 1) % STAGES);
      if (paired) mbarrier_arrive_remote(empty + (kt - 1) % STAGES, peer);
    }
  }
  mma.drain();
  if (paired) {
    cluster_sync();
  } else {
    sync_mma_threads<kMmaThreads>();  // every warpgroup is done with the stages the epilogue reuses
  }
  return true;
}

// A persistent block's MMA warps over one item's k tiles, from stage ring position `it` on: each
// warpgroup issues the wgmmas of its first MI m64 blocks (Mma::kMi, or 1 in a halved item; a
// constant, so that each form keeps only its own accumulators live), and releases each stage
// once its wgmmas have completed. A function template, since NVRTC takes no generic lambdas in
// device code.
template <int MI, int STAGES, typename Mma, typename T, typename Work, typename Landed, typename Release>
__device__ __forceinline__ void mma_k_tiles(Mma& mma, const T* sa, const T* sb, uint64* full, uint32& it, const Work& w,
                                            int kts, Landed& landed, const Release& release) {
  for (int kt = 0; kt < kts; ++kt, ++it) {
    const int s = static_cast<int>(it % STAGES);
    mbarrier_wait(full + s, (it / STAGES) & 1);
    const int k_rows = landed(s, w, kt);
    fence_proxy_async_shared();
    mma.template compute_k_rows<MI>(sa + s * Mma::ATile::kElems, sb + s * Mma::BTile::kElems, kt > 0, mma.m0, k_rows);
    if (kt > 0) release(it - 1);
  }
  mma.drain();
  if (kts > 0) release(it - 1);
}

// The persistent form of the loop above (src/moe/launch.cpp sizes the grid to the blocks the
// device runs at once). Block b (a pair, b = c, in clusters of two) works through items b,
// b + blocks, ...: schedule(item, work) gives its work of the item (false, in every block of a
// cluster alike, to skip it), k_tiles(work) its k tiles (0: the accumulators are undefined, for
// epilogue(work) to zero). The stage ring and its phases run on across items, so the producer
// copies the next item's first k tiles while the MMA warps run epilogue(work), which therefore
// must not use the stages.
// load(stage, work, kt) and landed(stage, work, kt) as the loop above's load and landed;
// after_loads(work) runs in the producer threads once they have issued the work's k tiles (for
// copies the epilogue reads, into shared memory of the role's own, on barriers of its own). One warp
// of each MMA warpgroup releases a stage (a warpgroup's wgmmas complete together); in a pair,
// another warp releases it in the other block too, since that block's producer may multicast
// into this one's stages: both blocks run the same k tiles per item, in step.
// A work item whose schedule set the Mma's `split` (WgmmaMma::set_split: a token tile of at most
// 64 rows) runs its k tiles alternately in the two MMA warpgroups, for the epilogue to fold, or,
// where the warpgroups split N, each warpgroup's first m64 block alone.
// With an epilogue group (group_epilogue an EpilogueGroup), its warps run group_epilogue(work)
// for every work item in turn, while the MMA warps' epilogue(work) only hands their accumulators
// over: the tensor cores then run the next item's main loop under the last item's epilogue. The
// two sides meet on barriers of the role's own. Where the group takes the producer warpgroup's
// spare warps, the producer is its first warp alone (TMA copies need no more).
// LAG > 0 staggers two MMA warpgroups: the second starts once the first has completed LAG k
// tiles, and they never meet again (their epilogues and landed steps use barriers of their own,
// OwnWarpgroup; no item is split), so one's epilogue runs under the other's wgmmas, which then
// have the tensor cores alone and catch up by as much: the lag persists. The producer, which
// waits for both to release a stage, then keeps STAGES - LAG stages ahead of the first.
template <int CLUSTER, int STAGES, int TMA_BYTES, typename Work, int LAG = 0, typename Mma, typename T, typename Schedule,
          typename KTiles, typename Load, typename AfterLoads, typename Landed, typename Epilogue,
          typename GroupEpilogue = NoEpilogueGroup>
__device__ __forceinline__ void persistent_main_loop(Mma& mma, const T* sa, const T* sb, uint64* barriers,
                                                       int64 items, Schedule schedule, KTiles k_tiles, Load load,
                                                       AfterLoads after_loads, Landed landed, Epilogue epilogue,
                                                       GroupEpilogue group_epilogue = {}) {
  constexpr int kMmaThreads = Mma::kThreads;
  constexpr int kMmaGroups = kMmaThreads / 128;
  constexpr EpilogueWarps kGroup = GroupEpilogue::kWhere;
  static_assert(kGroup == EpilogueWarps::kNone || (CLUSTER == 1 && TMA_BYTES > 0),
                "an epilogue group in TMA blocks of their own");
  using Split = RegisterSplit<kMmaGroups * 4, kGroup == EpilogueWarps::kAddedWarpgroup>;
  constexpr int kProducers = kGroup == EpilogueWarps::kSpareProducerWarps ? 32 : kProducerThreads;
  uint64* full = barriers;
  uint64* empty = barriers + STAGES;
  init_stage_barriers<STAGES, TMA_BYTES>(full, empty, CLUSTER * kMmaGroups, kProducers);
  if constexpr (CLUSTER == 2) cluster_sync();
  else __syncthreads();
  const bool lane0 = (threadIdx.x & 31) == 0;
  const uint32 rank = CLUSTER == 2 ? cluster_rank() : 0;
  const int64 first = blockIdx.x / CLUSTER, step = gridDim.x / CLUSTER;
  uint32 it = 0;  // k tiles through the ring so far: stage it % STAGES, phase (it / STAGES) & 1

  const auto run_group = [&] {
    for (int64 item = first; item < items; item += step) {
      Work w;
      if (schedule(item, w)) group_epilogue(w);
    }
  };
  if (kGroup == EpilogueWarps::kAddedWarpgroup && threadIdx.x >= kMmaThreads + kProducerThreads) {
    setmaxnreg_dec<Split::kEpilogue>();
    run_group();
    return;
  }
  if (threadIdx.x >= kMmaThreads) {
    setmaxnreg_dec<Split::kProducer>();  // every warp of the warpgroup, spare ones included
    if (kGroup == EpilogueWarps::kSpareProducerWarps && threadIdx.x >= kMmaThreads + kProducers) {
      run_group();
      return;
    }
    for (int64 item = first; item < items; item += step) {
      Work w;
      if (!schedule(item, w)) continue;
      const int kts = k_tiles(w);
      for (int kt = 0; kt < kts; ++kt, ++it) {
        const int s = static_cast<int>(it % STAGES);
        if (it >= STAGES) mbarrier_wait_or_trap(empty + s, ((it / STAGES) - 1) & 1);
        if (TMA_BYTES > 0 && tma_thread<kMmaThreads>()) mbarrier_arrive_expect_tx(full + s, TMA_BYTES);
        load(s, w, kt);
        mbarrier_arrive_on_cp_async(full + s);
        __syncwarp();
        if (lane0) mbarrier_arrive(full + s);
      }
      after_loads(w);
    }
    if (tma_thread<kMmaThreads>()) await_last_stages<STAGES>(full, it);
    cp_async_wait<0>();
    if constexpr (CLUSTER == 2) cluster_sync();
    return;
  }

  setmaxnreg_inc<Split::kMma>();
  static_assert(LAG == 0 || (kMmaGroups == 2 && LAG < STAGES), "a lag within the ring (the first warpgroup's k tile LAG "
                                                               "lands without the second's releases)");
  // This thread's MMA warpgroup, broadcast from lane 0 so that ptxas sees the split loop's
  // branch around its wgmmas as warp-uniform.
  const int group = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  // Warp 0 of each warpgroup releases a stage here, warp 1 in the other block.
  const int warp_in_group = static_cast<int>((threadIdx.x & 127) >> 5);
  const auto release = [&](uint32 j) {
    if (LAG > 0 && group == 0 && j == LAG - 1) stagger_start();
    if (!lane0) return;
    if (warp_in_group == 0) mbarrier_arrive(empty + j % STAGES);
    if (CLUSTER == 2 && warp_in_group == 1) mbarrier_arrive_remote(empty + j % STAGES, rank ^ 1);
  };
  if (LAG > 0 && group == 1) stagger_wait();
  for (int64 item = first; item < items; item += step) {
    Work w;
    if (!schedule(item, w)) continue;
    const int kts = k_tiles(w);
    mma.discard();
    if (!mma.split) {
      mma_k_tiles<Mma::kMi, STAGES>(mma, sa, sb, full, it, w, kts, landed, release);
    } else if constexpr (!Mma::kCanSplit) {
      mma_k_tiles<1, STAGES>(mma, sa, sb, full, it, w, kts, landed, release);  // halved (WgmmaMma::kCanHalve)
    } else {
      // A split item (WgmmaMma::split, token tiles, whose landed step is empty): both warpgroups
      // multiply its first 64 rows, the first over its even k tiles, the second over its odd
      // ones. Each releases the stages it skips unread and the ones it multiplies as soon as its
      // wgmmas complete (holding one through its next k tile, two ahead, would leave the producer
      // a stage short); the other warpgroup's wgmmas keep the tensor cores busy meanwhile.
      for (int kt = 0; kt < kts; ++kt, ++it) {
        const int s = static_cast<int>(it % STAGES);
        mbarrier_wait(full + s, (it / STAGES) & 1);
        if ((kt & 1) == group) {
          fence_proxy_async_shared();
          mma.compute(sa + s * Mma::ATile::kElems, sb + s * Mma::BTile::kElems, kt > 1, 0);
          mma.drain();
        }
        release(it);
      }
    }
    epilogue(w);
  }
  if (LAG > 0 && group == 0 && it < LAG) stagger_start();  // fewer k tiles than the lag
  if constexpr (CLUSTER == 2) cluster_sync();
}

}  // namespace moejit
