"""What a generation returns: per request and per speculative iteration."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RequestOutput:
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    accept_lens: list[int] = field(default_factory=list)  # tau of each verify pass this request took part in
    finish_reason: str = ""  # "eos" | "length" | "context"
    ttft_ms: float = 0.0  # prompt start -> the target's first token (the drafter's prefill is not in it)
    latency_ms: float = 0.0
    token_times_ms: list[float] = field(default_factory=list)  # commit time of each output token
    logits: torch.Tensor | None = None  # [len(output_ids), vocab] fp32 cpu, when recorded
    # serving runs (attnlab.engine.serve): times count from arrival_s, the request's arrival on the run's clock
    arrival_s: float | None = None
    queue_wait_ms: float | None = None  # arrival -> its first admission (its prefill starts)
    preemptions: int = 0  # times its KV was freed and its sequence recomputed later
    measured: bool = True  # False for the workload.warmup_requests left out of the statistics


@dataclass
class IterRecord:
    batch_size: int
    num_draft_tokens: int
    accept_lens: list[int]  # tau per request in the batch
    draft_ms: float
    verify_ms: float
    accept_ms: float
    other_ms: float
    total_ms: float
    draft_extend_ms: float = 0.0  # EAGLE: the accepted tokens with the target's features through the head
    sync_ms: float = 0.0  # the iteration's one sync: device idle from the last queued work until the host is back
    # {phase: ms} of host time per phase (PhaseTimer.host): close to the phase's device ms = host-bound
    host_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class GenerateOutput:
    requests: list[RequestOutput]
    iterations: list[IterRecord]
    prefill_ms: float  # the whole prefill: the target's, then the drafter's (until the first sync)
    wall_s: float
    num_draft_tokens: int
    draft_prefill_ms: float = 0.0  # the drafter's part of prefill_ms
