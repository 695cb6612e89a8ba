// One process per GPU for tests and the CLI: fork `world` ranks and hand them an NCCL unique id
// through pipes. The parent only makes the id (host-side bootstrap) and never touches CUDA.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "devtools/launch.h"
#include "smla/cuda.h"
#include "smla/dist.h"

namespace smla::dist {

int run_ranks(int world, const std::function<int(int, const std::vector<uint8_t>&)>& fn) {
  SMLA_CHECK(world >= 1, "run_ranks: world must be >= 1");
  std::fflush(stdout);
  // How many GPUs? Asked in a child so that this process never initializes CUDA before forking.
  const pid_t probe = fork();
  if (probe == 0) _exit(std::min(cuda::device_count(), 100));
  int st = 0;
  waitpid(probe, &st, 0);
  const int gpus = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
  if (gpus < world) return -1;

  std::vector<int> fds(size_t(2 * world));
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    SMLA_CHECK(pipe(&fds[size_t(2 * r)]) == 0, "run_ranks: pipe failed");
    const pid_t pid = fork();
    SMLA_CHECK(pid >= 0, "run_ranks: fork failed");
    if (pid == 0) {
      std::vector<uint8_t> id(128);
      size_t got = 0;
      while (got < id.size()) {
        const ssize_t n = read(fds[size_t(2 * r)], id.data() + got, id.size() - got);
        if (n <= 0) _exit(1);
        got += size_t(n);
      }
      int rc = 1;
      try {
        rc = fn(r, id);
      } catch (const std::exception& e) {
        std::printf("rank %d: error: %s\n", r, e.what());
      }
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  const auto id = make_unique_id();
  for (int r = 0; r < world; ++r)
    SMLA_CHECK(write(fds[size_t(2 * r + 1)], id.data(), id.size()) == ssize_t(id.size()), "run_ranks: write failed");
  int failures = 0;
  for (pid_t pid : pids) {
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failures;
  }
  return failures;
}

}  // namespace smla::dist
