"""HiSparse: the host-backed tiered KV cache (DESIGN.md §4b, C++ ``smla/tiered.h``).

A request's cache rows live in a host pool (pinned host memory on a GPU; any format; addressed by a
block table like the device cache). Each request has a device hot buffer of R slots (the last one
holds its newest token), a position -> slot map and LRU stamps. Each decode step,
:meth:`TieredCache.resolve` maps every token's request-local top-k positions to hot slots, copying
missing rows from the host pool, and returns physical hot-buffer rows and counts for
:meth:`smla.Plan.run` over the hot buffer. Host arrays run the CPU reference; CUDA arrays the CUDA
resolver (two launches of a fixed shape, no host synchronization, graph-safe).
"""

from . import _smla
from ._arrays import dl as _dl
from ._arrays import empty as _empty
from ._arrays import narrow_int32 as _narrow_int32
from ._arrays import resolve_stream as _stream


def _i32(x, name="indices"):
    # int64 narrowed exactly (values outside int32 become -1: invalid), as the serving functions do.
    return _narrow_int32(x, name)


class TieredCache:
    """The plan of a tiered cache: geometry, the plan-time rule and every buffer size.

    TieredCache(*, format="fp8_ds_mla", topk=2048, max_requests=1, max_tokens_per_request=1,
    max_positions=131072, hot_slots=0 (default round_up(2 * topk + 1, 128)), rope_dim=64)

    Refused (SmlaError) when max_tokens_per_request * topk + 1 > hot_slots. Sizes:
    ``hot_rows`` x ``hot_row_stride_bytes`` (the hot buffer), ``state_bytes``,
    ``workspace_bytes`` (CUDA resolver scratch), ``device_bytes`` (all three).
    """

    def __init__(self, *, format="fp8_ds_mla", topk=2048, max_requests=1, max_tokens_per_request=1,
                 max_positions=131072, hot_slots=0, rope_dim=64, hot_row_stride_bytes=0):
        self._c = _smla._TieredCache(
            format=str(format), topk=int(topk), max_requests=int(max_requests),
            max_tokens_per_request=int(max_tokens_per_request), max_positions=int(max_positions),
            hot_slots=int(hot_slots), rope_dim=int(rope_dim), hot_row_stride_bytes=int(hot_row_stride_bytes))

    def __getattr__(self, name):
        # format, topk, rope_dim, max_requests, max_tokens_per_request, max_positions, hot_slots,
        # row_bytes, hot_row_stride_bytes, hot_rows, hot_buffer_bytes, state_bytes,
        # workspace_bytes, device_bytes, hot_row(req, slot), newest_hot_row(req)
        c = self.__dict__.get("_c")
        if c is None:
            raise AttributeError(name)
        return getattr(c, name)

    def __repr__(self):
        c = self._c
        return (f"smla.TieredCache(format={c.format!r}, topk={c.topk}, hot_slots={c.hot_slots}, "
                f"max_requests={c.max_requests}, max_positions={c.max_positions}, device_bytes={c.device_bytes})")

    def new_buffers(self, like, *, stream=None):
        """``(hot, state, workspace)`` made by like's framework on like's device, the state reset:
        hot uint8 [hot_rows, hot_row_stride_bytes] (pass it as ``kv`` to Plan.run), state and
        workspace uint8 1-D. Allocate once, at startup."""
        hot = _empty(like, (int(self._c.hot_rows), int(self._c.hot_row_stride_bytes)), "u8")
        state = _empty(like, (int(self._c.state_bytes),), "u8")
        workspace = _empty(like, (max(int(self._c.workspace_bytes), 1),), "u8")
        self.reset(state, stream=stream)
        return hot, state, workspace

    def reset(self, state, *, stream=None):
        """Counters and stamps 0, every map -1 (a memset on the device)."""
        self._c.reset(_dl(state), release_req=None, stream=_stream(stream, state))

    def release(self, state, req, *, stream=None):
        """Forgets request ``req``'s hot rows: call it when the request finishes and its hot buffer
        goes to a new request (for rewritten positions, :meth:`invalidate` keeps the rest hot)."""
        self._c.reset(_dl(state), release_req=int(req), stream=_stream(stream, state))

    def invalidate(self, state, req, positions, *, stream=None):
        """Forgets the hot rows of single positions: req[i], positions[i] (int32 [n]; negative:
        skipped). Call it after rewriting positions in the pool (rejected speculative tokens
        overwritten by the next ones), which the hot buffer cannot see."""
        self._c.invalidate(_dl(state), _dl(_i32(req, "req")), _dl(_i32(positions, "positions")), stream=_stream(stream, state))

    def resolve(self, positions, seq_lens, pool, block_table, hot, state, *, workspace=None, block_size=None,
                block_stride_rows=None, req_of_token=None, phys=None, counts=None, stream=None):
        """One decode step; returns ``(phys, counts)`` for Plan.run over ``hot``.

        positions int32 [T, K] request-local top-k (-1 padded); seq_lens int32 [num_reqs] (the
        newest position, length - 1, is in the request's last hot slot); pool: the host pool,
        [num_blocks, block_size, row] or [num_rows, row] bytes (block_size then given here);
        block_table int32 [num_reqs, max_blocks]; req_of_token int32 [T] (None: token t ->
        request t). phys[t] holds hot-buffer rows compacted to the front, -1 after; invalid
        positions (< 0 or >= the length) are dropped. Host arrays: the CPU reference (pool may be
        any host array). CUDA arrays: the CUDA resolver; pool must be pinned host memory and
        workspace is required.
        """
        T, K = int(positions.shape[0]), int(positions.shape[1])
        if phys is None:
            phys = _empty(positions, (T, K), "i32")
        if counts is None:
            counts = _empty(positions, (T,), "i32")
        if block_size is None:
            block_size = int(pool.shape[1]) if len(pool.shape) == 3 else 1
        self._c.resolve(
            _dl(_i32(positions, "positions")), _dl(_i32(seq_lens, "seq_lens")), _dl(pool), _dl(_i32(block_table, "block_table")), block_size=int(block_size),
            block_stride_rows=None if block_stride_rows is None else int(block_stride_rows), hot=_dl(hot),
            state=_dl(state), workspace=_dl(workspace), phys=_dl(phys), counts=_dl(counts),
            req_of_token=_dl(_i32(req_of_token, "req_of_token")), stream=_stream(stream, positions))
        return phys, counts

    def write(self, latent, rope, slot_mapping, pool, hot, *, hot_rows=None, block_size=None, k_scale=1.0,
              src_dtype=None, stream=None):
        """The cache writer of a tiered cache: encodes new tokens into the host pool at
        slot_mapping (slot = block * block_size + offset; negative: skip) and, where hot_rows[n]
        >= 0, the same row into that hot-buffer row (``newest_hot_row(req)`` for each request's
        newest token). One launch on the GPU; bit-identical to smla.write_cache."""
        if block_size is None:
            block_size = int(pool.shape[1]) if len(pool.shape) == 3 else 1
        self._c.write(_dl(latent), _dl(rope), _dl(_i32(slot_mapping, "slot_mapping")), _dl(pool), block_size=int(block_size),
                      hot=_dl(hot), hot_rows=_dl(_i32(hot_rows, "hot_rows")), k_scale=float(k_scale),
                      src_fp16=src_dtype == "fp16", stream=_stream(stream, latent))
        return pool

    def counters(self, state, *, stream=None):
        """``{"hits", "misses", "bytes", "errors", "steps"}`` from the state (for a CUDA state
        this copies and synchronizes the stream: for logs, not the hot path)."""
        return dict(self._c.counters(_dl(state), stream=_stream(stream, state)))


def max_tiered_decode_batch(budget_bytes, *, format="fp8_ds_mla", topk=2048, max_tokens_per_request=1,
                            max_positions=131072, hot_slots=0, rope_dim=64, attention_workspace=None):
    """The largest decode batch (requests) whose hot buffers, state, resolver workspace and the
    attention workspace ``attention_workspace(rows)`` (a callable, or None for 0) fit budget_bytes
    of device memory; 0 when one request does not fit (the seed's autotune_hisparse_decode)."""
    return int(_smla._max_tiered_decode_batch(
        format=str(format), topk=int(topk), max_tokens_per_request=int(max_tokens_per_request),
        max_positions=int(max_positions), hot_slots=int(hot_slots), rope_dim=int(rope_dim),
        budget_bytes=int(budget_bytes), attention_workspace=attention_workspace))


__all__ = ["TieredCache", "max_tiered_decode_batch"]
