// The smla CLI (issue #20): the shared argument parser (tools/smla/cli.cpp) directly, and the
// built binary (bin/smla) as a user runs it: strict integers, unknown options, SUBCOMMAND --help,
// missing values, info's exit code, bench's output and its early refusals.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli.h"
#include "smla/api.h"
#include "smla/types.h"

namespace {

using smla::Error;
namespace cli = smla::cli;

struct CliRun {
  int rc = -1;
  std::string out;  // stdout and stderr together
};

// Runs `bin/smla ARGS` (ARGS is shell text, quoted by the caller where needed).
CliRun smla_cli(const std::string& args) {
  const std::string cmd = std::string(SMLA_BINARY_DIR) + "/bin/smla " + args + " 2>&1";
  CliRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

cli::Args parse(const std::string& command, std::vector<const char*> rest) {
  std::vector<const char*> argv = {"smla", command.c_str()};
  argv.insert(argv.end(), rest.begin(), rest.end());
  return cli::parse_args(*cli::find_command(command), int(argv.size()), argv.data(), 2);
}

std::string parse_error(const std::string& command, std::vector<const char*> rest) {
  try {
    parse(command, std::move(rest));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// ---- the parser --------------------------------------------------------------------------

TEST(CliParser, IntegersAreStrictAndNeverWrap) {
  const auto a = parse("info", {"--heads", "16", "--topk=2048"});
  EXPECT_EQ(a.get_int("heads", 1, 1, 128), 16);
  EXPECT_EQ(a.get_int("topk", 1, 1, 1 << 20), 2048);
  EXPECT_EQ(a.get_int("rope-dim", 64, 0, 64), 64);  // absent: the default
  for (const char* bad : {"4294967312", "3000000000", "-3", " 16", "16 ", "+16", "0x10", "16abc", "1e2", "", "-",
                          "99999999999999999999999"}) {
    const auto b = parse("info", {"--heads", bad});
    try {
      b.get_int("heads", 1, 1, 1 << 20);
      ADD_FAILURE() << "--heads '" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "--heads must be an integer in [1, 1048576]")) << e.what();
    }
  }
  const auto c = parse("bench", {"--T", "1,32,128"});
  EXPECT_EQ(c.get_ints("T", {}, 1, 1 << 20), (std::vector<long long>{1, 32, 128}));
  for (const char* bad : {"1,,2", "1,", ",1", "-2", "1, 2", "4294967297"}) {
    const auto d = parse("bench", {"--T", bad});
    EXPECT_THROW(d.get_ints("T", {}, 1, 1 << 20), Error) << bad;
  }
}

TEST(CliParser, UnknownMissingRepeatedAndValuedFlags) {
  EXPECT_TRUE(contains(parse_error("info", {"--head", "16"}), "unknown option --head for smla info"));
  EXPECT_TRUE(contains(parse_error("check", {"--sed", "1"}), "unknown option --sed"));
  EXPECT_TRUE(contains(parse_error("bench", {"-T", "1"}), "unknown option '-T'"));
  EXPECT_TRUE(contains(parse_error("replay", {"d.st", "--outt", "x"}), "unknown option --outt"));
  EXPECT_TRUE(contains(parse_error("info", {"--heads"}), "--heads needs a value"));
  EXPECT_TRUE(contains(parse_error("info", {"--heads", "--sink"}), "--heads needs a value"));
  EXPECT_TRUE(contains(parse_error("info", {"--sink=1"}), "--sink is a flag"));
  EXPECT_TRUE(contains(parse_error("info", {"--heads", "1", "--heads", "2"}), "given twice"));
  EXPECT_TRUE(contains(parse_error("info", {"extra"}), "takes no positional"));
  EXPECT_TRUE(contains(parse_error("replay", {"--out", "x"}), "needs exactly 1 DUMP.safetensors"));
  // Values may start with a single '-' (negative numbers reach the range check).
  EXPECT_EQ(parse("bench", {"--T", "-2"}).get("T", ""), "-2");
  // --help anywhere, even with otherwise missing positionals.
  EXPECT_TRUE(parse("replay", {"--help"}).help);
  EXPECT_TRUE(parse("info", {"--heads", "3", "-h"}).help);
}

TEST(CliParser, EveryCommandHasUsage) {
  for (const auto& c : cli::commands()) {
    const std::string u = cli::usage(c);
    EXPECT_TRUE(contains(u, std::string("usage: smla ") + c.name)) << u;
    for (const auto& o : c.options) EXPECT_TRUE(contains(u, std::string("--") + o.name)) << o.name;
  }
}

// ---- the binary --------------------------------------------------------------------------

TEST(CliBinary, UnknownOptionsRefusedByEverySubcommand) {
  for (const char* cmd : {"info", "check", "bench", "replay x.safetensors"}) {
    const CliRun r = smla_cli(std::string(cmd) + " --head 16");
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.out;
    EXPECT_TRUE(contains(r.out, "unknown option --head")) << r.out;
  }
}

TEST(CliBinary, SubcommandHelpPrintsItsUsageAndExitsZero) {
  for (const char* cmd : {"info", "check", "bench", "replay"}) {
    const CliRun r = smla_cli(std::string(cmd) + " --help");
    EXPECT_EQ(r.rc, 0) << cmd << ": " << r.out;
    EXPECT_EQ(r.out.rfind(std::string("usage: smla ") + cmd, 0), 0u) << r.out;
    EXPECT_FALSE(contains(r.out, "problem:")) << "info ran instead of printing its usage";
  }
}

TEST(CliBinary, InfoRefusesWrappedIntegersAndUnrunnableGeometries) {
  for (const char* a : {"--heads 4294967312", "--heads 3000000000", "--heads -3", "--heads", "--rope-dim 32",
                        "--topk 0"}) {
    const CliRun r = smla_cli(std::string("info ") + a);
    EXPECT_NE(r.rc, 0) << a << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "kernel")) << a << " named a kernel: " << r.out;
  }
  const CliRun ok = smla_cli("info --heads 16");
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_TRUE(contains(ok.out, "H=16")) << ok.out;
}

TEST(CliBinary, ClearMessagesInsteadOfInternals) {
  CliRun r = smla_cli("bench --T -2");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.out, "--T must be comma-separated integers, each in [1,")) << r.out;
  EXPECT_FALSE(contains(r.out, "max_size")) << r.out;
  const std::string dir = ::testing::TempDir();
  r = smla_cli("replay '" + dir + "' --out '" + dir + "/r.safetensors'");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.out, "is a directory")) << r.out;
  EXPECT_FALSE(contains(r.out, "bad_alloc")) << r.out;
  if (!smla::first_cuda_device().present()) {
    // The same words as `smla info`: the build first, then the device.
    const std::string want = smla::built_with_cuda() ? "no CUDA device found" : "no CUDA backend";
    r = smla_cli("bench --backend cuda");
    EXPECT_EQ(r.rc, 1);
    EXPECT_TRUE(contains(r.out, want)) << r.out;
  }
}

TEST(CliBinary, BenchOutputAndEarlyRefusals) {
  const std::string json = ::testing::TempDir() + "/smla_cli_bench.json";
  std::filesystem::remove(json);
  CliRun r = smla_cli("bench --backend cpu --heads 1 --T 1,2 --topk 4 --reps 1 --json '" + json + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "median")) << r.out;
  EXPECT_TRUE(contains(r.out, "[min, max]")) << r.out;
  EXPECT_TRUE(contains(r.out, "1/2 ")) << r.out;
  EXPECT_TRUE(contains(r.out, "2/2 ")) << r.out;
  EXPECT_TRUE(contains(r.out, " µs") || contains(r.out, " ms")) << r.out;
  EXPECT_TRUE(std::filesystem::exists(json));
  // Refused before anything runs: an unwritable --json, CUDA-only flags on the CPU, --dcp extras.
  for (const char* a : {"--json /nonexistent-dir/x.json", "--splits 2", "--graph", "--phases", "--pool 10",
                        "--dim 512", "--rows 5", "--q bf16"}) {
    r = smla_cli(std::string("bench --backend cpu --heads 1 --T 1 --topk 4 --reps 1 ") + a);
    EXPECT_EQ(r.rc, 1) << a << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "repro:")) << a << " ran a case: " << r.out;
  }
  r = smla_cli("bench --dcp 2 --format bf16");
  EXPECT_EQ(r.rc, 1);
  EXPECT_TRUE(contains(r.out, "--format has no effect with --dcp")) << r.out;
}

TEST(CliBinary, BenchShardqRefusals) {
  // Bad combinations are refused by the argument check, before any device is touched, in every
  // build: the message names the argument, and nothing about devices or backends appears.
  const struct {
    const char* args;
    const char* want;
  } bad[] = {
      {"--shardq 3", "W must divide the 128 query heads"},
      {"--shardq 2,3", "W must divide the 128 query heads"},
      {"--shardq 4 --heads 8,16", "--heads must be an integer"},
      {"--shardq 16 --heads 8", "W must divide the 8 query heads"},
      {"--shardq 1", "--shardq must be comma-separated integers, each in [2, 128]"},
      {"--shardq 256", "--shardq must be comma-separated integers, each in [2, 128]"},
      {"--shardq 8 --format nvfp4_ds_mla", "bf16 and fp8_ds_mla"},
      {"--shardq 8 --formats bf16,fp8_e4m3", "bf16 and fp8_ds_mla"},
      {"--shardq 8 --format bf16 --formats bf16", "not both"},
      {"--shardq 8 --format nosuch", "nosuch"},
      {"--shardq 8 --a2a-gbps 0", "--a2a-gbps must be an integer in"},
      {"--shardq 8 --reps 5", "--reps must be an integer in [20,"},
      {"--shardq 8 --T 0", "--T must be comma-separated integers"},
      {"--shardq 8 --json /nonexistent-dir/x.json", "--json"},
      {"--shardq 8 --q e4m3", "--q has no effect with --shardq"},
      {"--shardq 8 --B 4", "--B has no effect with --shardq"},
      {"--shardq 8 --backend cuda", "--backend has no effect with --shardq"},
      {"--shardq 8 --dcp 2", "--dcp has no effect with --shardq"},
  };
  for (const auto& c : bad) {
    const CliRun r = smla_cli(std::string("bench ") + c.args);
    EXPECT_EQ(r.rc, 1) << c.args << ": " << r.out;
    EXPECT_TRUE(contains(r.out, c.want)) << c.args << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "no CUDA device")) << c.args << " reached the device check: " << r.out;
    EXPECT_FALSE(contains(r.out, "needs the CUDA backend")) << c.args << " reached the build check: " << r.out;
    EXPECT_FALSE(contains(r.out, "repro:")) << c.args << " ran a case: " << r.out;
  }
  // --formats without --shardq or --hisparse is still refused.
  CliRun r = smla_cli("bench --backend cpu --formats bf16");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "--formats is read only with --hisparse or --shardq")) << r.out;
  if (smla::first_cuda_device().present()) GTEST_SKIP() << "a CUDA device is present: the no-device refusal is not testable here";
  // Good arguments without a GPU: the device (CUDA build) or the build (CPU build) is named.
  const std::string want = smla::built_with_cuda() ? "no CUDA device found" : "needs the CUDA backend";
  for (const char* args : {"--shardq 8", "--shardq 2,4,8 --formats bf16,fp8_ds_mla --T 4096,16384",
                           "--shardq 4 --format fp8_ds_mla --heads 64 --topk 512 --reps 20 --pool 4096"}) {
    r = smla_cli(std::string("bench ") + args);
    EXPECT_EQ(r.rc, 1) << args << ": " << r.out;
    EXPECT_TRUE(contains(r.out, want)) << args << ": " << r.out;
    EXPECT_FALSE(contains(r.out, "repro:")) << args << ": " << r.out;
  }
}

}  // namespace
