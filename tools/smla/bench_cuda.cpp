// placeholder: the GPU benchmark lands with the SM90 kernel
#include "bench.h"
#include "smla/types.h"
namespace smla::cli {
int bench_cuda(const Args&) { fail("the CUDA benchmark is not implemented yet; run smla bench --backend cpu"); }
}  // namespace smla::cli
