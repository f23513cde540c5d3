"""Prompt sources: the builtin suite, ShareGPT, HumanEval, any HF ``datasets`` source, synthetic token prompts.

``load_prompts`` runs before any model is loaded (text only, so a missing file or an empty list fails
fast); ``tokenize_prompts`` fills ``token_ids`` once the tokenizer is known.
"""

from __future__ import annotations

from attnlab.errors import ConfigError
from attnlab.workloads.builtin import CATEGORIES, load_builtin
from attnlab.workloads.hf import load_hf
from attnlab.workloads.prompt import Prompt, encode, has_chat_template
from attnlab.workloads.synthetic import synthetic_prompts

__all__ = ["CATEGORIES", "Prompt", "encode", "has_chat_template", "load_prompts", "synthetic_prompts",
           "tokenize_prompts"]


def load_prompts(w) -> list[Prompt]:
    """Text prompts of the workload config ``w`` (synthetic: an empty list, made after the model config). With
    ``output_len=recorded`` every candidate of the source, in order: attnlab.workloads.lengths keeps the first
    ``num_prompts`` that pass its length filters once the tokenizer is known."""
    recorded = getattr(w, "output_len", "fixed") == "recorded"
    if w.kind == "builtin":
        return load_builtin(w.num_prompts, list(w.categories))
    if w.kind == "hf":
        return load_hf(w.path, w.field, w.num_prompts, w.name, w.split)
    if w.kind == "sharegpt":
        from attnlab.workloads.sharegpt import load_sharegpt

        return load_sharegpt(None if recorded else w.num_prompts, w.split, w.path)
    if w.kind == "humaneval":
        from attnlab.workloads.humaneval import load_humaneval

        return load_humaneval(None if recorded else w.num_prompts)
    if w.kind == "synthetic":
        return []
    raise ConfigError(f"workload.kind={w.kind!r}: unknown (choose from: builtin, hf, sharegpt, humaneval, synthetic)")


def tokenize_prompts(prompts: list[Prompt], tokenizer, chat_template: bool) -> list[Prompt]:
    for p in prompts:
        if not p.token_ids:
            try:
                p.token_ids = encode(tokenizer, p, chat_template)
            except _template_errors() as e:  # the tokenizer's chat template refused these messages
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                raise ConfigError(f"workload: prompt {p.id!r}: the tokenizer's chat template failed "
                                  f"({type(e).__name__}: {first}); fix the messages or set "
                                  f"workload.chat_template=false") from None
        if not p.token_ids:
            raise ConfigError(f"workload: prompt {p.id!r} tokenizes to 0 tokens (chat_template={chat_template})")
    return prompts


def _template_errors() -> tuple[type[BaseException], ...]:
    try:
        from jinja2.exceptions import TemplateError  # transformers renders chat templates with jinja2
    except ImportError:
        return ()
    return (TemplateError,)
