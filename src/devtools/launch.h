// devtools/launch.h — one process per GPU for tests and the CLI (developer tools, not the public
// API: a server brings its own process model and hands Dcp a communicator).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace smla::dist {

// Runs fn(rank, unique_id) in `world` child processes, one per GPU (fork; the parent never
// initializes CUDA, so call this before any CUDA work in the process). Each child's return value is
// its exit code. Returns the number of ranks that failed, or -1 when fewer than `world` GPUs are
// visible (nothing is run then).
int run_ranks(int world, const std::function<int(int rank, const std::vector<uint8_t>& unique_id)>& fn);

}  // namespace smla::dist
