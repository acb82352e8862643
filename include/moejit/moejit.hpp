// moejit: the fused Mixture-of-Experts expert block (token-gathered grouped GEMMs, fused SwiGLU,
// router-score weighting), forward and backward, JIT-compiled for the GPU it runs on.
//
// Layouts (row-major, contiguous; HF Transformers v5 / Liger):
//   x [T, H]   w1 (gate_up) [E, 2I, H]: rows 0..I-1 gate, I..2I-1 up   w2 (down) [E, H, I]
//   topk_ids [T, K] int32   topk_weights [T, K] (dtype)   out, dx [T, H]   d_topk_weights [T, K]
//   out[t] = sum_k s[t,k] * (silu(g) * u)(x[t] W1[e]^T) W2[e]^T,  e = topk_ids[t,k]
//
// Expert ids outside [0, E) are dropped: that (token, slot) reaches no expert, contributes
// nothing to out, and gets a zero d_topk_weights; no memory outside the tensors is touched.
// Options::check_expert_ids turns them into an InvalidArgument error instead, as it does a token
// that names one expert in two slots (it synchronises the stream once per forward to read the
// count and the ids, so it is off by default).
//
// The caller allocates everything (device memory, 256-byte aligned): memory() says how much.
// Each call checks that every tensor begins and ends in device memory of the plan's GPU (or in
// managed memory), and throws InvalidArgument naming the first that does not.
// forward() and backward() only enqueue work on the caller's stream: no allocation, no
// host-device synchronisation (but checking mode's, and a backward's first over an adopted or
// captured forward's state: adopt_saved), so both can be captured in a CUDA graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "moejit/error.hpp"
#include "moejit/types.hpp"

struct CUstream_st;  // cudaStream_t and CUstream are both CUstream_st*

namespace moejit {

enum class Mode : int {
  kTraining = 0,         // saves the pre-activations for backward
  kInference = 1,        // forward only; nothing saved
  kMemoryEfficient = 2,  // training; backward overwrites the saved state (one backward per forward)
};

const char* mode_name(Mode m) noexcept;  // "train", "infer", "memeff"

struct MoeProblem {
  long long tokens = 0;     // T >= 1
  int experts = 0;          // E in [1, 4096]
  int hidden = 0;           // H >= 1
  int intermediate = 0;     // I >= 1
  int topk = 0;             // K in [1, E]; T*K <= 2^31 - 256
  DType dtype = DType::kBF16;
  Mode mode = Mode::kTraining;
};

// Device bytes the caller provides. Zero where a mode needs nothing.
struct MemoryPlan {
  std::size_t saved_bytes = 0;               // kept from forward() to backward()
  std::size_t forward_workspace_bytes = 0;   // scratch of one forward(); reusable once it is done
  std::size_t backward_workspace_bytes = 0;  // scratch of one backward()
};

struct ForwardArgs {
  const void* x = nullptr;
  const void* w1 = nullptr;
  const void* w2 = nullptr;
  const std::int32_t* topk_ids = nullptr;
  const void* topk_weights = nullptr;
  void* out = nullptr;
  void* saved = nullptr;        // training modes: MemoryPlan::saved_bytes; inference: unused
  std::size_t saved_bytes = 0;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  CUstream_st* stream = nullptr;  // null: the legacy default stream
};

struct BackwardArgs {
  const void* d_out = nullptr;
  // Read only for the weight gradients: may be null when dw1 and dw2 are (frozen experts).
  const void* x = nullptr;
  const void* w1 = nullptr;
  const void* w2 = nullptr;
  // Never read (the routing is in `saved`): may be null. x and topk_ids, where given, are checked
  // like the forward's.
  const std::int32_t* topk_ids = nullptr;
  const void* topk_weights = nullptr;
  // What forward() wrote. Memory-efficient mode consumes it (writes over it), so there it must
  // not overlap any other argument.
  void* saved = nullptr;
  std::size_t saved_bytes = 0;
  void* dx = nullptr;
  // Written, never accumulated into. backward() also keeps an intermediate here while it runs
  // (written over last; training mode where T*K <= 2*E*H, memory-efficient mode unless bwd_dw2
  // recomputes the activation), so it must not overlap any other argument. Both null (frozen
  // experts): neither weight gradient is computed, and the backward runs only what dx and
  // d_topk_weights need; one null alone is an InvalidArgument.
  void* dw1 = nullptr;
  void* dw2 = nullptr;
  void* d_topk_weights = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  CUstream_st* stream = nullptr;
};

struct Options {
  // Expert ids outside [0, E), and a token naming one expert twice, become forward()'s
  // InvalidArgument (one stream synchronisation per call; unchecked, they are dropped or count
  // twice, README: Using the library). Found after the routing ran: `saved` (inference: the
  // workspace) then holds the rejected call's routing, and backward() refuses it (StateError).
  bool check_expert_ids = false;
  // The stream the plan will run on. While it is being captured into a CUDA graph the plan
  // never tunes: it takes the nearest tuned row or the heuristic default.
  CUstream_st* stream = nullptr;
  // Per-role config overrides by role name ("fwd_up", ...) and config name as printed by
  // `moejit compile` ("bm64_bn128_bk32_s3_w4_g8"); for tests and experiments. An unknown role
  // name or config name throws InvalidArgument; a role the plan's mode does not run is ignored.
  std::map<std::string, std::string> config_overrides;
};

// A plan for one problem: validates it, chooses a config per kernel role, compiles (or loads
// from the cache) and loads every kernel into the current CUDA context. Construct it once per
// shape; forward()/backward() then cost only the launches, one graph launch each eagerly
// (README: Enqueueing). Not thread-safe for concurrent calls on one object from several threads
// (a call that finds the plan's graph in another thread's use launches one by one instead, but
// nothing else is promised).
class FusedMoe {
 public:
  explicit FusedMoe(const MoeProblem& problem, const Options& options = {});
  ~FusedMoe();
  FusedMoe(FusedMoe&&) noexcept;
  FusedMoe& operator=(FusedMoe&&) noexcept;

  const MoeProblem& problem() const;
  const MemoryPlan& memory() const;
  // The config each kernel role runs with, by role name ("fwd_up" -> "bm64_bn64_bk32_s4_w4_g8").
  std::map<std::string, std::string> configs() const;
  // Where each role's config came from: "override", "memory", "user_db", "shipped_db", "tuned",
  // "nearest_bucket" or "heuristic".
  std::map<std::string, std::string> config_sources() const;
  // Whether the last forward() or backward() launched its kernels as the plan's graph of that
  // call (one launch, kept from call to call; README: Enqueueing) rather than one by one on the
  // stream. False before the first call.
  bool last_call_graphed() const;

  // Throws InvalidArgument (naming the argument) before enqueuing anything; check_expert_ids'
  // rejection comes after the routing (Options).
  void forward(const ForwardArgs& args);
  // Throws InvalidArgument, or StateError for a saved state not known to hold a forward of this
  // problem: a buffer no forward() of this process wrote, a second backward over
  // memory-efficient state, a forward() into it that threw after enqueuing (check_expert_ids'
  // rejection, a failed launch), a forward of another problem (another plan's T, say) that
  // wrote it last, a later call that wrote over part of it (its out, workspace or gradients,
  // or another state starting inside the buffer), or a forward in another CUDA context than this
  // plan's (one since reset or destroyed, whose address a new allocation got). That check is the
  // process's record of the calls on each `saved` address, across plans and contexts: it cannot
  // see CUDA graph replays or copies. A forward captured into a graph is recorded as it is
  // captured (declare the replayed state with adopt_saved where calls since the capture wrote
  // over it), and its stamp is checked as an adopted state's (adopt_saved): the first backward
  // outside a capture after it reads the stamp, synchronising the stream, and refuses a state
  // whose graph has not run (unless the buffer still holds an earlier forward's state of this
  // problem, which it then takes: stale, within bounds). A state copied to a new address is
  // checked by what that address last held: see adopt_saved.
  void backward(const BackwardArgs& args);
  // Declares that `saved` holds a state a forward() of this problem completed, copied there
  // afterwards (offloaded to the host and brought back, as PyTorch's save_on_cpu does, or from
  // another process), so that backward() takes it; states the copy wrote over are lost, as after a
  // forward. Recorded for this plan's context, as its forward's are. The PyTorch front end
  // declares the states it gets as copies (save_on_cpu's, AOTAutograd's), of its problem's size; a
  // forward's own state, still at its address, it leaves to the record. A forward's last write is
  // a stamp of its problem and build at the state's end (cleared before its first kernel, and by a
  // memory-efficient backward): the first backward over an adopted state reads it on its stream,
  // after the copy, synchronising the stream, and refuses a state stamped for another problem or
  // build, or not at all, or whose routing tables are not what a forward writes (a damaged copy;
  // the routing kernel's check phase, on the stream before the read), with StateError, before
  // anything else is enqueued (MOEJIT_CHECK_ADOPTED=0:
  // no read, the caller trusted). A backward being captured cannot read it and takes the state
  // unchecked; the next one outside a capture checks it. Throws InvalidArgument for a null, misaligned or non-device `saved` (or
  // one of another context's memory), StateError for an inference plan.
  void adopt_saved(const void* saved);

  struct Impl;

 private:
  Impl& live() const;  // throws StateError for a moved-from plan
  std::unique_ptr<Impl> impl_;
};

// Sets one of the library's settings, the MOEJIT_* variables of README "Environment variables",
// for this process in place of the environment: `name` is "MOEJIT_DB" or "DB"; std::nullopt (or "")
// unsets it, so its default applies whatever the environment holds. It applies where the
// setting is next read, as a changed variable would: plans already built keep their kernels and
// configs, and MOEJIT_CUDA_DRIVER is read once, at the first GPU use. Thread-safe, and the process
// environment is left alone: setenv is not safe against another thread's getenv, and plans read
// their settings on whichever thread builds them. Throws InvalidArgument for an unknown name, or
// for a value the setting's reader refuses (MOEJIT_AUTOTUNE=off, MOEJIT_JOBS=0).
void set_option(std::string_view name, std::optional<std::string_view> value);
// The same for a C string, a null one unsetting (a string_view of null is undefined).
void set_option(std::string_view name, const char* value);
// Drops set_option's setting of `name`: the environment variable applies again.
void clear_option(std::string_view name);

}  // namespace moejit
