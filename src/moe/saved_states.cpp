#include "moe/saved_states.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "core/hash.hpp"
#include "jit/template_hash.hpp"
#include "moejit/version.hpp"

namespace moejit {
namespace {

// The fields the saved layout depends on (memory_layout).
bool same_problem(const MoeProblem& a, const MoeProblem& b) {
  return a.tokens == b.tokens && a.experts == b.experts && a.hidden == b.hidden &&
         a.intermediate == b.intermediate && a.topk == b.topk && a.dtype == b.dtype && a.mode == b.mode;
}

std::string describe(const MoeProblem& p) {
  return fmt::format("T={}, E={}, H={}, I={}, K={}, {}, {}", p.tokens, p.experts, p.hidden, p.intermediate, p.topk,
                     dtype_name(p.dtype), mode_name(p.mode));
}

}  // namespace

std::uint32_t state_stamp(const MoeProblem& p) {
  const std::string fields =
      fmt::format("moejit saved state {} {} {} {} {} {} {} {} {}", kLibraryVersion, jit::template_hash(), p.tokens,
                  p.experts, p.hidden, p.intermediate, p.topk, dtype_name(p.dtype), mode_name(p.mode));
  const std::uint64_t h = Hasher().add(fields).value();
  const auto folded = static_cast<std::uint32_t>(h ^ (h >> 32));
  return folded == 0 || folded == kDamagedStamp ? 1u : folded;
}

SavedStates& SavedStates::instance() {
  // Never destroyed, as the kernel cache: a thread still in forward() or backward() when the
  // process exits (a Python daemon thread, say) must not find the record gone.
  static SavedStates* states = new SavedStates;
  return *states;
}

void SavedStates::record(ContextId context, const void* saved, std::size_t bytes, const MoeProblem& problem,
                         State state) {
  std::lock_guard lock(mu_);
  record_locked(context, saved, bytes, problem, state);
}

void SavedStates::record_locked(ContextId context, const void* saved, std::size_t bytes, const MoeProblem& problem,
                                State state) {
  const auto at = reinterpret_cast<std::uintptr_t>(saved);
  // The written-over records inside the new state (overwrite() keeps their address) go: one left
  // there would hide this state from a later write's look back.
  entries_.erase(entries_.upper_bound(at), entries_.lower_bound(at + bytes));
  const std::uint64_t now = next_order_++;
  entries_[at] = Entry{context, problem, bytes, state, now, now};
  if (entries_.size() <= kCapacity) return;
  std::vector<std::uint64_t> orders;
  orders.reserve(entries_.size());
  for (const auto& [address, entry] : entries_) orders.push_back(entry.order);
  const auto middle = orders.begin() + static_cast<std::ptrdiff_t>(orders.size() / 2);
  std::nth_element(orders.begin(), middle, orders.end());
  std::erase_if(entries_, [&](const auto& item) { return item.second.order < *middle; });
}

void SavedStates::overwrite(const std::vector<TensorRegion>& tensors, const void* kept) {
  std::lock_guard lock(mu_);
  const auto kept_at = reinterpret_cast<std::uintptr_t>(kept);
  for (const TensorRegion& t : tensors) {
    if (!t.written || t.bytes == 0) continue;
    const auto begin = reinterpret_cast<std::uintptr_t>(t.begin);
    const std::uintptr_t end = begin + t.bytes;  // validate_* checked that it does not wrap
    auto it = entries_.lower_bound(begin);
    // Of the states starting before the write, only the last can reach into it: none overlap.
    if (it != entries_.begin() && std::prev(it)->first + std::prev(it)->second.bytes > begin) --it;
    while (it != entries_.end() && it->first < end) {
      if (it->first == kept_at) {
        ++it;
      } else if (it->second.state == State::kOverwritten) {
        it = entries_.erase(it);
      } else {
        it->second.state = State::kOverwritten;
        it->second.bytes = 0;
        ++it;
      }
    }
  }
}

void SavedStates::use(ContextId context, const void* saved, const MoeProblem& problem, Use use) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(reinterpret_cast<std::uintptr_t>(saved));
  if (it == entries_.end()) {
    throw StateError(
        "saved: no forward() of this process wrote a state at this address; run forward() into it first, or "
        "declare a state copied here with adopt_saved()");
  }
  Entry& e = it->second;
  // Before the state: a record of another context says nothing of this context's memory there,
  // whatever state it holds.
  if (e.context != context) {
    throw StateError(
        "saved: it was written in another CUDA context than this plan's (one since reset or destroyed, whose "
        "address a new allocation took, say); run forward() again first");
  }
  std::string why;
  switch (e.state) {
    case State::kPartial:
      why = "a forward() into it stopped part-way";
      break;
    case State::kConsumed:
      why = "a memory-efficient backward() already consumed it";
      break;
    case State::kOverwritten:
      why = "a later call of this process wrote over part of it (its out, workspace, gradients or saved state)";
      break;
    case State::kComplete:
    case State::kAdopted:
    case State::kCaptured:
      if (!same_problem(e.problem, problem)) {
        why = fmt::format("it holds the state of another problem's forward() ({})", describe(e.problem));
      }
      break;
  }
  if (!why.empty()) throw StateError(fmt::format("saved: {}; run forward() again first", why));
  e.order = next_order_++;
  if (use == Use::kConsume) e.state = State::kConsumed;
}

namespace {

bool is_unchecked(SavedStates::State s) { return s == SavedStates::State::kAdopted || s == SavedStates::State::kCaptured; }

}  // namespace

std::optional<SavedStates::Unchecked> SavedStates::unchecked(ContextId context, const void* saved) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(reinterpret_cast<std::uintptr_t>(saved));
  if (it == entries_.end() || it->second.context != context || !is_unchecked(it->second.state)) return std::nullopt;
  return Unchecked{it->second.state, it->second.recorded};
}

void SavedStates::checked(ContextId context, const void* saved, std::uint64_t recorded) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(reinterpret_cast<std::uintptr_t>(saved));
  if (it != entries_.end() && it->second.context == context && is_unchecked(it->second.state) &&
      it->second.recorded == recorded) {
    it->second.state = State::kComplete;
  }
}

}  // namespace moejit
