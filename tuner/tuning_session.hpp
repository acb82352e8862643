// A scratch problem on the GPU for tuning: random inputs generated on the device, every
// intermediate buffer of a training step, and the means to run, time and check one role with
// one candidate kernel. Tuning never touches a caller's buffers.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/device.hpp"
#include "cuda/handles.hpp"
#include "jit/kernel_cache.hpp"
#include "moe/memory_layout.hpp"
#include "moe/steps.hpp"
#include "moejit/moejit.hpp"
#include "tuner/tile_config.hpp"

namespace moejit {

struct Timing {
  double median_ms = 0;
  double spread_ms = 0;  // max - min over the repetitions
};

// The chunks diff() weighs alone in an output of `count` elements, as [begin, end) ranges: at
// most 256, each of at least 16384 elements (one where the output is smaller, none where it is
// empty), the last taking the remainder. One relative L2 norm over a whole output hid a few
// wrong rows or one wrong tile (3 rows of fwd_down's 65536 at T=8192 came to 0.0094 against a
// bound of 0.01); per chunk they stand out, while rounding differences stay near 0.002 in any
// chunk this large.
std::vector<std::pair<std::size_t, std::size_t>> check_chunks(std::size_t count);

class TuningSession {
 public:
  // Allocates and fills the scratch problem in the current context. Throws CudaError (e.g. out
  // of memory) or CompileError (utility kernels). Its stream runs on the whole device even where
  // a green context is current: a tuned row stands for the device, as a shipped one does.
  TuningSession(const MoeProblem& problem, const cuda::DeviceInfo& device);

  CUstream stream() const { return stream_.get(); }

  struct RoleKernel {
    TileConfig config;
    const jit::LoadedKernel* kernel = nullptr;
  };
  // Runs forward and backward once so every role's inputs hold real values, x and dO scattered
  // into sorted order among them; keeps the gather_sum kernel for the scatters.
  void prime(const std::map<Role, RoleKernel>& kernels);

  // Launches one role once (resetting what it accumulates into first). A config that reads
  // sorted token rows (sorted_rows_read) gets the scatter a step would spend on it first
  // (see launch()).
  void run(Role role, const RoleKernel& k);
  // run() for a candidate: a launch refused at once (too much shared memory for this device,
  // or the driver's CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, say) leaves the context as it was, so its
  // reason is returned and the candidate can be rejected; nullopt when it launched. Out of memory,
  // and an error the context does not survive, are thrown.
  std::optional<std::string> try_run(Role role, const RoleKernel& k);
  // CUDA-event median over `reps` launches; the scatter a config pays for counts in its time.
  // Burst (default): L2 flushed before each launch. Sustained: the launches run back to back
  // after about 25 ms of untimed ones, as a step's kernels run, with the clocks where a long run
  // holds them; nothing is flushed (a step leaves its own data in L2).
  Timing time(Role role, const RoleKernel& k, int reps, bool sustained = false);
  // The same for several candidates of one role, timed in turns (one launch of each per round,
  // `rounds` rounds), so a clock change under the power cap hits them alike. One Timing each.
  std::vector<Timing> time(Role role, const std::vector<RoleKernel>& kernels, int rounds, bool sustained = false);

  // Keeps a copy of the role's current outputs as the reference for diff(). Returns how many of
  // their values are not finite (routing's integers: 0): a reference run after poison() that
  // leaves any is itself wrong, and nothing can be checked against it.
  double snapshot(Role role);
  // Fills the role's outputs with 0xff bytes (NaN in every dtype), so that diff() finds any the
  // next run leaves unwritten. Routing is left alone: its tables are sized for the most tiles any
  // routing can need, and the entries past this routing's are nobody's output.
  void poison(Role role);
  // The largest relative L2 difference to the snapshot over the chunks of the role's outputs
  // (check_chunks); infinity when an output has a non-finite value or a difference
  // that is not a number (routing: 0 when identical, infinity otherwise).
  double diff(Role role);

  const MoeShape& shape() const { return shape_; }

  struct Span {
    CUdeviceptr ptr;
    std::size_t bytes;
    bool fp32 = false;  // fp32 values, else the problem's 16-bit dtype
  };
  // Everything the role writes that a later role or the caller reads, which diff() compares:
  // a config wrong in any one of them is rejected. The main output first.
  std::vector<Span> outputs_of(Role role) const;

 private:
  void launch(Role role, const RoleKernel& k);
  // Per chunk of `s` (check_chunks): sum of (got - want)^2, sum of want^2, and the
  // non-finite values of got. `got` and `want` hold s.bytes each.
  std::vector<std::array<double, 3>> chunk_sums(const Span& s, CUdeviceptr got, CUdeviceptr want);
  // Copies `bytes` at `from` back on the session's own (non-blocking) stream and waits for it: a
  // synchronous copy goes through the legacy stream, whose implicit synchronisation with every
  // blocking stream would invalidate a capture of one (the building thread's own, say).
  void read_back(void* to, CUdeviceptr from, std::size_t bytes);
  void scatter(params::GatherSum& params);

  MoeProblem problem_;
  MoeShape shape_;
  cuda::DeviceInfo device_;
  MemoryLayout layout_;
  int block_m_;
  bool aligned_;
  cuda::Stream stream_;
  cuda::DeviceBuffer x_, w1_, w2_, ids_, scores_, d_out_, out_, dx_, dw1_, dw2_, ds_;
  cuda::DeviceBuffer saved_, fwd_ws_, bwd_ws_, flush_, snapshot_, sums_;
  // x and dO in sorted order, apart from the workspaces a step reuses for them (y, dx_rows),
  // which other roles write here; the weighted activation apart from dW1's buffer, which
  // bwd_dw1's candidates overwrite.
  cuda::DeviceBuffer x_rows_, d_out_rows_, weighted_act_;
  ForwardSteps fwd_{};
  BackwardSteps bwd_{};
  const jit::LoadedKernel* utility_ = nullptr;
  RoleKernel gather_sum_{};
};

}  // namespace moejit
