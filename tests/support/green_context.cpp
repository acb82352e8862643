#include "support/green_context.hpp"

#include "cuda/driver.hpp"
#include "support/driver_symbol.hpp"

namespace moejit::test {
namespace {

template <typename F>
F load(const char* name, std::string& missing) {
  auto f = reinterpret_cast<F>(driver_symbol(name));
  if (f == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
  return f;
}

struct GreenDriver {
  std::string missing;
  decltype(&::cuDeviceGetDevResource) get_resource = load<decltype(get_resource)>("cuDeviceGetDevResource", missing);
  decltype(&::cuDevSmResourceSplitByCount) split = load<decltype(split)>("cuDevSmResourceSplitByCount", missing);
  decltype(&::cuDevResourceGenerateDesc) describe = load<decltype(describe)>("cuDevResourceGenerateDesc", missing);
  decltype(&::cuGreenCtxCreate) create = load<decltype(create)>("cuGreenCtxCreate", missing);
  decltype(&::cuGreenCtxDestroy) destroy = load<decltype(destroy)>("cuGreenCtxDestroy", missing);
  decltype(&::cuCtxFromGreenCtx) as_context = load<decltype(as_context)>("cuCtxFromGreenCtx", missing);
  decltype(&::cuGreenCtxStreamCreate) create_stream = load<decltype(create_stream)>("cuGreenCtxStreamCreate", missing);
};

const GreenDriver& green_driver() {
  static const GreenDriver d;
  return d;
}

}  // namespace

std::unique_ptr<GreenContext> GreenContext::create(int device, unsigned sms, std::string* why) {
  const GreenDriver& g = green_driver();
  if (!g.missing.empty()) {
    *why = "the CUDA driver has no green contexts (it lacks " + g.missing + ")";
    return nullptr;
  }
  const cuda::Driver& d = cuda::driver();
  CUdevice dev = 0;
  MOEJIT_CU(d.cuDeviceGet(&dev, device));
  CUdevResource all{}, part{};
  MOEJIT_CU(g.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  unsigned groups = 1;
  MOEJIT_CU(g.split(&part, &groups, &all, nullptr, 0, sms));
  CUdevResourceDesc desc = nullptr;
  MOEJIT_CU(g.describe(&desc, &part, 1));
  std::unique_ptr<GreenContext> c(new GreenContext());
  MOEJIT_CU(g.create(&c->green_, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  MOEJIT_CU(g.as_context(&c->context_, c->green_));
  MOEJIT_CU(g.create_stream(&c->stream_, c->green_, CU_STREAM_NON_BLOCKING, 0));
  c->sm_count_ = part.sm.smCount;
  return c;
}

GreenContext::~GreenContext() {
  if (stream_ != nullptr) cuda::driver().cuStreamDestroy(stream_);
  if (green_ != nullptr) green_driver().destroy(green_);
}

}  // namespace moejit::test
