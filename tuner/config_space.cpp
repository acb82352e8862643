#include "tuner/config_space.hpp"

#include <fmt/format.h>

#include "moejit/error.hpp"

namespace moejit {

std::vector<TileConfig> config_space(Role role) {
  std::vector<TileConfig> out;
  switch (role) {
    case Role::kRouting:
      for (int warps : {4, 8, 16, 32}) {
        for (int items : {4, 8, 16, 32}) {
          TileConfig c;
          c.warps = warps;
          c.items = items;
          out.push_back(c);
        }
      }
      return out;
    default:
      return out;
  }
}

TileConfig default_config(Role role, const MoeShape&, const cuda::DeviceInfo&) {
  switch (role) {
    case Role::kRouting: {
      TileConfig c;
      c.warps = 8;
      c.items = 4;
      return c;
    }
    default:
      throw UnsupportedError(fmt::format("role {} has no default config yet", role_name(role)));
  }
}

}  // namespace moejit
