// Internal: the device side of ShardQ's ownership (src/dist/nccl_shardq.cu), exposed for the GPU
// tests, which hold it to shardq::make_layout (smla/shardq.h). No CUDA headers.
#pragma once

#include <cstdint>

namespace smla::dist::detail {

// What the ownership kernel found wrong with cu_seqlens (bits of status[0]; 0 = fine).
enum ShardqFault : int32_t {
  kShardqBadStart = 1,    // cu_seqlens[0] != 0
  kShardqDecreasing = 2,  // cu_seqlens[i + 1] < cu_seqlens[i] for some i
  kShardqBadEnd = 4,      // cu_seqlens[R] != T
  kShardqOverSlots = 8,   // a rank would attend more tokens than the planned slots
};

// On `stream` (a cudaStream_t), from device cu_seqlens [R + 1] (R >= 1, T >= 1): status[0] (the
// faults above), req_base [R, W] (slots of rank p taken by requests before r), dest [T]
// (owner * slots + slot of each token; -1 for all when status[0] != 0) and slot_token [slots]
// (this rank's token in each slot, -1 for unused slots). Checks the launches; the caller has made
// the communicator's device current.
void shardq_ownership(const int32_t* cu_seqlens, int num_requests, int64_t num_tokens, int world, int rank,
                      int64_t slots, int32_t* status, int32_t* req_base, int32_t* dest, int32_t* slot_token,
                      void* stream);

}  // namespace smla::dist::detail
