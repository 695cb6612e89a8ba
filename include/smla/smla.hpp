// smla/smla.hpp — the public C++ API of smla in one include (DESIGN.md §4–§6). Link smla_api (plus
// smla_dist for context parallelism). The C ABI for FFI callers is smla/smla.h.
//
//   types, params, formats     element types, the call's params struct, byte-exact KV row codecs
//   support, engine            what each backend supports; Plan / run (CPU backend: Backend::kCpu)
//   plan, workspace            split heuristics and the layout of every caller-owned workspace
//   index, cache, serving      index conversion, the cache writer and batch helpers (CPU references)
//   cuda, cuda_serving         the CUDA entry points and serving kernels (device pointers)
//   state, dcp, dist           the LSE merge, DCP's sharding rule and CPU simulation, DCP over NCCL
#pragma once

#include "smla/api.h"
#include "smla/cache.h"
#include "smla/cuda.h"
#include "smla/cuda_serving.h"
#include "smla/dcp.h"
#include "smla/dist.h"
#include "smla/engine.h"
#include "smla/formats.h"
#include "smla/index.h"
#include "smla/numeric.h"
#include "smla/params.h"
#include "smla/plan.h"
#include "smla/serving.h"
#include "smla/shardq.h"
#include "smla/smla.h"
#include "smla/smla_dist.h"
#include "smla/state.h"
#include "smla/support.h"
#include "smla/tiered.h"
#include "smla/cuda_tiered.h"
#include "smla/types.h"
#include "smla/workspace.h"
