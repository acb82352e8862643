// What this process knows of the saved-state buffers its forwards wrote, across every plan: a
// backward takes only a buffer recorded as holding a complete state of its own problem, written
// in its own CUDA context. Thread-safe.
//
// Refused: an address no forward recorded (its routing tables would be whatever the memory
// held, and the kernels index with them: a read or write past any buffer), a forward into it
// that stopped part-way, a memory-efficient backward that consumed it, and a state written by a
// forward of another problem (another plan's T, say), whose layout would send the kernels'
// reads elsewhere, and a state that a later call of the process wrote over in part (its out or
// workspace, or another state starting elsewhere in the buffer). A state copied to a new address
// (PyTorch's save_on_cpu brings one back elsewhere) is recorded by FusedMoe::adopt_saved, on the
// caller's word; the first backward over it that can read it (one not being captured) checks
// first that its stamp is this problem's (state_stamp): the same size does not make a state
// this problem's (every E from 2 to 16 at T=64, K=2, H=I=64 has one size), and another
// problem's routing tables would send the kernels' writes past dW1, dW2 and dx. A forward
// captured into a CUDA graph is recorded as it is captured, though its kernels run only with the
// graph: its stamp is checked as an adopted state's, so a graph never run leaves a refusal, not
// whatever the buffer held.
//
// Also refused: a state recorded in another CUDA context (by cuCtxGetId, never reused). A context
// reset or destroyed takes its memory with it, and a new context's allocation often gets the same
// address; the record would otherwise call that fresh memory complete. Records are still one map
// by address across contexts: the process has one address space (UVA) over every device and
// context, so bytes written at an address are those bytes whichever context wrote them, and a
// write overlapping another context's record marks it as any other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "moe/validate.hpp"
#include "moejit/moejit.hpp"

namespace moejit {

// The value a forward writes into each 32-bit word of its state's stamp (MemoryLayout::stamp)
// after its last kernel: a hash of the fields the layout and the kernels depend on, and of the
// library's version and template hash (a state copied from another build may be laid out
// otherwise); never 0 (a forward clears the stamp before its first kernel, a memory-efficient
// backward before it consumes the state) nor 0xffffffff.
std::uint32_t state_stamp(const MoeProblem& problem);

// What the routing kernel's check phase (templates/routing.cuh, kRoutingCheck) writes over a
// stamp's first word where the state's routing tables hold what no forward writes (a damaged
// copy): state_stamp never returns it.
inline constexpr std::uint32_t kDamagedStamp = 0xffffffffu;

class SavedStates {
 public:
  // Complete, its stamp not yet checked: kAdopted on the caller's word (adopt_saved); kCaptured
  // written by a forward captured into a CUDA graph, whose kernels run when the graph does, if
  // ever, which the host cannot tell.
  enum class State { kComplete, kAdopted, kCaptured, kPartial, kConsumed, kOverwritten };

  // Process-wide: plans share states (Python's backward may run another plan of the problem).
  static SavedStates& instance();

  // cuda::current_context_id() of the plan's context.
  using ContextId = unsigned long long;

  // `bytes`: the state's size (the plan's saved_bytes), what a later write may overlap. Replaces
  // the record at `saved` whatever context made it: after a reset, the new context's state there.
  void record(ContextId context, const void* saved, std::size_t bytes, const MoeProblem& problem, State state);

  // A call is about to write its `written` tensors: every state recorded in bytes they overlap is
  // lost (kOverwritten), except the one at `kept` (a backward's own state, which `use` judges).
  // An exact match is not enough: a forward's out or workspace, or a state of another problem
  // starting inside the buffer, would leave the routing tables garbage under a record that says
  // complete. A lost state's record shrinks to its address alone (0 bytes), and a later write over
  // that address, or a state recorded over it, forgets it; so recorded states never overlap and
  // none lies inside another (each is recorded after its own write), and the scan is a lookup plus
  // the records the write covers, however many there are. Every context's records: one address is
  // one memory in the process.
  void overwrite(const std::vector<TensorRegion>& tensors, const void* kept);

  enum class Use { kRead, kConsume };
  // Throws StateError ("saved: ...") for a buffer never recorded, recorded in another context than
  // `context`, or recorded as partial, consumed, or complete for another problem. A refused use
  // changes nothing. A use refreshes the record; kConsume records it consumed under the same lock,
  // so of two memory-efficient backwards given one buffer at once, one runs and the other is
  // refused.
  void use(ContextId context, const void* saved, const MoeProblem& problem, Use use);

  // The record at `saved`, of `context`, where it is an adopted or captured state whose stamp no
  // backward has checked: which of the two, and when it was recorded, which checked() takes to
  // record that a backward did, and found it this problem's (a state recorded there since is left
  // unchecked). nullopt otherwise.
  struct Unchecked {
    State state;
    std::uint64_t recorded;
  };
  std::optional<Unchecked> unchecked(ContextId context, const void* saved);
  void checked(ContextId context, const void* saved, std::uint64_t recorded);

  // At most this many buffers are remembered; past it the half least recently recorded or used
  // is forgotten (and refused after), so a process whose allocator hands out ever new addresses
  // stays bounded (about 100 bytes a buffer). A state still waiting for its backward would have
  // to sit behind 32768 newer forwards to be forgotten.
  static constexpr std::size_t kCapacity = 65536;

 private:
  struct Entry {
    ContextId context = 0;
    MoeProblem problem;
    std::size_t bytes = 0;
    State state = State::kComplete;
    std::uint64_t order = 0;     // when recorded or last used, for forgetting the oldest
    std::uint64_t recorded = 0;  // when recorded: which unchecked state checked() is told of
  };
  void record_locked(ContextId context, const void* saved, std::size_t bytes, const MoeProblem& problem,
                     State state);

  std::mutex mu_;
  std::map<std::uintptr_t, Entry> entries_;  // by address, so overlaps are a range scan
  std::uint64_t next_order_ = 0;
};

}  // namespace moejit
