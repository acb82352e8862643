// On-disk cubin cache. One file per kernel key, written atomically (temp file + rename) and
// checksummed, so concurrent writers lose nothing and a truncated or corrupt file is detected
// and rebuilt over instead of loaded. Each build keeps its files in a subfolder of the cache
// folder of its own, "<template hash>-<hash of the NVRTC build, its options and the library
// version>", so a sweep can tell the files another build left behind from this build's.
#pragma once

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jit/compiled_kernel.hpp"

namespace moejit::jit {

enum class DiskLookup { kHit, kMiss, kCorrupt };

// The folders this process's stores failed in, and until when it stores nothing there: a cold
// tune stores hundreds of kernels, and each would meet the same full disk. Thread-safe.
class StoreBackoff {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::minutes kPause{10};
  // While `dir` is paused, the failure that paused it; nullopt otherwise.
  std::optional<std::string> paused(const std::filesystem::path& dir, Clock::time_point now);
  // Pauses `dir` for kPause from `now` after the failure `why`; whether it is the folder's first
  // failure (to warn once).
  bool failed(const std::filesystem::path& dir, Clock::time_point now, const std::string& why);

 private:
  struct Pause {
    Clock::time_point until;
    std::string why;
  };
  std::mutex mu_;
  std::map<std::filesystem::path, Pause> pauses_;
};

class DiskCache {
 public:
  // `build` is this build's subfolder name (build_folder_name).
  DiskCache(std::filesystem::path root, std::string build) : root_(std::move(root)), build_(std::move(build)) {}
  // This process's build: the embedded templates' hash; the loaded NVRTC's build, its options
  // and the library version.
  static DiskCache of_this_build(std::filesystem::path root);

  // kHit fills `out`. kCorrupt means a file existed but failed validation; it stays until store()
  // replaces it.
  DiskLookup load(const KernelKey& key, CompiledKernel& out) const;
  // Best effort: any failure to write (an unwritable folder, a full disk) is logged, not thrown,
  // since compiling still worked. After a failure in a folder, this process stores nothing there
  // for StoreBackoff::kPause (loads are still tried), then tries again: the warning comes once per
  // folder, and a disk freed or a mount back later is used again by a long-lived process. Returns
  // nullopt once stored, else why not (for `moejit compile`, whose job the store is): in a paused
  // folder, the failure that paused it.
  std::optional<std::string> store(const CompiledKernel& kernel) const;

  std::filesystem::path folder() const { return root_ / build_; }
  std::filesystem::path path_of(const KernelKey& key) const { return folder() / (key.stem() + ".cubin"); }
  const std::filesystem::path& root() const { return root_; }

  // Removes, in every build's subfolder, the temporary files of writers killed mid-write (at an
  // age no live write reaches), and in other builds' subfolders the cache files no process has
  // loaded or stored for kUnusedAge (a hit refreshes a file's time once a day), then those
  // subfolders once empty; so do the cache files of the flat layout before subfolders, in the
  // folder itself. This build's kernels stay however old: a cache filled ahead of time (moejit
  // compile, a container image) keeps serving. Safe while others use the folder: readers see a
  // whole file or none, and a miss recompiles.
  static constexpr std::chrono::days kUnusedAge{30};
  static constexpr std::chrono::hours kDeadWriterAge{1};
  void sweep() const noexcept { remove_other_builds(kUnusedAge); }
  // The sweep's removal of other builds' cache files, those unused for `unused_for` (0: all, as
  // `moejit cache prune` asks); returns how many cache files it removed. What it could not read or
  // remove goes to `errors` where given (fs::remove_old_files), and is otherwise ignored.
  std::size_t remove_other_builds(std::chrono::seconds unused_for,
                                  std::vector<std::string>* errors = nullptr) const noexcept;

  // The cache files of one build in the folder, for `moejit cache list`.
  struct BuildFiles {
    std::string build;  // its subfolder's name; empty for the flat layout's files in the folder itself
    std::size_t files = 0;
    std::uintmax_t bytes = 0;
    std::filesystem::file_time_type last_used{};  // the newest file's time
  };
  // Each build with cache files, by name. A folder or file it cannot read is left out, and said in
  // `errors` where given ("cannot read <folder>: <why>"); one that is not there is no error.
  std::vector<BuildFiles> builds(std::vector<std::string>* errors = nullptr) const;
  const std::string& build() const { return build_; }

  // Pure. "6900f36b2e760088-1f2e3d4c5b6a7988": the template hash, then a hash of the rest.
  static std::string build_folder_name(std::string_view template_hash, std::string_view rest_of_build);
  static bool is_build_folder_name(const std::string& name);
  // Whether a file name is one path_of gives: "<readable>.<16 hex digits>.cubin". Others in the
  // folder (it may be shared) are not the cache's to remove.
  static bool is_cache_file_name(const std::string& name);

  // Serialisation, exposed for tests. decode() returns nullopt for anything malformed.
  static std::string encode(const CompiledKernel& kernel);
  static std::optional<CompiledKernel> decode(const std::string& bytes, const KernelKey& expected);

 private:
  std::filesystem::path root_;
  std::string build_;
};

}  // namespace moejit::jit
