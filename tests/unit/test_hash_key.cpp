// Hashing and kernel-key stability: the same inputs always give the same key, and every input
// that changes the cubin changes the key.
#include <catch2/catch.hpp>

#include "core/hash.hpp"
#include "jit/codegen.hpp"
#include "jit/embedded_templates.hpp"
#include "jit/kernel_key.hpp"
#include "jit/template_hash.hpp"

using namespace moejit;

TEST_CASE("FNV-1a 64 matches the published test vectors", "[hash]") {
  CHECK(Hasher().add("").hex() == "cbf29ce484222325");
  CHECK(Hasher().add("a").hex() == "af63dc4c8601ec8c");
  CHECK(Hasher().add("foobar").hex() == "85944171f73967e8");
}

TEST_CASE("Hasher fields are length-delimited", "[hash]") {
  CHECK(Hasher().field("ab").field("c").value() != Hasher().field("a").field("bc").value());
}

TEST_CASE("the template hash covers code, not comments or blank lines", "[hash]") {
  using jit::template_code;
  const std::string code = "int a = 1;\nint b = a;\n";
  CHECK(template_code("int a = 1;  // why a is 1\n\n// a note\nint b = a;\t\n") == code);
  CHECK(template_code("int a = 1; /* a block\n   over lines */\nint b = a;") == code);
  CHECK(template_code("int a = 1;  // reworded\nint b = a;  // and here\n") == code);
  CHECK(template_code("int a = 2;\nint b = a;\n") != code);
  // Literals stay whole: what looks like a comment inside one is code.
  CHECK(template_code("s = \"a//b\";  // c\n") == "s = \"a//b\";\n");
  CHECK(template_code("s = \"q\\\"//\";\n") == "s = \"q\\\"//\";\n");
  CHECK(template_code("c = '\"'; // \"x\"\nd = '/';\n") == "c = '\"';\nd = '/';\n");
  CHECK(template_code("int/* x */a;\n") == "int a;\n");  // the tokens stay apart
  CHECK(template_code("").empty());
  // Every embedded template reduces to code, and the hash is a 16-digit hex string.
  for (const jit::TemplateFile& f : jit::embedded_template_files()) {
    INFO(f.name);
    CHECK_FALSE(template_code(f.content).empty());
    CHECK(template_code(f.content).find("//") == std::string::npos);
  }
  CHECK(jit::template_hash().size() == 16);
}

namespace {

jit::KernelSpec routing_spec() {
  TileConfig c;
  c.warps = 8;
  c.items = 16;
  return {Role::kRouting, c, DType::kBF16, "sm_90a"};
}

jit::KernelKey key_of(const jit::KernelSpec& s, const std::string& nvrtc = "13.0", const std::string& tpl = "t1",
                      std::vector<std::string> opts = {"-arch=sm_90a"}) {
  return jit::make_kernel_key(s, jit::generate_unit(s), opts, nvrtc, tpl);
}

}  // namespace

TEST_CASE("kernel key is readable and deterministic", "[key]") {
  auto k = key_of(routing_spec());
  CHECK(k.readable == "routing.w8_i16.sm_90a");
  CHECK(k.hash.size() == 16);
  CHECK(k == key_of(routing_spec()));
  CHECK(k.stem() == "routing.w8_i16.sm_90a." + k.hash);
}

TEST_CASE("kernel key changes with every input that changes the cubin", "[key]") {
  const auto base = key_of(routing_spec());
  auto spec = routing_spec();
  spec.config.items = 32;
  CHECK(key_of(spec).hash != base.hash);
  spec = routing_spec();
  spec.arch = "sm_80";
  CHECK(key_of(spec, "13.0", "t1").hash != base.hash);
  CHECK(key_of(routing_spec(), "13.1").hash != base.hash);
  CHECK(key_of(routing_spec(), "13.0", "t2").hash != base.hash);
  CHECK(key_of(routing_spec(), "13.0", "t1", {"-arch=sm_90a", "-lineinfo"}).hash != base.hash);
  spec = routing_spec();
  spec.config.arch_tag = ArchTag::kHopper;
  CHECK(key_of(spec).hash != base.hash);
}
