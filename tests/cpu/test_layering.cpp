// The layering of DESIGN.md §6 / STYLE.md §1, read from the source tree: core and the public
// headers stay host-only and framework-free; lower layers never include higher ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Include {
  std::string file;    // path relative to the source root
  int line;
  std::string header;  // as written between <> or ""
};

bool is_source(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".h" || e == ".hpp" || e == ".cpp" || e == ".cc" || e == ".cu" || e == ".cuh" || e == ".inl";
}

std::vector<Include> includes_under(const std::string& rel_dir, int* files = nullptr) {
  const fs::path root(SMLA_SOURCE_DIR);
  const std::regex re(R"(^\s*#\s*include\s*[<"]([^>"]+)[>"])");
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
        out.push_back({fs::relative(ent.path(), root).string(), no, m[1].str()});
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
// ... and iostream, which the core and the public headers do not pull in either.
bool is_framework_header(const std::string& h) { return is_cuda_nccl_python_header(h) || h == "iostream"; }

std::string where(const Include& inc) { return inc.file + ":" + std::to_string(inc.line) + " includes <" + inc.header + ">"; }

}  // namespace

TEST(Layering, SourceTreeIsFound) {
  ASSERT_TRUE(fs::is_directory(fs::path(SMLA_SOURCE_DIR) / "src/core")) << SMLA_SOURCE_DIR;
  int core = 0, inc = 0, ref = 0;
  includes_under("src/core", &core);
  includes_under("include/smla", &inc);
  includes_under("src/reference", &ref);
  EXPECT_GT(core, 3);
  EXPECT_GT(inc, 5);
  EXPECT_GT(ref, 0);
  // the scanner sees what it should (so the checks below are not vacuous)
  bool saw_numeric = false;
  for (const auto& i : includes_under("src/core")) saw_numeric |= i.header == "smla/numeric.h";
  EXPECT_TRUE(saw_numeric);
}

TEST(Layering, CoreIsHostOnly) {
  for (const auto& e : fs::recursive_directory_iterator(fs::path(SMLA_SOURCE_DIR) / "src/core")) {
    const std::string ext = e.path().extension().string();
    EXPECT_TRUE(ext != ".cu" && ext != ".cuh") << e.path() << ": CUDA source in the host-only core";
  }
}

TEST(Layering, CoreAndPublicHeadersIncludeNoFrameworkHeaders) {
  for (const char* dir : {"src/core", "include/smla"})
    for (const auto& inc : includes_under(dir)) EXPECT_FALSE(is_framework_header(inc.header)) << where(inc);
}

TEST(Layering, CoreDoesNotIncludeHigherLayers) {
  const std::vector<std::string> higher = {"smla/reference.h", "smla/testing.h", "smla/cuda.h", "smla/api.h",
                                           "smla/replay.h"};
  for (const auto& inc : includes_under("src/core"))
    for (const auto& h : higher) EXPECT_NE(inc.header, h) << where(inc);
  // nor any file of a higher layer's folder
  for (const auto& inc : includes_under("src/core"))
    for (const char* dir : {"reference/", "cuda/", "dist/", "api/"}) EXPECT_FALSE(starts_with(inc.header, dir)) << where(inc);
}

TEST(Layering, CoreHeadersDoNotIncludeHigherLayers) {
  // The public headers of the core layer (DESIGN.md §6, layer 1).
  const std::vector<std::string> core_headers = {"types.h", "numeric.h", "formats.h", "state.h", "index.h",
                                                 "plan.h", "support.h", "params.h", "safetensors.h"};
  const std::vector<std::string> higher = {"smla/reference.h", "smla/testing.h", "smla/cuda.h", "smla/api.h",
                                           "smla/replay.h"};
  for (const auto& inc : includes_under("include/smla")) {
    const std::string name = fs::path(inc.file).filename().string();
    if (std::find(core_headers.begin(), core_headers.end(), name) == core_headers.end()) continue;
    for (const auto& h : higher) EXPECT_NE(inc.header, h) << where(inc);
  }
}

TEST(Layering, ReferenceDoesNotIncludeCudaOrApi) {
  for (const auto& inc : includes_under("src/reference")) {
    EXPECT_NE(inc.header, "smla/cuda.h") << where(inc);
    EXPECT_NE(inc.header, "smla/api.h") << where(inc);
    EXPECT_NE(inc.header, "smla/replay.h") << where(inc);
    EXPECT_FALSE(is_cuda_nccl_python_header(inc.header)) << where(inc);
    for (const char* dir : {"cuda/", "dist/", "api/"}) EXPECT_FALSE(starts_with(inc.header, dir)) << where(inc);
  }
}
