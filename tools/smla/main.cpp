// smla — the command-line face of the engine: info, check, bench, replay.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli.h"
#include "smla/types.h"

namespace {

int run(const smla::cli::Args& a) {
  if (a.command == "info") return smla::cli::cmd_info(a);
  if (a.command == "check") return smla::cli::cmd_check(a);
  if (a.command == "bench") return smla::cli::cmd_bench(a);
  return smla::cli::cmd_replay(a);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(smla::cli::usage_all().c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  const smla::cli::Command* c = smla::cli::find_command(cmd);
  if (!c) {
    std::fprintf(stderr, "smla: unknown command '%s'\n%s", cmd.c_str(), smla::cli::usage_all().c_str());
    return 2;
  }
  try {
    const auto args = smla::cli::parse_args(*c, argc, argv, 2);
    if (args.help) {
      std::fputs(smla::cli::usage(*c).c_str(), stdout);
      return 0;
    }
    return run(args);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "smla %s: error: out of memory: the problem does not fit in this machine's memory; use a "
                 "smaller one (fewer rows, heads or top-k entries)\n", cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
