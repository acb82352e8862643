#include "cuda/call_graph.hpp"

#include "core/log.hpp"
#include "cuda/driver.hpp"
#include "cuda/handles.hpp"

namespace moejit::cuda {
namespace {

CUDA_KERNEL_NODE_PARAMS node_params(const KernelWork& w) {
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = w.function;
  p.gridDimX = w.grid[0];
  p.gridDimY = w.grid[1];
  p.gridDimZ = w.grid[2];
  p.blockDimX = w.block[0];
  p.blockDimY = w.block[1];
  p.blockDimZ = w.block[2];
  p.sharedMemBytes = w.smem_bytes;
  p.kernelParams = w.args;
  return p;
}

CUDA_MEMSET_NODE_PARAMS memset_params(CUdeviceptr dst, std::uint32_t value, std::size_t words) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = 4;
  p.width = words;
  p.height = 1;
  return p;
}

}  // namespace

CallGraph::~CallGraph() {
  if (graph_ == nullptr && exec_ == nullptr) return;
  // The context's id, asked through its handle, is its own only while it lives (a destroyed one
  // answers an error, a reset primary context another id): its graphs went with it otherwise.
  unsigned long long id = 0;
  if (context_ != nullptr && driver().cuCtxGetId(context_, &id) == CUDA_SUCCESS && id == context_id_) release();
}

void CallGraph::release() noexcept {
  const Driver& d = driver();
  if (exec_ != nullptr) warn_on_failure(d.cuGraphExecDestroy(exec_), "cuGraphExecDestroy");
  if (graph_ != nullptr) warn_on_failure(d.cuGraphDestroy(graph_), "cuGraphDestroy");
  exec_ = nullptr;
  graph_ = nullptr;
  nodes_.clear();
}

void CallGraph::refuse(CUresult r, const char* what) noexcept {
  refused_ = true;
  try {
    log::info("{} refused ({}): this call sequence launches one kernel at a time from now on", what, result_name(r));
  } catch (...) {
  }
}

CallGraph::Call::Call(CallGraph& graph, CUcontext context)
    : g_(graph), building_(graph.exec_ == nullptr) {
  if (!building_) return;
  g_.release();
  const Driver& d = driver();
  CUresult r = d.cuCtxGetId(context, &g_.context_id_);
  if (r == CUDA_SUCCESS) r = d.cuGraphCreate(&g_.graph_, 0);
  if (r != CUDA_SUCCESS) {
    g_.refuse(r, "cuGraphCreate");
    failed_ = true;
    return;
  }
  g_.context_ = context;
}

bool CallGraph::Call::usable(bool memset, const KernelWork* work) {
  if (failed_) return false;
  if (building_) return true;
  const bool same = next_ < g_.nodes_.size() && g_.nodes_[next_].memset == memset &&
                    (memset || (g_.nodes_[next_].function == work->function && g_.nodes_[next_].cluster == work->cluster));
  // Another sequence than the graph's: this call runs on its stream, the next builds it again.
  if (!same) failed_ = true;
  return same;
}

void CallGraph::Call::add(CUgraphNode node, bool memset, const KernelWork* work) {
  g_.nodes_.push_back(Node{node, memset, memset ? nullptr : work->function, memset ? 1u : work->cluster});
}

void CallGraph::Call::kernel(const KernelWork& w) {
  if (!usable(false, &w)) return;
  const Driver& d = driver();
  const CUDA_KERNEL_NODE_PARAMS p = node_params(w);
  CUresult r = CUDA_SUCCESS;
  if (building_) {
    CUgraphNode node = nullptr;
    const CUgraphNode* after = g_.nodes_.empty() ? nullptr : &g_.nodes_.back().node;
    r = d.cuGraphAddKernelNode(&node, g_.graph_, after, after ? 1 : 0, &p);
    if (r == CUDA_SUCCESS && w.cluster > 1) {
      CUkernelNodeAttrValue cluster{};
      cluster.clusterDim = {w.cluster, 1, 1};
      r = d.cuGraphKernelNodeSetAttribute(node, CU_KERNEL_NODE_ATTRIBUTE_CLUSTER_DIMENSION, &cluster);
    }
    if (r == CUDA_SUCCESS) add(node, false, &w);
  } else {
    r = d.cuGraphExecKernelNodeSetParams(g_.exec_, g_.nodes_[next_].node, &p);
  }
  if (r != CUDA_SUCCESS) {
    g_.refuse(r, building_ ? "adding a kernel node" : "setting a kernel node");
    failed_ = true;
  }
  ++next_;
}

void CallGraph::Call::memset32(CUdeviceptr dst, std::uint32_t value, std::size_t words) {
  if (!usable(true, nullptr)) return;
  const Driver& d = driver();
  const CUDA_MEMSET_NODE_PARAMS p = memset_params(dst, value, words);
  CUresult r = CUDA_SUCCESS;
  if (building_) {
    CUgraphNode node = nullptr;
    const CUgraphNode* after = g_.nodes_.empty() ? nullptr : &g_.nodes_.back().node;
    r = d.cuGraphAddMemsetNode(&node, g_.graph_, after, after ? 1 : 0, &p, g_.context_);
    if (r == CUDA_SUCCESS) add(node, true, nullptr);
  } else {
    r = d.cuGraphExecMemsetNodeSetParams(g_.exec_, g_.nodes_[next_].node, &p, g_.context_);
  }
  if (r != CUDA_SUCCESS) {
    g_.refuse(r, building_ ? "adding a memset node" : "setting a memset node");
    failed_ = true;
  }
  ++next_;
}

bool CallGraph::Call::finish(CUstream stream) {
  if (!failed_ && !building_ && next_ != g_.nodes_.size()) failed_ = true;
  if (!failed_ && building_) {
    if (const CUresult r = driver().cuGraphInstantiate(&g_.exec_, g_.graph_, 0); r != CUDA_SUCCESS) {
      g_.refuse(r, "cuGraphInstantiate");
      failed_ = true;
    }
  }
  if (failed_) {
    // A graph part-built, or one whose sequence this call did not follow, is built again (a
    // refused one never is).
    if (building_ || !g_.refused_) g_.release();
    return false;
  }
  MOEJIT_CU(driver().cuGraphLaunch(g_.exec_, stream));
  return true;
}

}  // namespace moejit::cuda
