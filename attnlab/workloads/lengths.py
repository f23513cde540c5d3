"""Output budgets from recorded answers, with SGLang bench_serving's length filters (in tokens).

``workload.output_len=recorded`` (sharegpt, humaneval): a prompt's output budget is the token length of its
recorded answer (the tokenizer's plain encoding of the text, as bench_serving counts it), capped at
``workload.max_new_tokens``. Candidates are taken in source order and skipped while

- too short: the prompt or the answer has fewer than ``min_len`` tokens (bench_serving: 4);
- too long: the prompt has more than ``max_prompt_len`` tokens (1024), or prompt + answer more than
  ``max_total_len`` (2048), the answer counted before the cap,

until ``num_prompts`` are kept. The prompt is counted as attnlab feeds it (with the chat template when
``workload.chat_template=true``; bench_serving counts the raw text unless it applies one).
"""

from __future__ import annotations

import logging

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt, _ids

log = logging.getLogger("attnlab")


def answer_tokens(tokenizer, text: str) -> int:
    return len(_ids(tokenizer(text)))


def select_by_length(candidates: list[Prompt], tokenizer, tokenize, w) -> tuple[list[Prompt], dict]:
    """The first ``w.num_prompts`` candidates that pass the filters, each with ``max_new_tokens`` set, and the
    metrics.json notes (how many were skipped and why). ``tokenize(prompt)`` fills ``prompt.token_ids``."""
    kept, short, long_ = [], 0, 0
    for p in candidates:
        if len(kept) == w.num_prompts:
            break
        tokenize(p)
        n_in, n_out = len(p.token_ids), answer_tokens(tokenizer, p.answer or "")
        if n_in < w.min_len or n_out < w.min_len:
            short += 1
        elif n_in > w.max_prompt_len or n_in + n_out > w.max_total_len:
            long_ += 1
        else:
            p.max_new_tokens = min(n_out, w.max_new_tokens)
            kept.append(p)
    if not kept:
        raise ConfigError(f"workload={w.kind} output_len=recorded: no prompt passes the length filters "
                          f"(min_len={w.min_len}, max_prompt_len={w.max_prompt_len}, max_total_len={w.max_total_len}; "
                          f"{short} too short, {long_} too long)")
    log.info("workload=%s: %d prompts with recorded output lengths (capped at %d); skipped %d too short, %d too "
             "long", w.kind, len(kept), w.max_new_tokens, short, long_)
    return kept, {"prompts_skipped_too_short": short, "prompts_skipped_too_long": long_}
