#include "jit/disk_cache.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/fs.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "jit/nvrtc.hpp"
#include "jit/template_hash.hpp"
#include "moejit/error.hpp"
#include "moejit/version.hpp"

namespace moejit::jit {
namespace {

// Layout: magic[8] | u64 meta_len | u64 cubin_len | u64 checksum(meta + cubin) | meta | cubin
constexpr char kMagic[8] = {'M', 'O', 'E', 'J', 'I', 'T', 'K', '1'};
constexpr std::size_t kHeader = 8 + 3 * sizeof(std::uint64_t);
// Far above any cubin (a few MiB at most): a bigger file is not this cache's and is not read.
constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{256} << 20;
// A hit marks its file as in use at most this often, so loads do not write to the disk each time.
constexpr std::chrono::hours kRefreshAge{24};

void put_u64(std::string& s, std::uint64_t v) { s.append(reinterpret_cast<const char*>(&v), sizeof v); }

std::uint64_t get_u64(const std::string& s, std::size_t at) {
  std::uint64_t v;
  std::memcpy(&v, s.data() + at, sizeof v);
  return v;
}

StoreBackoff& store_backoff() {
  // Never destroyed, as the kernel cache: a thread still compiling while the process exits stores.
  static StoreBackoff* backoff = new StoreBackoff;
  return *backoff;
}

bool is_hex_digits(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

constexpr std::size_t kHashDigits = 16;

// Calls fn(path, name) for each build's subfolder of `root`: named as one, a real folder, not a
// symbolic link (another user's link in a shared folder must not lead a sweep elsewhere). Errors
// reading `root` are left to the callers, which read it for its own files first.
template <typename Fn>
void for_each_build_folder(const std::filesystem::path& root, Fn fn) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (DiskCache::is_build_folder_name(name) && !it->is_symlink(type_ec) && it->is_directory(type_ec)) {
      fn(it->path(), name);
    }
  }
}

}  // namespace

std::string DiskCache::encode(const CompiledKernel& k) {
  nlohmann::json meta = {{"readable", k.key.readable},
                         {"hash", k.key.hash},
                         {"name_expressions", k.name_expressions},
                         {"lowered_names", k.lowered_names},
                         {"resources", k.resources},
                         {"performance_losses", k.performance_losses},
                         {"compile_ms", k.compile_ms}};
  std::string m = meta.dump();
  std::string out(kMagic, sizeof kMagic);
  put_u64(out, m.size());
  put_u64(out, k.cubin.size());
  put_u64(out, Hasher().add(m).add(k.cubin).value());
  out += m;
  out += k.cubin;
  return out;
}

std::optional<CompiledKernel> DiskCache::decode(const std::string& bytes, const KernelKey& expected) {
  if (bytes.size() < kHeader || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return std::nullopt;
  const std::uint64_t meta_len = get_u64(bytes, 8), cubin_len = get_u64(bytes, 16), sum = get_u64(bytes, 24);
  if (meta_len > bytes.size() || cubin_len > bytes.size() || kHeader + meta_len + cubin_len != bytes.size()) {
    return std::nullopt;
  }
  std::string_view meta(bytes.data() + kHeader, meta_len), cubin(bytes.data() + kHeader + meta_len, cubin_len);
  if (Hasher().add(meta).add(cubin).value() != sum) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(meta);
    CompiledKernel k;
    k.key = {j.at("readable").get<std::string>(), j.at("hash").get<std::string>()};
    if (!(k.key == expected)) return std::nullopt;
    k.name_expressions = j.at("name_expressions").get<std::vector<std::string>>();
    k.lowered_names = j.at("lowered_names").get<std::vector<std::string>>();
    k.resources = j.at("resources").get<std::vector<KernelResources>>();
    k.performance_losses = j.value("performance_losses", std::vector<std::string>{});
    k.compile_ms = j.at("compile_ms").get<double>();
    if (k.lowered_names.size() != k.name_expressions.size() || cubin.empty()) return std::nullopt;
    k.cubin.assign(cubin);
    return k;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

DiskLookup DiskCache::load(const KernelKey& key, CompiledKernel& out) const {
  const auto path = path_of(key);
  auto bytes = fs::read_all(path, kMaxFileBytes);
  if (!bytes) return DiskLookup::kMiss;
  auto k = decode(*bytes, key);
  if (!k) {
    // Left in place: store() renames the rebuilt kernel over it, whereas removing it here could
    // remove the good file another process has just stored after seeing the same corruption.
    log::warn("kernel cache file {} is corrupt or truncated; recompiling over it", path.string());
    return DiskLookup::kCorrupt;
  }
  out = std::move(*k);
  fs::refresh_write_time(path, kRefreshAge);
  return DiskLookup::kHit;
}

DiskCache DiskCache::of_this_build(std::filesystem::path root) {
  // What changes every kernel besides its spec: NVRTC, its options (the arch aside) and, for
  // changes of code generation, the library's version.
  // Never destroyed, as the kernel cache: a thread starting a build while the process exits reads it.
  static const auto* build = new std::string([] {
    std::string rest = nvrtc_build_id() + "\n" + kLibraryVersion;
    for (const std::string& option : nvrtc_options("")) rest += "\n" + option;
    return build_folder_name(template_hash(), rest);
  }());
  return DiskCache(std::move(root), *build);
}

std::size_t DiskCache::remove_other_builds(std::chrono::seconds unused_for,
                                          std::vector<std::string>* errors) const noexcept {
  // The flat layout before build subfolders: every file there is another build's.
  fs::remove_stale_temp_files(root_, kDeadWriterAge);
  std::size_t removed = fs::remove_old_files(root_, unused_for, is_cache_file_name, errors);
  // Best effort, as remove_old_files: host memory running out ends the sweep there.
  try {
    for_each_build_folder(root_, [&](const std::filesystem::path& folder, const std::string& name) {
      fs::remove_stale_temp_files(folder, kDeadWriterAge);
      if (name == build_) return;
      removed += fs::remove_old_files(folder, unused_for, is_cache_file_name, errors);
      // Removes a folder only once it is empty: files of other names (or in use) keep it.
      std::error_code remove_ec;
      std::filesystem::remove(folder, remove_ec);
      if (errors != nullptr && remove_ec && remove_ec != std::errc::directory_not_empty &&
          remove_ec != std::errc::file_exists && remove_ec != std::errc::no_such_file_or_directory) {
        errors->push_back(fmt::format("cannot remove {}: {}", folder.string(), remove_ec.message()));
      }
    });
  } catch (...) {
  }
  return removed;
}

std::vector<DiskCache::BuildFiles> DiskCache::builds(std::vector<std::string>* errors) const {
  std::map<std::string, BuildFiles> found;
  // A folder or file removed meanwhile (another process's sweep) is no error.
  const auto report = [&](const std::filesystem::path& path, std::error_code ec) {
    if (errors != nullptr && ec != std::errc::no_such_file_or_directory) {
      errors->push_back(fmt::format("cannot read {}: {}", path.string(), ec.message()));
    }
  };
  const auto count = [&](const std::filesystem::path& dir, const std::string& build) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code file_ec;
      if (!is_cache_file_name(it->path().filename().string()) || !it->is_regular_file(file_ec) ||
          it->is_symlink(file_ec)) {
        continue;
      }
      const auto bytes = it->file_size(file_ec);
      const auto written = file_ec ? std::filesystem::file_time_type{} : it->last_write_time(file_ec);
      if (file_ec) {
        report(it->path(), file_ec);
        continue;
      }
      BuildFiles& b = found[build];
      b.build = build;
      // file_time_type{} is the clock's epoch (2174 in libstdc++), not the earliest time.
      if (b.files == 0 || written > b.last_used) b.last_used = written;
      ++b.files;
      b.bytes += bytes;
    }
    if (ec) report(dir, ec);
  };
  count(root_, "");
  for_each_build_folder(root_, count);
  std::vector<BuildFiles> out;
  for (auto& [name, b] : found) out.push_back(std::move(b));
  return out;
}

std::string DiskCache::build_folder_name(std::string_view template_hash, std::string_view rest_of_build) {
  return std::string(template_hash) + "-" + Hasher().add(rest_of_build).hex();
}

bool DiskCache::is_build_folder_name(const std::string& name) {
  const std::string_view n = name;
  return n.size() == 2 * kHashDigits + 1 && n[kHashDigits] == '-' && is_hex_digits(n.substr(0, kHashDigits)) &&
         is_hex_digits(n.substr(kHashDigits + 1));
}

bool DiskCache::is_cache_file_name(const std::string& name) {
  constexpr std::string_view kSuffix = ".cubin";
  // The readable part is not empty, then a dot, the hash and the suffix.
  if (name.size() < 1 + 1 + kHashDigits + kSuffix.size() || !name.ends_with(kSuffix)) return false;
  const std::size_t hash_at = name.size() - kSuffix.size() - kHashDigits;
  return name[hash_at - 1] == '.' && is_hex_digits(std::string_view(name).substr(hash_at, kHashDigits));
}

std::optional<std::string> StoreBackoff::paused(const std::filesystem::path& dir, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = pauses_.find(dir);
  if (it == pauses_.end() || now >= it->second.until) return std::nullopt;
  return it->second.why;
}

bool StoreBackoff::failed(const std::filesystem::path& dir, Clock::time_point now, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool first = !pauses_.contains(dir);
  pauses_[dir] = {now + kPause, why};
  return first;
}

std::optional<std::string> DiskCache::store(const CompiledKernel& kernel) const {
  // Not tried: the failure that paused the folder is why this kernel is not stored either.
  if (auto why = store_backoff().paused(folder(), StoreBackoff::Clock::now())) return why;
  try {
    fs::atomic_write(path_of(kernel.key), encode(kernel));
    return std::nullopt;
  } catch (const std::exception& e) {  // best effort: the kernel compiled, whatever the store met
    if (store_backoff().failed(folder(), StoreBackoff::Clock::now(), e.what())) {
      log::warn("kernel cache not written: {}; no kernels are stored in {} by this process for {} minutes, then "
                "it tries again",
                e.what(), folder().string(), StoreBackoff::kPause.count());
    } else {
      log::debug("kernel cache not written again: {}", e.what());
    }
    return e.what();
  }
}

}  // namespace moejit::jit
