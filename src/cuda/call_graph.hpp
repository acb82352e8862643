// One call's work kept as a CUDA graph from call to call, so that an eager forward() or backward()
// costs the host one graph launch instead of one launch per kernel (about 4 us each on the H200
// machine, while a graph of 8 kernels launches in about 2 us and has its nodes' parameters set in
// about 0.6 us each: bench/launch_cost.cu, docs/performance-log.md session 54).
//
// The first call adds its items as a chain of nodes (each after the one before, as on a stream)
// and instantiates the graph; each later call sets every node's parameters in the instantiated
// graph and launches it once. A call whose items differ from the graph's (another function,
// cluster or kind at some position, or another count) runs on its stream instead, and the graph is
// built again at the next call. Where the driver refuses to add or update a node (a memset into
// memory of no context, say), the call runs on its stream too, and so does every later call of this
// graph. One launch of a graph is ordered after the previous one of the same graph, on whatever
// stream: its user keeps one graph per stream.
#pragma once

#include <cuda.h>

#include <vector>

#include "cuda/work_queue.hpp"

namespace moejit::cuda {

class CallGraph {
 public:
  CallGraph() = default;
  // Releases the graph while the context its nodes run in lives (a graph of a context since
  // destroyed or reset went with it). Never throws.
  ~CallGraph();
  CallGraph(const CallGraph&) = delete;
  CallGraph& operator=(const CallGraph&) = delete;

  // Whether the driver refused one of this graph's nodes: every call runs on its stream from then on.
  bool refused() const { return refused_; }

  // Takes one call's items in order; finish() then launches them. `context` is the current
  // context, the one the nodes' functions and memory belong to (kept by the graph when built).
  class Call final : public WorkQueue {
   public:
    Call(CallGraph& graph, CUcontext context);
    void kernel(const KernelWork& work) override;
    void memset32(CUdeviceptr dst, std::uint32_t value, std::size_t words) override;
    // Launches the graph on `stream` and returns true; false where this call's items did not
    // make it (nothing was enqueued: the caller enqueues them on the stream). Throws CudaError
    // where the launch fails.
    bool finish(CUstream stream);

   private:
    bool usable(bool memset, const KernelWork* work);
    void add(CUgraphNode node, bool memset, const KernelWork* work);
    CallGraph& g_;
    std::size_t next_ = 0;
    bool building_;
    bool failed_ = false;
  };

 private:
  struct Node {
    CUgraphNode node = nullptr;
    bool memset = false;
    CUfunction function = nullptr;
    unsigned cluster = 1;
  };
  void release() noexcept;
  // Marks the graph refused, saying why (info: the calls still run, one launch at a time).
  void refuse(CUresult r, const char* what) noexcept;

  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  CUcontext context_ = nullptr;
  unsigned long long context_id_ = 0;
  std::vector<Node> nodes_;
  bool refused_ = false;
};

}  // namespace moejit::cuda
