#include "tuner/tile_config.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <tuple>

#include "core/json_int.hpp"
#include "moejit/error.hpp"

namespace moejit {

const char* arch_tag_name(ArchTag t) noexcept {
  switch (t) {
    case ArchTag::kPortable: return "portable";
    case ArchTag::kHopper: return "hopper";
    case ArchTag::kBlackwellDatacenter: return "blackwell_dc";
  }
  return "unknown";
}

namespace {

ArchTag parse_arch_tag(const std::string& s) {
  if (s == "portable") return ArchTag::kPortable;
  if (s == "hopper") return ArchTag::kHopper;
  if (s == "blackwell_dc") return ArchTag::kBlackwellDatacenter;
  throw InvalidArgument("arch_tag", "unknown arch tag '" + s + "'");
}

}  // namespace

std::string TileConfig::name() const {
  std::string n;
  auto part = [&](const char* prefix, int v) {
    if (v == 0) return;
    if (!n.empty()) n += '_';
    n += fmt::format("{}{}", prefix, v);
  };
  part("bm", block_m);
  part("bn", block_n);
  part("bk", block_k);
  part("s", stages);
  part("w", warps);
  part("g", group_m);
  part("i", items);
  if (cluster > 1) part("c", cluster);
  if (use_tma) n += "_tma";
  if (arch_tag == ArchTag::kHopper) n += warp_specialized ? "_ws" : "_wg";
  if (persistent) n += "_persistent";
  if (arch_tag == ArchTag::kBlackwellDatacenter) n += "_bw";
  return n;
}

bool TileConfig::smaller_than(const TileConfig& o) const {
  auto area = [](const TileConfig& c) {
    return static_cast<long long>(c.block_m ? c.block_m : 1) * (c.block_n ? c.block_n : 1) * (c.block_k ? c.block_k : 1);
  };
  return std::make_tuple(area(*this), threads(), stages, items, name()) <
         std::make_tuple(area(o), o.threads(), o.stages, o.items, o.name());
}

// Every field by name (the structured binding stops compiling when TileConfig gains one, so a
// new field cannot miss its JSON key; from_json reads it with a default for older files).
void to_json(nlohmann::json& j, const TileConfig& c) {
  const auto& [block_m, block_n, block_k, stages, warps, group_m, cluster, items, use_tma, warp_specialized,
               persistent, arch_tag] = c;
  j = nlohmann::json{{"block_m", block_m}, {"block_n", block_n}, {"block_k", block_k},
                     {"stages", stages},   {"warps", warps},     {"group_m", group_m},
                     {"cluster", cluster}, {"items", items},     {"use_tma", use_tma},
                     {"warp_specialized", warp_specialized}, {"persistent", persistent},
                     {"arch_tag", arch_tag_name(arch_tag)}};
}

void from_json(const nlohmann::json& j, TileConfig& c) {
  c.block_m = json_int_or(j, "block_m", 0);
  c.block_n = json_int_or(j, "block_n", 0);
  c.block_k = json_int_or(j, "block_k", 0);
  c.stages = json_int_or(j, "stages", 0);
  c.warps = json_int_or(j, "warps", 0);
  c.group_m = json_int_or(j, "group_m", 0);
  c.cluster = json_int_or(j, "cluster", 1);
  c.items = json_int_or(j, "items", 0);
  c.use_tma = j.value("use_tma", false);
  c.warp_specialized = j.value("warp_specialized", false);
  c.persistent = j.value("persistent", false);  // rows from before the field: one block per tile
  c.arch_tag = parse_arch_tag(j.value("arch_tag", std::string("portable")));
}

}  // namespace moejit
