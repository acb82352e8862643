#include "core/hash.hpp"
#include "jit/embedded_templates.hpp"

namespace moejit::jit {

const std::string& template_hash() {
  static const std::string hash = [] {
    Hasher h;
    for (const TemplateFile& f : embedded_template_files()) h.field(f.name).field(f.content);
    return h.hex();
  }();
  return hash;
}

}  // namespace moejit::jit
