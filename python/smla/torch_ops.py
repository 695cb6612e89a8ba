"""PyTorch integration: the current-stream helper and ``torch.library`` custom ops.

Importing this module imports torch (smla itself does not). The ops are registered once, under
the ``smla`` namespace, each with a fake (meta) implementation so ``torch.compile`` traces them
without graph breaks:

- ``torch.ops.smla.sparse_mla(q, q_rope, kv, idx, counts, sink, format, softmax_scale, q_scale,
  k_scale, rope_dim, lse_base, score_precision="auto") -> (out, lse)`` — allocates out [T, H, 512] (q's 16-bit dtype,
  bf16 for an e4m3 q) and lse [T, H] float32.
- ``torch.ops.smla.sparse_mla_out(...)`` — the same into caller-owned ``out`` / ``lse``
  (mutated in place; lse may be None).
- ``torch.ops.smla.write_cache(latent, rope, slot_mapping, cache, format, k_scale)`` — mutates cache.
- ``torch.ops.smla.convert_indices(positions, block_table, req_of_token, block_size,
  block_stride_rows, dcp_world, dcp_rank, dcp_interleave) -> (phys, counts)``.

Every op launches on PyTorch's current stream. Quantized caches are uint8 tensors (float8 tensors
are read as their bytes).
"""

from typing import Optional, Tuple

import torch

import smla

__all__ = ["current_stream", "sparse_mla", "sparse_mla_out", "write_cache", "convert_indices"]


def current_stream(device=None):
    """PyTorch's current CUDA stream on `device` (default: the current device) as an int handle."""
    return int(torch.cuda.current_stream(device).cuda_stream)


def _stream_for(t):
    return current_stream(t.device) if t.is_cuda else 0


def _out_dtype(q):
    return torch.float16 if q.dtype == torch.float16 else torch.bfloat16


@torch.library.custom_op("smla::sparse_mla", mutates_args=())
def sparse_mla(q: torch.Tensor, q_rope: Optional[torch.Tensor], kv: torch.Tensor, idx: torch.Tensor,
               counts: Optional[torch.Tensor], sink: Optional[torch.Tensor], format: str, softmax_scale: float,
               q_scale: float = 1.0, k_scale: float = 1.0, rope_dim: int = 64,
               lse_base: str = "e", score_precision: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    T, H = q.shape[0], q.shape[1]
    out = torch.empty((T, H, smla.LATENT_DIM), dtype=_out_dtype(q), device=q.device)
    lse = torch.empty((T, H), dtype=torch.float32, device=q.device)
    qq = q if q_rope is None else (q, q_rope)
    smla.sparse_mla(qq, kv, idx, format=format, softmax_scale=softmax_scale, counts=counts, sink=sink,
                    q_scale=q_scale, k_scale=k_scale, rope_dim=rope_dim, lse_base=lse_base, out=out, lse=lse,
                    score_precision=score_precision, stream=_stream_for(q))
    return out, lse


@sparse_mla.register_fake
def _sparse_mla_fake(q, q_rope, kv, idx, counts, sink, format, softmax_scale, q_scale=1.0, k_scale=1.0,
                     rope_dim=64, lse_base="e", score_precision="auto"):
    T, H = q.shape[0], q.shape[1]
    return (q.new_empty((T, H, smla.LATENT_DIM), dtype=_out_dtype(q)), q.new_empty((T, H), dtype=torch.float32))


@torch.library.custom_op("smla::sparse_mla_out", mutates_args=("out", "lse"))
def sparse_mla_out(q: torch.Tensor, q_rope: Optional[torch.Tensor], kv: torch.Tensor, idx: torch.Tensor,
                   counts: Optional[torch.Tensor], sink: Optional[torch.Tensor], out: torch.Tensor,
                   lse: Optional[torch.Tensor], format: str, softmax_scale: float, q_scale: float = 1.0,
                   k_scale: float = 1.0, rope_dim: int = 64, lse_base: str = "e",
                   score_precision: str = "auto") -> None:
    qq = q if q_rope is None else (q, q_rope)
    smla.sparse_mla(qq, kv, idx, format=format, softmax_scale=softmax_scale, counts=counts, sink=sink,
                    q_scale=q_scale, k_scale=k_scale, rope_dim=rope_dim, lse_base=lse_base, out=out, lse=lse,
                    return_lse=lse is not None, score_precision=score_precision, stream=_stream_for(q))


@sparse_mla_out.register_fake
def _sparse_mla_out_fake(q, q_rope, kv, idx, counts, sink, out, lse, format, softmax_scale, q_scale=1.0,
                         k_scale=1.0, rope_dim=64, lse_base="e", score_precision="auto"):
    return None


@torch.library.custom_op("smla::write_cache", mutates_args=("cache",))
def write_cache(latent: torch.Tensor, rope: Optional[torch.Tensor], slot_mapping: torch.Tensor,
                cache: torch.Tensor, format: str, k_scale: float = 1.0) -> None:
    smla.write_cache(latent, rope, slot_mapping, cache, format=format, k_scale=k_scale,
                     stream=_stream_for(latent))


@write_cache.register_fake
def _write_cache_fake(latent, rope, slot_mapping, cache, format, k_scale=1.0):
    return None


@torch.library.custom_op("smla::convert_indices", mutates_args=())
def convert_indices(positions: torch.Tensor, block_table: torch.Tensor, req_of_token: Optional[torch.Tensor],
                    block_size: int, block_stride_rows: int = -1, dcp_world: int = 1, dcp_rank: int = 0,
                    dcp_interleave: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    return smla.convert_indices(positions, block_table, block_size=block_size,
                                block_stride_rows=None if block_stride_rows < 0 else block_stride_rows,
                                req_of_token=req_of_token, dcp_world=dcp_world, dcp_rank=dcp_rank,
                                dcp_interleave=dcp_interleave, stream=_stream_for(positions))


@convert_indices.register_fake
def _convert_indices_fake(positions, block_table, req_of_token, block_size, block_stride_rows=-1, dcp_world=1,
                          dcp_rank=0, dcp_interleave=1):
    T, K = positions.shape[0], positions.shape[1]
    return (positions.new_empty((T, K), dtype=torch.int32), positions.new_empty((T,), dtype=torch.int32))
