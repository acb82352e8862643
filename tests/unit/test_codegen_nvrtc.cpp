// Codegen and NVRTC: every routing config compiles to a cubin for sm_90a and sm_80 on a
// machine without a GPU, with ptxas figures parsed from the log.
#include <catch2/catch.hpp>

#include "jit/codegen.hpp"
#include "jit/embedded_templates.hpp"
#include "jit/nvrtc.hpp"
#include "jit/ptxas_info.hpp"
#include "jit/template_hash.hpp"
#include "support/process.hpp"
#include "support/tile_configs.hpp"
#include "moejit/error.hpp"
#include "tuner/config_space.hpp"
#include "tuner/prune.hpp"
#include "tuner/role_traits.hpp"
#include "core/parallel.hpp"
#include "cuda/device.hpp"

#include <fstream>
#include <mutex>
#include <string>

using namespace moejit;
using namespace moejit::jit;

TEST_CASE("templates are embedded with a stable hash", "[codegen]") {
  const auto& files = embedded_template_files();
  REQUIRE(files.size() >= 4);
  bool has_routing = false;
  for (const auto& f : files) has_routing |= std::string(f.name) == "routing.cuh";
  CHECK(has_routing);
  CHECK(template_hash().size() == 16);
}

TEST_CASE("generated unit is tiny and names every instantiation", "[codegen]") {
  TileConfig c;
  c.warps = 8;
  c.items = 16;
  GeneratedUnit u = generate_unit({Role::kRouting, c, DType::kBF16, "sm_90a"});
  CHECK(u.file_name == "routing.w8_i16.cu");
  // count, place and scatter, the chunk table's scan, a saved state's check
  REQUIRE(u.name_expressions.size() == 4);
  CHECK(u.name_expressions[0] == "moejit::routing_kernel<0, 256, 16>");
  CHECK(u.name_expressions[1] == "moejit::routing_kernel<1, 256, 16>");
  CHECK(u.name_expressions[2] == "moejit::routing_kernel<2, 256, 16>");
  CHECK(u.name_expressions[3] == "moejit::routing_kernel<3, 256, 16>");
  CHECK(u.source.find("#include \"routing.cuh\"") != std::string::npos);
  CHECK(u.source.size() < 512);
  c.items = 0;
  CHECK_THROWS_AS(generate_unit({Role::kRouting, c, DType::kBF16, "sm_90a"}), InvalidArgument);
  // gather_sum's module: the sum, then the scatter of token rows into sorted order.
  TileConfig g;
  g.warps = 4;
  u = generate_unit({Role::kGatherSum, g, DType::kBF16, "sm_90a"});
  REQUIRE(u.name_expressions.size() == 2);
  CHECK(u.name_expressions[0] == "moejit::gather_sum_kernel<moejit::bf16, 128, 8, false>");
  CHECK(u.name_expressions[1] == "moejit::gather_sum_kernel<moejit::bf16, 128, 8, true>");
  // GEMMs: the tile, the pipeline, TMA and the cluster size, the last template arguments.
  TileConfig pair = test::hopper_gemm(128, 256, 64, 4, 8, true);
  pair.use_tma = true;
  pair.cluster = 2;
  u = generate_unit({Role::kFwdDown, pair, DType::kBF16, "sm_90a"});
  CHECK(u.file_name == "fwd_down.bm128_bn256_bk64_s4_w8_g8_c2_tma_ws.cu");
  REQUIRE(u.name_expressions.size() == 1);
  CHECK(u.name_expressions[0] ==
        "moejit::fwd_down_kernel<moejit::bf16, 128, 256, 64, 4, 8, 2, 8, true, true, true, true, 2, false>");
  pair.persistent = true;
  u = generate_unit({Role::kFwdDown, pair, DType::kBF16, "sm_90a"});
  CHECK(u.file_name == "fwd_down.bm128_bn256_bk64_s4_w8_g8_c2_tma_ws_persistent.cu");
  CHECK(u.name_expressions.at(0) ==
        "moejit::fwd_down_kernel<moejit::bf16, 128, 256, 64, 4, 8, 2, 8, true, true, true, true, 2, true>");
  TileConfig one_group = test::hopper_gemm(128, 128, 64, 4, 4, true);  // two blocks per SM: no persistent grid
  one_group.use_tma = true;
  one_group.persistent = true;
  CHECK_THROWS_AS(generate_unit({Role::kFwdDown, one_group, DType::kBF16, "sm_90a"}), InvalidArgument);
  pair.persistent = false;
  CHECK_THROWS_AS(generate_unit({Role::kBwdDw1, pair, DType::kBF16, "sm_90a"}), InvalidArgument);
  pair.use_tma = false;
  CHECK_THROWS_AS(generate_unit({Role::kFwdDown, pair, DType::kBF16, "sm_90a"}), InvalidArgument);
}

TEST_CASE("every routing config compiles for sm_90a and sm_80", "[codegen][nvrtc]") {
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    for (const TileConfig& c : config_space(Role::kRouting, MoeShape{8192, 64, 2048, 768, 4, DType::kBF16})) {
      GeneratedUnit u = generate_unit({Role::kRouting, c, DType::kBF16, arch});
      NvrtcOutput out = nvrtc_compile(u, nvrtc_options(arch));
      INFO(arch << " " << c.name() << "\n" << out.log);
      CHECK(out.cubin.size() > 1000);
      CHECK(out.cubin.compare(0, 4, "\x7f" "ELF") == 0);
      REQUIRE(out.lowered_names.size() == 4);
      REQUIRE(out.resources.size() == 4);
      for (const auto& r : out.resources) {
        CHECK(r.registers > 0);
        CHECK(r.spill_store_bytes == 0);
      }
    }
  }
}

TEST_CASE("a compile error carries the NVRTC log and the source", "[nvrtc]") {
  GeneratedUnit bad{"bad.cu", "#include \"routing.cuh\"\n__global__ void k() { undefined_symbol(); }\n", {}};
  try {
    nvrtc_compile(bad, nvrtc_options("sm_90a"));
    FAIL("expected CompileError");
  } catch (const CompileError& e) {
    CHECK_THAT(e.log(), Catch::Contains("undefined_symbol"));
    CHECK(e.source() == bad.source);
    CHECK(e.code() == ErrorCode::kCompile);
  }
}

// The NVRTC part of every kernel key names the loaded library's build, not the path that loaded
// it: checked against readelf's reading of the mapped file's build-id note.
TEST_CASE("the NVRTC build id is the loaded library's GNU build id", "[nvrtc]") {
  const std::string& id = nvrtc_build_id();
  REQUIRE(id.rfind(nvrtc_version() + " ", 0) == 0);
  CHECK(id.find("libnvrtc") == std::string::npos);
  CHECK(id.find('/') == std::string::npos);
  std::ifstream maps("/proc/self/maps");
  std::string line, path;
  while (path.empty() && std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash != std::string::npos && line.find("libnvrtc.so", slash) != std::string::npos) path = line.substr(slash);
  }
  REQUIRE_FALSE(path.empty());
  const test::ProcessResult notes = test::run_command("readelf -n '" + path + "'");
  if (notes.exit_code != 0) {
    WARN("readelf unavailable: the id's form alone is checked (" << notes.output << ")");
    return;
  }
  const auto at = notes.output.find("Build ID: ");
  REQUIRE(at != std::string::npos);  // NVIDIA's libraries carry one; the fallback is the file size
  const std::string expected = notes.output.substr(at + 10, notes.output.find('\n', at) - at - 10);
  CHECK(id == nvrtc_version() + " " + expected);
}

TEST_CASE("ptxas -v figures are parsed per entry function", "[nvrtc]") {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function '_Z1kILi1EEvv' for 'sm_90a'\n"
      "ptxas info    : Function properties for _Z1kILi1EEvv\n"
      "ptxas         .     24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem\n"
      "ptxas info    : Compiling entry function '_Z1kILi2EEvv' for 'sm_90a'\n"
      "ptxas info    : Function properties for _Z1kILi2EEvv\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 0 barriers, 360 bytes cmem[0]\n";
  auto r = parse_ptxas_info(log);
  REQUIRE(r.size() == 2);
  CHECK(r[0].function == "_Z1kILi1EEvv");
  CHECK(r[0].registers == 168);
  CHECK(r[0].stack_bytes == 24);
  CHECK(r[0].spill_store_bytes == 8);
  CHECK(r[0].spill_load_bytes == 12);
  CHECK(r[0].static_smem_bytes == 1024);
  CHECK(r[1].registers == 40);
  CHECK(r[1].static_smem_bytes == 0);
  CHECK(parse_performance_losses(log).empty());
  const std::string lossy =
      log +
      "ptxas info    : (C7507) Potential Performance Loss: 'setmaxnreg' ignored to maintain minimum register "
      "requirements.\n"
      "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
      "wgmma pipeline crossing function boundary at a function call in the function '_Z1fv'\n";
  const auto losses = parse_performance_losses(lossy);
  REQUIRE(losses.size() == 2);
  CHECK_THAT(losses[0], Catch::StartsWith("(C7507) 'setmaxnreg' ignored"));
  CHECK_THAT(losses[1], Catch::StartsWith("(C7510) wgmma.mma_async instructions are serialized"));
}

TEST_CASE(
    "the default config of every role compiles for sm_90a and sm_80, aligned or not, 16- to 128-row token tiles; "
    "persistent tiles and pairs too; no spills, no local memory",
    "[codegen][nvrtc]") {
  const MoeShape shape{1024, 128, 2048, 768, 8, DType::kBF16};
  const MoeShape unaligned{1024, 128, 2052, 772, 8, DType::kFP16};  // rows not 16-byte multiples
  // 8 and 16 pairs per expert: the token GEMMs' 16- and 32-row tiles and their measured defaults.
  const MoeShape small_tiles[] = {{128, 128, 2048, 768, 8, DType::kBF16}, {256, 128, 2048, 768, 8, DType::kBF16}};
  std::vector<KernelSpec> specs;
  int persistent_specs = 0;
  for (const std::string arch : {"sm_90a", "sm_80"}) {
    const cuda::DeviceInfo device = cuda::fabricated::for_arch(arch);
    for (Role r : kAllRoles) {
      const TileConfig c = default_config(r, shape, device);
      specs.push_back({r, c, DType::kBF16, arch, true, false});
      if (role_kind(r) == RoleKind::kTokenGemm) {
        for (const MoeShape& s : small_tiles) specs.push_back({r, default_config(r, s, device), DType::kBF16, arch, true, false});
      }
      specs.push_back({r, default_config(r, unaligned, device), DType::kFP16, arch, false, false});
      if (arch == "sm_90a") {
        if (r == Role::kBwdDw2) specs.push_back({r, c, DType::kBF16, arch, true, true});
        // The same tile on the warp-specialized pipeline with TMA copies, where the role has them.
        TileConfig tma = c;
        tma.warp_specialized = tma.use_tma = true;
        if (!c.use_tma && !prune_reason(r, tma, shape, device)) {
          specs.push_back({r, tma, DType::kBF16, arch, true, false});
          if (r == Role::kBwdDw2) specs.push_back({r, tma, DType::kBF16, arch, true, true});
        }
        // A two-warpgroup TMA tile of every GEMM role, one tile per block and persistent.
        TileConfig two = test::hopper_gemm(128, 128, 64, 4, 8, true);
        two.use_tma = true;
        const bool gemm = role_kind(r) == RoleKind::kTokenGemm || role_kind(r) == RoleKind::kExpertGemm;
        for (bool persistent : {false, true}) {
          if (!gemm) break;
          two.persistent = persistent;
          if (prune_reason(r, two, shape, device)) continue;
          persistent_specs += persistent;
          specs.push_back({r, two, DType::kBF16, arch, true, false});
          if (r == Role::kBwdDw2) specs.push_back({r, two, DType::kBF16, arch, true, true});
        }
      }
    }
  }
  CHECK(persistent_specs == 6);  // every GEMM role
  const cuda::DeviceInfo hopper = cuda::fabricated::for_arch("sm_90a");
  // bwd_down's 128 x 256 persistent tile, the one config with an epilogue warpgroup (kGroup).
  TileConfig group = test::hopper_gemm(128, 256, 64, 3, 8, true);
  group.use_tma = group.persistent = true;
  REQUIRE_FALSE(prune_reason(Role::kBwdDown, group, shape, hopper));
  specs.push_back({Role::kBwdDown, group, DType::kBF16, "sm_90a", true, false});
  // A persistent cluster pair of every token GEMM role: each block picks its tile of the pair's
  // two by its rank at run time.
  TileConfig pair = test::hopper_gemm(128, 128, 64, 4, 8, true);
  pair.use_tma = pair.persistent = true;
  pair.cluster = 2;
  int pair_specs = 0;
  for (Role r : kAllRoles) {
    if (role_kind(r) != RoleKind::kTokenGemm || prune_reason(r, pair, shape, hopper)) continue;
    specs.push_back({r, pair, DType::kBF16, "sm_90a", true, false});
    ++pair_specs;
  }
  CHECK(pair_specs == 4);
  std::vector<std::string> failures;
  std::mutex mu;
  parallel_for(specs.size(), 2, [&](std::size_t i) {
    try {
      NvrtcOutput out = nvrtc_compile(generate_unit(specs[i]), nvrtc_options(specs[i].arch));
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& res : out.resources) {
        if (res.spill_store_bytes > 0) {
          failures.push_back(specs[i].readable_name() + " spills " + std::to_string(res.spill_store_bytes) + " B");
        }
        // An array in local memory, which ptxas does not count as a spill (session 40: 64 bytes
        // of bwd_down's epilogue sums cost the role 6 % at T=32768).
        if (res.stack_bytes > 0) {
          failures.push_back(specs[i].readable_name() + " keeps " + std::to_string(res.stack_bytes) +
                             " B a thread in local memory");
        }
      }
      // A serialized wgmma pipeline or an ignored setmaxnreg (e.g. a call in the kernel, or a
      // register held across the multistage loop) costs a Hopper config what it is for.
      for (const std::string& loss : out.performance_losses) failures.push_back(specs[i].readable_name() + ": " + loss);
      // The kernel cache prints a log with warnings to every user who compiles the kernel.
      if (out.log.find("warning") != std::string::npos) failures.push_back(specs[i].readable_name() + ": " + out.log);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back(specs[i].readable_name() + ": " + e.what());
    }
  });
  for (const auto& f : failures) UNSCOPED_INFO(f);
  CHECK(failures.empty());
}
