// The kernel cache: memory and disk hits, corrupt files rebuilt instead of loaded, several
// processes filling one cache directory at once, and writers killed mid-store.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/fs.hpp"
#include "jit/disk_cache.hpp"
#include "jit/kernel_cache.hpp"
#include "support/process.hpp"
#include "support/temp_dir.hpp"
#include "tuner/config_space.hpp"

using namespace moejit;
using namespace moejit::jit;
using moejit::test::ScopedEnv;
using moejit::test::TempDir;

namespace {

KernelSpec spec(int warps, int items) {
  TileConfig c;
  c.warps = warps;
  c.items = items;
  return {Role::kRouting, c, DType::kBF16, "sm_90a"};
}

std::vector<std::filesystem::path> files_in(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

// Where the library's cache keeps this build's files in the folder `root`.
std::filesystem::path this_build(const std::filesystem::path& root) { return DiskCache::of_this_build(root).folder(); }

// The cache's files under final names, and the key each one's name spells.
std::vector<std::filesystem::path> cubin_files(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& p : files_in(dir)) {
    if (p.extension() == ".cubin") out.push_back(p);
  }
  return out;
}

KernelKey key_of_file(const std::filesystem::path& p) {
  const std::string stem = p.stem().string();
  const auto dot = stem.rfind('.');
  return {stem.substr(0, dot), stem.substr(dot + 1)};
}

// A kernel with a fake cubin, as the disk cache's encode and decode see it.
CompiledKernel fake_kernel(const std::string& module) {
  CompiledKernel k;
  k.key = {module, "0123456789abcdef"};
  k.cubin = std::string(64, 'c');
  k.name_expressions = {"a"};
  k.lowered_names = {"_Z1a"};
  return k;
}

}  // namespace

TEST_CASE("compiled kernels are served from memory, then from disk", "[cache]") {
  TempDir dir("cache");
  ScopedEnv env("MOEJIT_CACHE_DIR", dir.path().string());
  auto& cache = KernelCache::instance();
  cache.forget_compiled();
  Origin o1, o2, o3;
  auto k1 = cache.get(spec(4, 8), &o1);
  auto k2 = cache.get(spec(4, 8), &o2);
  CHECK(o1 == Origin::kCompiled);
  CHECK(o2 == Origin::kMemory);
  CHECK(k1 == k2);
  REQUIRE(files_in(dir.path()).size() == 1);  // this build's folder
  REQUIRE(files_in(this_build(dir.path())).size() == 1);
  CHECK(files_in(this_build(dir.path()))[0].filename() == k1->key.stem() + ".cubin");
  cache.forget_compiled();
  auto k3 = cache.get(spec(4, 8), &o3);
  CHECK(o3 == Origin::kDisk);
  CHECK(k3->cubin == k1->cubin);
  CHECK(k3->lowered_names == k1->lowered_names);
  CHECK(k3->resources.size() == k1->resources.size());
}

TEST_CASE("without a folder for the disk cache, kernels still compile", "[cache]") {
  // No MOEJIT_CACHE_DIR, XDG_CACHE_HOME or HOME, and a temporary folder that does not exist.
  ScopedEnv dir("MOEJIT_CACHE_DIR", ""), xdg("XDG_CACHE_HOME", ""), home("HOME", ""),
      tmp("TMPDIR", "/nonexistent/moejit-test");
  auto& cache = KernelCache::instance();
  cache.forget_compiled();
  Origin origin = Origin::kDisk;
  CHECK(cache.get(spec(4, 8), &origin) != nullptr);
  CHECK(origin == Origin::kCompiled);
  cache.forget_compiled();
  const std::vector<CompileResult> results = cache.compile_all({spec(4, 16)}, 2);
  REQUIRE(results.size() == 1);
  CHECK(results[0].error.empty());
  CHECK(results[0].kernel != nullptr);
}

TEST_CASE("threads asking for the same kernels at once compile each once and share it", "[cache]") {
  TempDir dir("threads");
  ScopedEnv env("MOEJIT_CACHE_DIR", dir.path().string());
  auto& cache = KernelCache::instance();
  cache.forget_compiled();
  const KernelSpec specs[] = {spec(4, 8), spec(4, 16), spec(8, 8)};
  constexpr int kThreads = 8, kSpecs = 3;
  std::shared_ptr<const CompiledKernel> got[kThreads][kSpecs];
  Origin origin[kThreads][kSpecs];
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < kSpecs; ++j) {
        const int s = (i + j) % kSpecs;  // each thread starts with another kernel
        got[i][s] = cache.get(specs[s], &origin[i][s]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < kSpecs; ++s) {
    INFO(specs[s].readable_name());
    int compiled = 0;
    for (int i = 0; i < kThreads; ++i) {
      REQUIRE(got[i][s]);
      CHECK(got[i][s] == got[0][s]);
      compiled += origin[i][s] == Origin::kCompiled;
    }
    CHECK(compiled == 1);
  }
  CHECK(cubin_files(this_build(dir.path())).size() == kSpecs);
}

TEST_CASE("a corrupt or truncated cache file is detected and rebuilt over", "[cache]") {
  TempDir dir("corrupt");
  ScopedEnv env("MOEJIT_CACHE_DIR", dir.path().string());
  auto& cache = KernelCache::instance();
  cache.forget_compiled();
  auto good = cache.get(spec(4, 16));
  const auto path = DiskCache::of_this_build(dir.path()).path_of(good->key);
  const std::string bytes = *fs::read_all(path);

  SECTION("truncated") { fs::atomic_write(path, bytes.substr(0, bytes.size() / 2)); }
  SECTION("one byte flipped in the cubin") {
    std::string bad = bytes;
    bad[bad.size() - 100] ^= 0x5a;
    fs::atomic_write(path, bad);
  }
  SECTION("empty file") { fs::atomic_write(path, ""); }
  SECTION("another kernel's file under this name") {
    auto other = cache.get(spec(8, 16));
    fs::atomic_write(path, DiskCache::encode(*other));
  }

  CompiledKernel out;
  CHECK(DiskCache::of_this_build(dir.path()).load(good->key, out) == DiskLookup::kCorrupt);
  CHECK(DiskCache::of_this_build(dir.path()).load(good->key, out) == DiskLookup::kCorrupt);  // still there, still rejected
  cache.forget_compiled();
  Origin o;
  auto rebuilt = cache.get(spec(4, 16), &o);
  CHECK(o == Origin::kCompiled);
  // NVRTC stamps a per-compilation id into the cubin, so compare what the loader uses.
  CHECK(rebuilt->key == good->key);
  CHECK(rebuilt->cubin.size() == good->cubin.size());
  CHECK(rebuilt->lowered_names == good->lowered_names);
  CHECK(DiskCache::of_this_build(dir.path()).load(good->key, out) == DiskLookup::kHit);
  CHECK(out.cubin == rebuilt->cubin);
}

TEST_CASE("decode rejects every malformed header", "[cache]") {
  const CompiledKernel k = fake_kernel("routing.x.sm_90a");
  const std::string good = DiskCache::encode(k);
  REQUIRE(DiskCache::decode(good, k.key));
  CHECK_FALSE(DiskCache::decode(good + "x", k.key));
  CHECK_FALSE(DiskCache::decode(good.substr(0, 20), k.key));
  CHECK_FALSE(DiskCache::decode("XOEJITK1" + good.substr(8), k.key));
  CHECK_FALSE(DiskCache::decode(good, {"routing.x.sm_90a", "fedcba9876543210"}));
}

TEST_CASE("a FIFO or an oversized file at a cache path is a miss, neither waited on nor read", "[cache]") {
  TempDir dir("odd");
  const CompiledKernel k = fake_kernel("routing.odd.sm_90a");
  const DiskCache cache(dir.path(), "build");
  std::filesystem::create_directories(cache.folder());
  CompiledKernel out;
  REQUIRE(::mkfifo(cache.path_of(k.key).c_str(), 0600) == 0);
  CHECK(cache.load(k.key, out) == DiskLookup::kMiss);
  std::filesystem::remove(cache.path_of(k.key));
  std::ofstream(cache.path_of(k.key)).close();
  std::filesystem::resize_file(cache.path_of(k.key), (std::uintmax_t{256} << 20) + 1);  // sparse: no disk used
  CHECK(cache.load(k.key, out) == DiskLookup::kMiss);
}

namespace {

std::filesystem::file_time_type days_ago(int days) {
  return std::filesystem::file_time_type::clock::now() - std::chrono::days(days);
}

}  // namespace

TEST_CASE("the first build that uses a cache folder removes other builds' files unused for 30 days, never its own", "[cache]") {
  TempDir dir("unused");
  const DiskCache mine = DiskCache::of_this_build(dir.path());
  const DiskCache other(dir.path(), DiskCache::build_folder_name("0123456789abcdef", "12.8 another nvrtc"));
  const DiskCache idle(dir.path(), DiskCache::build_folder_name("fedcba9876543210", "12.8 another nvrtc"));
  const CompiledKernel old_kernel = fake_kernel("routing.old.sm_90a"), recent = fake_kernel("routing.recent.sm_90a");
  // A cache filled ahead of time (moejit compile, a container image), 60 days ago.
  mine.store(old_kernel);
  other.store(old_kernel);
  other.store(recent);
  idle.store(old_kernel);
  // The flat layout before build subfolders.
  fs::atomic_write(dir / "routing.flat.sm_90a.0123456789abcdef.cubin", "a kernel");
  fs::atomic_write(dir / "routing.young.sm_90a.0123456789abcdef.cubin", "a kernel");
  for (const auto& path : {mine.path_of(old_kernel.key), other.path_of(old_kernel.key), idle.path_of(old_kernel.key),
                           dir / "routing.flat.sm_90a.0123456789abcdef.cubin"}) {
    std::filesystem::last_write_time(path, days_ago(60));
  }
  std::filesystem::last_write_time(other.path_of(recent.key), days_ago(29));
  ScopedEnv env("MOEJIT_CACHE_DIR", dir.path().string());
  auto& cache = KernelCache::instance();
  cache.forget_compiled();
  const auto built = cache.get(spec(4, 8));
  CHECK(std::filesystem::exists(mine.path_of(old_kernel.key)));
  CHECK(std::filesystem::exists(mine.path_of(built->key)));
  CHECK_FALSE(std::filesystem::exists(other.path_of(old_kernel.key)));
  CHECK(std::filesystem::exists(other.path_of(recent.key)));
  CHECK_FALSE(std::filesystem::exists(idle.folder()));  // emptied, then removed
  CHECK_FALSE(std::filesystem::exists(dir / "routing.flat.sm_90a.0123456789abcdef.cubin"));
  CHECK(std::filesystem::exists(dir / "routing.young.sm_90a.0123456789abcdef.cubin"));
}

TEST_CASE("build folder names hold the template hash and the NVRTC build's hash", "[cache]") {
  const std::string name = DiskCache::build_folder_name("6900f36b2e760088", "13.0 5a1b2c");
  CHECK(name.starts_with("6900f36b2e760088-"));
  CHECK(DiskCache::is_build_folder_name(name));
  CHECK(name != DiskCache::build_folder_name("6900f36b2e760088", "13.0 5a1b2d"));
  CHECK(name != DiskCache::build_folder_name("6900f36b2e760089", "13.0 5a1b2c"));
  CHECK(DiskCache::is_build_folder_name(DiskCache::of_this_build("/x").folder().filename().string()));
  for (const std::string other : {"6900f36b2e760088", "6900f36b2e760088-", "6900F36B2E760088-0123456789abcdef",
                                  "6900f36b2e760088_0123456789abcdef", "6900f36b2e760088-0123456789abcdef0",
                                  "x900f36b2e760088-0123456789abcdef", "notes"}) {
    INFO(other);
    CHECK_FALSE(DiskCache::is_build_folder_name(other));
  }
}

TEST_CASE("the sweep of unused cache files leaves names the cache does not write alone", "[cache]") {
  TempDir dir("names");
  const DiskCache disk(dir.path(), DiskCache::build_folder_name("0123456789abcdef", "another build"));
  const CompiledKernel k = fake_kernel("routing.x.sm_90a");
  disk.store(k);
  CHECK(DiskCache::is_cache_file_name(disk.path_of(k.key).filename().string()));
  // Old files in folders the user may share, whose names are not the cache's: in the cache
  // folder, in a build's subfolder, and in a subfolder not named as a build's.
  const std::vector<std::string> others = {"notes.cubin", "routing.x.sm_90a.0123456789ABCDEF.cubin",
                                           ".0123456789abcdef.cubin", "x0123456789abcdef.cubin",
                                           "x.0123456789abcdef.cubin.bak", "x.0123456789abcde.cubin", "README"};
  const auto theirs = dir / "their-folder";
  std::filesystem::create_directories(theirs);
  for (const std::string& other : others) {
    INFO(other);
    CHECK_FALSE(DiskCache::is_cache_file_name(other));
    for (const auto& folder : {dir.path(), disk.folder()}) {
      std::ofstream(folder / other) << "theirs";
      std::filesystem::last_write_time(folder / other, days_ago(60));
    }
  }
  const std::string cache_named = "routing.x.sm_90a.0123456789abcdef.cubin";
  std::ofstream(theirs / cache_named) << "theirs";
  std::filesystem::last_write_time(theirs / cache_named, days_ago(60));
  std::filesystem::last_write_time(disk.path_of(k.key), days_ago(31));
  DiskCache::of_this_build(dir.path()).sweep();
  CHECK_FALSE(std::filesystem::exists(disk.path_of(k.key)));
  for (const std::string& other : others) {
    CHECK(std::filesystem::exists(dir / other));
    CHECK(std::filesystem::exists(disk.folder() / other));
  }
  CHECK(std::filesystem::exists(theirs / cache_named));
  // A folder not made yet is not an error.
  DiskCache::of_this_build(dir / "absent").sweep();
}

TEST_CASE("a disk hit marks an old cache file as in use, a young one is not written", "[cache]") {
  TempDir dir("hit");
  const DiskCache disk(dir.path(), DiskCache::build_folder_name("0123456789abcdef", "another build"));
  const CompiledKernel k = fake_kernel("routing.hit.sm_90a");
  disk.store(k);
  const auto path = disk.path_of(k.key);
  CompiledKernel out;
  const auto now = std::filesystem::file_time_type::clock::now();
  std::filesystem::last_write_time(path, now - std::chrono::hours(2));
  REQUIRE(disk.load(k.key, out) == DiskLookup::kHit);
  CHECK(std::filesystem::last_write_time(path) < now - std::chrono::hours(1));
  std::filesystem::last_write_time(path, days_ago(60));
  REQUIRE(disk.load(k.key, out) == DiskLookup::kHit);
  CHECK(std::filesystem::last_write_time(path) > days_ago(1));
  DiskCache::of_this_build(dir.path()).sweep();  // another build's sweep: the file is in use
  CHECK(std::filesystem::exists(path));
}

TEST_CASE("ptxas's performance advisories travel with the kernel through the disk cache", "[cache]") {
  CompiledKernel k = fake_kernel("bwd_dw1.x.sm_90a");
  k.performance_losses = {"(C7515) wgmma.mma_async instructions are serialized"};
  const auto back = DiskCache::decode(DiskCache::encode(k), k.key);
  REQUIRE(back);
  CHECK(back->performance_losses == k.performance_losses);
}

TEST_CASE("compile_all reports each config and never throws for one failure", "[cache]") {
  TempDir dir("all");
  ScopedEnv env("MOEJIT_CACHE_DIR", dir.path().string());
  auto specs = std::vector<KernelSpec>{spec(4, 4), spec(8, 4), spec(4, 0)};
  auto results = KernelCache::instance().compile_all(specs, 2);
  REQUIRE(results.size() == 3);
  CHECK(results[0].kernel);
  CHECK(results[1].kernel);
  CHECK_FALSE(results[2].kernel);
  CHECK_THAT(results[2].error, Catch::Contains("lacks warps and items"));
}

TEST_CASE("several processes filling one cache directory lose nothing", "[cache][multiprocess]") {
  TempDir dir("mp");
  const std::string cmd = "MOEJIT_CACHE_DIR=" + dir.path().string() + " " + test::cli() +
                          " compile --arch sm_90a --role routing --tokens 2048 --shape 64,2048,768,4 --jobs 1";
  // Four CLI processes started together, each compiling the same configs into the same files.
  std::string all;
  for (int i = 0; i < 4; ++i) all += "(" + cmd + " > " + (dir / ("log" + std::to_string(i))).string() + " 2>&1; echo $? >> " + (dir / "codes").string() + ") & ";
  all += "wait";
  REQUIRE(test::run_command(all).exit_code == 0);
  auto codes = *fs::read_all(dir / "codes");
  CHECK(codes == "0\n0\n0\n0\n");
  const auto cubins = cubin_files(this_build(dir.path()));
  for (const auto& p : cubins) {
    CompiledKernel k;
    CHECK(DiskCache::of_this_build(dir.path()).load(key_of_file(p), k) == DiskLookup::kHit);
  }
  // TK = 8192: every config with a chunk <= 8192 pairs survives pruning.
  int expected = 0;
  for (const auto& c : config_space(Role::kRouting, MoeShape{8192, 64, 2048, 768, 4, DType::kBF16})) expected += c.threads() * c.items <= 8192;
  CHECK(cubins.size() == static_cast<std::size_t>(expected));
  for (const auto& p : files_in(this_build(dir.path()))) CHECK(p.filename().string().find(".tmp.") == std::string::npos);
}

namespace {

// A kernel with a cubin of `bytes` bytes that spell its number, so a file holding another's bytes
// or a part of them shows.
CompiledKernel numbered_kernel(int child, int n, std::size_t bytes) {
  CompiledKernel k = fake_kernel(fmt::format("routing.killed{}_{}", child, n));
  k.cubin.assign(bytes, static_cast<char>('a' + (child * 7 + n) % 26));
  return k;
}

// Stores kernels until killed; after each store appends its number to `log` with one write().
[[noreturn]] void store_until_killed(const std::filesystem::path& dir, const std::filesystem::path& log,
                                     int child) noexcept {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  const DiskCache cache(dir, "build");
  for (int n = 0;; ++n) {
    cache.store(numbered_kernel(child, n, std::size_t{1} << 18));
    const std::string line = std::to_string(n) + "\n";
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(2);
  }
}

}  // namespace

TEST_CASE("writers killed mid-store leave only whole cache files", "[cache][multiprocess]") {
  TempDir dir("killed");
  constexpr int kChildren = 4;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) store_until_killed(dir.path(), dir / fmt::format("log{}", c), c);
    children.push_back(pid);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (pid_t pid : children) ::kill(pid, SIGKILL);
  for (pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));
  }

  const DiskCache cache(dir.path(), "build");
  int logged = 0;
  for (int c = 0; c < kChildren; ++c) {
    std::istringstream log(fs::read_all(dir / fmt::format("log{}", c)).value_or(""));
    for (int n; log >> n; ++logged) {
      const CompiledKernel want = numbered_kernel(c, n, std::size_t{1} << 18);
      CompiledKernel got;
      REQUIRE(cache.load(want.key, got) == DiskLookup::kHit);
      CHECK(got.cubin == want.cubin);
    }
  }
  CHECK(logged >= kChildren);
  // Every file under a final name, logged or not, is whole; the rest are temporary files, which
  // the next process sweeps once they are old.
  const auto files = cubin_files(cache.folder());
  for (const auto& p : files) {
    CompiledKernel k;
    INFO(p);
    CHECK(cache.load(key_of_file(p), k) == DiskLookup::kHit);
  }
  CHECK(files.size() >= static_cast<std::size_t>(logged));
}

TEST_CASE("a folder whose store failed is paused for a while, then tried again, with one warning", "[cache]") {
  StoreBackoff backoff;
  const auto t0 = StoreBackoff::Clock::now();
  CHECK_FALSE(backoff.paused("/cache/a", t0));
  CHECK(backoff.failed("/cache/a", t0, "disk full"));  // the first failure: warned
  // The failure that paused the folder: what `moejit compile` says of the kernels it did not store.
  CHECK(backoff.paused("/cache/a", t0 + StoreBackoff::kPause - std::chrono::seconds(1)) == "disk full");
  CHECK_FALSE(backoff.paused("/cache/b", t0));  // other folders store on
  // Past the pause a store is tried again (a disk freed, a mount back); failing, it pauses again
  // without another warning.
  CHECK_FALSE(backoff.paused("/cache/a", t0 + StoreBackoff::kPause));
  CHECK_FALSE(backoff.failed("/cache/a", t0 + StoreBackoff::kPause, "read-only"));
  CHECK(backoff.paused("/cache/a", t0 + StoreBackoff::kPause + std::chrono::minutes(1)) == "read-only");
}
