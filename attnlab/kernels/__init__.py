"""attnlab's Triton kernels over the paged KV pool (no torch.nn here).

- ``paged_decode``: q_len <= 1 per request, split-KV flash-decoding, GQA group per program
- ``paged_extend``: q_len >= 1 (prefill, verify), causal or custom mask, optional split-KV
- ``merge_splits``: second pass of split-KV
- ``store_kv``: Triton KVPool.store (slot -1 = skip)
- ``plan_params``: the launch heuristic; ``warmup``: compile the variants a run will use

Set TRITON_INTERPRET=1 before this package is first imported to run the kernels on CPU.
"""

from attnlab.kernels.decode import paged_decode
from attnlab.kernels.extend import paged_extend, query_blocks
from attnlab.kernels.heuristics import LaunchParams, plan_params
from attnlab.kernels.merge import merge_splits
from attnlab.kernels.store_kv import store_kv
from attnlab.kernels.warmup import WarmupShape, warmup

__all__ = ["LaunchParams", "WarmupShape", "merge_splits", "paged_decode", "paged_extend", "plan_params",
           "query_blocks", "store_kv", "warmup"]
