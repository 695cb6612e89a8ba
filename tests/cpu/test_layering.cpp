// The layering of DESIGN.md §6 / STYLE.md §1, read from the source tree and from what the build
// links: include/smla holds only the public API and includes only itself and standard headers; core
// stays host-only and framework-free, without JSON; lower layers never include higher ones; the
// developer tools (src/devtools) are reached by the tools and tests only, never by a public library.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Include {
  std::string file;    // path relative to the source root
  int line;
  std::string header;  // as written between <> or ""
  bool quoted;
};

bool is_source(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".h" || e == ".hpp" || e == ".cpp" || e == ".cc" || e == ".cu" || e == ".cuh" || e == ".inl";
}

std::vector<Include> includes_under(const std::string& rel_dir, int* files = nullptr) {
  const fs::path root(SMLA_SOURCE_DIR);
  const std::regex re(R"(^\s*#\s*include\s*([<"])([^>"]+)[>"])");
  std::vector<Include> out;
  int n = 0;
  for (const auto& ent : fs::recursive_directory_iterator(root / rel_dir)) {
    if (!ent.is_regular_file() || !is_source(ent.path())) continue;
    ++n;
    std::ifstream in(ent.path());
    std::string line;
    int no = 0;
    while (std::getline(in, line)) {
      ++no;
      std::smatch m;
      if (std::regex_search(line, m, re))
        out.push_back({fs::relative(ent.path(), root).string(), no, m[2].str(), m[1].str() == "\""});
    }
  }
  if (files) *files = n;
  return out;
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

// CUDA toolkit, NCCL and Python headers. ("smla/cuda.h" is smla's own CUDA-free header.)
bool is_cuda_nccl_python_header(const std::string& h) {
  static const char* prefixes[] = {"cuda", "cub/", "thrust/", "cute/", "cutlass/", "cooperative_groups",
                                   "nccl", "nvrtc", "cublas", "curand", "device_launch_parameters",
                                   "Python.h", "pybind11", "nanobind", "dlpack"};
  for (const char* p : prefixes)
    if (starts_with(h, p)) return true;
  return false;
}
bool is_json_header(const std::string& h) { return starts_with(h, "nlohmann") || h.find("json") != std::string::npos; }
// ... and iostream, which the core and the public headers do not pull in either.
bool is_framework_header(const std::string& h) {
  return is_cuda_nccl_python_header(h) || h == "iostream" || is_json_header(h);
}

// Folders of the internal and developer layers, as their headers are spelled in an include.
const std::vector<std::string> kInternalPrefixes = {"core/", "reference/", "cuda/", "dist/", "api/", "devtools/"};

std::string where(const Include& inc) { return inc.file + ":" + std::to_string(inc.line) + " includes <" + inc.header + ">"; }

std::set<std::string> public_headers() {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(fs::path(SMLA_SOURCE_DIR) / "include/smla"))
    if (e.is_regular_file()) names.insert("smla/" + e.path().filename().string());
  return names;
}

// The public headers of the core layer (DESIGN.md §6, layer 1); every other public header belongs
// to a higher layer (reference through the API, CUDA entry points, dist, the umbrella and C ABI).
const std::set<std::string> kCoreHeaders = {"smla/types.h",  "smla/numeric.h", "smla/formats.h",  "smla/state.h",
                                            "smla/index.h",  "smla/plan.h",    "smla/support.h",  "smla/params.h",
                                            "smla/cache.h",  "smla/serving.h", "smla/workspace.h",
                                            "smla/tiered.h"};

// target -> the targets and libraries it links directly, as CMake saw them (tests/CMakeLists.txt).
std::map<std::string, std::vector<std::string>> read_links() {
  std::map<std::string, std::vector<std::string>> links;
  std::ifstream in(std::string(SMLA_BINARY_DIR) + "/layering_links.txt");
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::vector<std::string>& deps = links[line.substr(0, eq)];
    std::stringstream ss(line.substr(eq + 1));
    std::string dep;
    while (std::getline(ss, dep, ';'))
      if (!dep.empty()) deps.push_back(dep);
  }
  return links;
}

// Everything `target` reaches through the targets of `links`.
std::set<std::string> reach(const std::map<std::string, std::vector<std::string>>& links, const std::string& target) {
  std::set<std::string> seen;
  std::vector<std::string> todo = {target};
  while (!todo.empty()) {
    const std::string t = todo.back();
    todo.pop_back();
    const auto it = links.find(t);
    if (it == links.end()) continue;
    for (const auto& d : it->second)
      if (seen.insert(d).second) todo.push_back(d);
  }
  return seen;
}

}  // namespace

TEST(Layering, SourceTreeIsFound) {
  ASSERT_TRUE(fs::is_directory(fs::path(SMLA_SOURCE_DIR) / "src/core")) << SMLA_SOURCE_DIR;
  int core = 0, inc = 0, ref = 0, dev = 0;
  includes_under("src/core", &core);
  includes_under("include/smla", &inc);
  includes_under("src/reference", &ref);
  includes_under("src/devtools", &dev);
  EXPECT_GT(core, 3);
  EXPECT_GT(inc, 5);
  EXPECT_GT(ref, 0);
  EXPECT_GT(dev, 3);
  // the scanner sees what it should (so the checks below are not vacuous)
  bool saw_numeric = false, saw_json = false, saw_public = false;
  for (const auto& i : includes_under("src/core")) saw_numeric |= i.header == "smla/numeric.h";
  for (const auto& i : includes_under("src/devtools")) saw_json |= is_json_header(i.header);
  for (const auto& i : includes_under("include/smla")) saw_public |= i.quoted && starts_with(i.header, "smla/");
  EXPECT_TRUE(saw_numeric);
  EXPECT_TRUE(saw_json);  // safetensors' JSON header parser lives in the developer tools
  EXPECT_TRUE(saw_public);
}

TEST(Layering, CoreIsHostOnly) {
  for (const auto& e : fs::recursive_directory_iterator(fs::path(SMLA_SOURCE_DIR) / "src/core")) {
    const std::string ext = e.path().extension().string();
    EXPECT_TRUE(ext != ".cu" && ext != ".cuh") << e.path() << ": CUDA source in the host-only core";
  }
}

TEST(Layering, PublicHeadersIncludeOnlyPublicHeaders) {
  const std::set<std::string> pub = public_headers();
  for (const auto& inc : includes_under("include/smla")) {
    if (inc.quoted) {
      EXPECT_TRUE(pub.count(inc.header)) << where(inc) << ": a public header may include only smla/ public headers";
    } else {
      EXPECT_FALSE(starts_with(inc.header, "smla/") && !pub.count(inc.header)) << where(inc);
    }
    for (const auto& p : kInternalPrefixes) EXPECT_FALSE(starts_with(inc.header, p)) << where(inc);
  }
}

TEST(Layering, DeveloperToolsAreNotPublic) {
  // Test problem generators, replay, safetensors, the CPU oracle's internals, bench support and the
  // process launcher live in src/devtools (or src/reference), not in the public tree.
  for (const char* name : {"testing.h", "replay.h", "safetensors.h", "reference.h", "launch.h", "bench_support.h"})
    EXPECT_FALSE(fs::exists(fs::path(SMLA_SOURCE_DIR) / "include/smla" / name)) << "include/smla/" << name;
  // The umbrella header is the whole public C++ API: it includes every public header.
  std::set<std::string> umbrella;
  for (const auto& inc : includes_under("include/smla"))
    if (fs::path(inc.file).filename() == "smla.hpp") umbrella.insert(inc.header);
  for (const auto& h : public_headers())
    if (h != "smla/smla.hpp") EXPECT_TRUE(umbrella.count(h)) << "smla/smla.hpp does not include " << h;
}

TEST(Layering, CoreAndPublicHeadersIncludeNoFrameworkHeaders) {
  for (const char* dir : {"src/core", "include/smla"})
    for (const auto& inc : includes_under(dir)) EXPECT_FALSE(is_framework_header(inc.header)) << where(inc);
}

TEST(Layering, CoreDoesNotIncludeHigherLayers) {
  for (const auto& inc : includes_under("src/core")) {
    if (starts_with(inc.header, "smla/"))
      EXPECT_TRUE(kCoreHeaders.count(inc.header)) << where(inc) << ": core includes a higher layer's header";
    for (const auto& p : kInternalPrefixes)
      if (p != "core/") EXPECT_FALSE(starts_with(inc.header, p)) << where(inc);
  }
}

TEST(Layering, CoreHeadersDoNotIncludeHigherLayers) {
  for (const auto& inc : includes_under("include/smla")) {
    const std::string self = "smla/" + fs::path(inc.file).filename().string();
    if (!kCoreHeaders.count(self) || !starts_with(inc.header, "smla/")) continue;
    EXPECT_TRUE(kCoreHeaders.count(inc.header)) << where(inc) << ": a core header includes a higher layer's header";
  }
}

TEST(Layering, ReferenceDoesNotIncludeCudaApiOrTools) {
  for (const auto& inc : includes_under("src/reference")) {
    if (starts_with(inc.header, "smla/")) EXPECT_TRUE(kCoreHeaders.count(inc.header)) << where(inc);
    EXPECT_FALSE(is_cuda_nccl_python_header(inc.header)) << where(inc);
    for (const char* dir : {"cuda/", "dist/", "api/", "devtools/"}) EXPECT_FALSE(starts_with(inc.header, dir)) << where(inc);
  }
}

TEST(Layering, LibrariesDoNotIncludeDeveloperToolsOrJson) {
  for (const char* dir : {"src/core", "src/reference", "src/cuda", "src/api", "src/dist", "include/smla"})
    for (const auto& inc : includes_under(dir)) {
      EXPECT_FALSE(starts_with(inc.header, "devtools/")) << where(inc);
      EXPECT_FALSE(is_json_header(inc.header)) << where(inc);
    }
}

TEST(Layering, PublicLibrariesDoNotLinkDeveloperTools) {
  const auto links = read_links();
  ASSERT_TRUE(links.count("smla_devtools")) << "no link list at " << SMLA_BINARY_DIR << "/layering_links.txt";
  // the reader sees real edges (so the checks below are not vacuous)
  EXPECT_TRUE(reach(links, "smla_devtools").count("smla_core"));
  EXPECT_TRUE(reach(links, "smla_dist").count("smla_api"));
  for (const char* lib : {"smla_core", "smla_reference", "smla_cuda", "smla_api", "smla_dist"}) {
    if (!links.count(lib)) continue;  // smla_cuda in a build without CUDA
    for (const auto& dep : reach(links, lib)) {
      EXPECT_NE(dep, "smla_devtools") << lib << " links the developer tools";
      EXPECT_FALSE(is_json_header(dep)) << lib << " links " << dep;
    }
  }
  const auto core = reach(links, "smla_core");
  for (const char* higher : {"smla_reference", "smla_cuda", "smla_api", "smla_dist"}) EXPECT_FALSE(core.count(higher));
}
