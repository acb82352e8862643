// On-disk cubin cache. One file per kernel key, written atomically (temp file + rename) and
// checksummed, so concurrent writers lose nothing and a truncated or corrupt file is detected
// and rebuilt over instead of loaded.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "jit/compiled_kernel.hpp"

namespace moejit::jit {

enum class DiskLookup { kHit, kMiss, kCorrupt };

class DiskCache {
 public:
  explicit DiskCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

  // kHit fills `out`. kCorrupt means a file existed but failed validation; it stays until store()
  // replaces it.
  DiskLookup load(const KernelKey& key, CompiledKernel& out) const;
  // Best effort: any failure to write (an unwritable folder, a full disk) is logged, not thrown,
  // since compiling still worked. After one failure in a folder, this process stores nothing more
  // there (loads are still tried), so the warning comes once per folder.
  void store(const CompiledKernel& kernel) const;

  std::filesystem::path path_of(const KernelKey& key) const { return dir_ / (key.stem() + ".cubin"); }
  const std::filesystem::path& dir() const { return dir_; }

  // Removes the cache files no process has loaded or stored for kUnusedAge (a hit refreshes a
  // file's time once a day): each template or NVRTC change leaves a whole set behind otherwise.
  // Safe while others use the folder: readers see a whole file or none, and a miss recompiles.
  static constexpr std::chrono::days kUnusedAge{30};
  void remove_unused_files() const noexcept;

  // Whether a file name is one path_of gives: "<readable>.<16 hex digits>.cubin". Others in the
  // folder (it may be shared) are not the cache's to remove.
  static bool is_cache_file_name(const std::string& name);

  // Serialisation, exposed for tests. decode() returns nullopt for anything malformed.
  static std::string encode(const CompiledKernel& kernel);
  static std::optional<CompiledKernel> decode(const std::string& bytes, const KernelKey& expected);

 private:
  std::filesystem::path dir_;
};

}  // namespace moejit::jit
