"""Training sequences for a draft head: ShareGPT first turns, answered by the target itself.

An example is one token sequence (the chat-templated prompt, then an answer) and the index where the answer
starts: the loss covers the positions that draft answer tokens. Answers come from the target through
attnlab's own batched engine (``regen``: self-distillation, as SpecForge recommends; the head then learns the
distribution it will be verified against), and/or from ShareGPT's recorded replies (``original``).
Nothing is written but the sequences themselves (``data.pt`` in the run folder, so a resumed run trains on
the same data); the target's features and distributions are recomputed online by teacher.py.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import torch

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt, encode

log = logging.getLogger("attnlab.train")


@dataclass
class Example:
    ids: list[int]
    answer_start: int  # ids[answer_start:] is the answer


def load_turns(source: str, num_train: int, num_eval: int):
    """(train turns, heldout turns, summary) from ShareGPT's fixed split (attnlab.workloads.sharegpt)."""
    from attnlab.workloads.sharegpt import read_turns, select

    turns, info = read_turns(None if source == "sharegpt" else source)
    train, heldout = select(turns, "train")[:num_train], select(turns, "heldout")[:num_eval]
    if not train:
        raise ConfigError(f"train.data.source={source!r}: no train-split conversations")
    return train, heldout, info


def prompt_ids(tokenizer, text: str, chat_template: bool) -> list[int]:
    return encode(tokenizer, Prompt("p", "train", text), chat_template)


def original_example(tokenizer, prompt: str, answer: str, chat_template: bool) -> Example | None:
    """The recorded reply after the templated prompt; None when the template does not extend the prompt."""
    p = prompt_ids(tokenizer, prompt, chat_template)
    if chat_template and getattr(tokenizer, "chat_template", None):
        msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        full = tokenizer.apply_chat_template(msgs, tokenize=True)
        full = list(full["input_ids"] if hasattr(full, "keys") else full)
        if full[:len(p)] != p:
            return None
    else:
        full = p + list(tokenizer(answer)["input_ids"])
    return Example(full, len(p)) if len(full) > len(p) + 1 else None


def regenerate(target, prompts: list[list[int]], max_new: int, batch: int, temperature: float, eos: set[int],
               seed: int, desc: str = "regenerate", max_minutes: float | None = None) -> list[list[int]]:
    """The target's own answers to ``prompts`` through attnlab's engine (target-only decoding, batched).
    After ``max_minutes`` no new batch starts: the remaining prompts get no answer ([])."""
    import time

    from tqdm.auto import tqdm

    from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
    from attnlab.spec.drafters import NoDrafter

    dec = SpeculativeDecoder(target, NoDrafter(target.device), SpecParams(0, temperature=temperature), seed=seed)
    # longest prompts first: a batch's requests then end at similar times and the batch stays full longer
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    deadline = time.perf_counter() + 60 * max_minutes if max_minutes else None
    with tqdm(total=len(prompts) * max_new, desc=desc, unit="tok", leave=False, disable=None) as bar:
        for s in range(0, len(order), batch):
            if deadline is not None and time.perf_counter() > deadline:
                log.warning("%s: regen_max_minutes reached after %d of %d prompts", desc, s, len(prompts))
                break
            idx = order[s:s + batch]
            out = dec.generate([prompts[i] for i in idx], max_new, eos, progress=bar.update)
            for i, r in zip(idx, out.requests):
                answers[i] = r.output_ids
    return answers


def build_examples(turns, tokenizer, *, target, cfg, eos: set[int], seed: int, desc: str,
                   original: bool | None = None):
    """Examples for ``turns`` and a summary (kept / skipped counts, tokens). ``original``: override
    cfg.original (the held-out set uses the target's own answers only)."""
    d = cfg
    use_original = d.original if original is None else original
    prompts, kept = [], []
    skipped_long = 0
    for t in turns:
        ids = prompt_ids(tokenizer, t.prompt, d.chat_template)
        if len(ids) > d.max_prompt_tokens:
            skipped_long += 1
            continue
        prompts.append(ids)
        kept.append(t)
    examples: list[Example] = []
    if d.regen:
        answers = regenerate(target, prompts, d.regen_max_new_tokens, d.regen_batch_size, d.regen_temperature,
                             eos, seed, desc=f"{desc}: regenerate", max_minutes=d.regen_max_minutes)
        examples += [Example(p + a, len(p)) for p, a in zip(prompts, answers) if len(a) > 1]
        regenerated = sum(len(a) > 0 for a in answers)
    else:
        regenerated = 0
    if use_original:
        for t in kept:
            ex = original_example(tokenizer, t.prompt, t.answer, d.chat_template)
            if ex is not None:
                examples.append(ex)
    summary = {"turns": len(turns), "prompts": len(prompts), "skipped_long_prompts": skipped_long,
               "regenerated": regenerated,
               "examples": len(examples), "tokens": sum(len(e.ids) for e in examples),
               "answer_tokens": sum(len(e.ids) - e.answer_start for e in examples)}
    return examples, summary


def batches(examples: list[Example], tokens_per_batch: int, max_len: int, rng: random.Random | None = None):
    """Length-bucketed batches: lists of example indices whose padded size (count x longest) fits
    ``tokens_per_batch``; sequences longer than ``max_len`` are cut. Shuffled batch order with ``rng``."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    out, cur, longest = [], [], 0
    for i in order:
        n = min(len(examples[i].ids), max_len)
        if cur and max(longest, n) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    if rng is not None:
        rng.shuffle(out)
    return out


def collate(examples: list[Example], idx: list[int], max_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, S] int64 (padded with 0) and answer [B, S] bool (True on real answer tokens)."""
    rows = [examples[i] for i in idx]
    S = min(max_len, max(len(r.ids) for r in rows))
    ids = torch.zeros(len(rows), S, dtype=torch.long)
    ans = torch.zeros(len(rows), S, dtype=torch.bool)
    for b, r in enumerate(rows):
        seq = r.ids[:S]
        ids[b, :len(seq)] = torch.tensor(seq)
        ans[b, r.answer_start:len(seq)] = True
    return ids.to(device), ans.to(device)


def frequent_tokens(examples: list[Example], n: int, vocab: int) -> torch.Tensor:
    """The n most frequent answer tokens of ``examples`` (ties: lower id first), for a reduced draft
    vocabulary; padded with the lowest unused ids when the answers hold fewer distinct tokens."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for e in examples:
        ids = torch.tensor(e.ids[e.answer_start:], dtype=torch.long)
        counts.index_add_(0, ids, torch.ones_like(ids))
    order = sorted(range(vocab), key=lambda t: (-int(counts[t]), t))
    return torch.tensor(sorted(order[:n]), dtype=torch.long)


def save_examples(path, train: list[Example], heldout: list[Example], summary: dict) -> None:
    torch.save({"train": [(e.ids, e.answer_start) for e in train],
                "heldout": [(e.ids, e.answer_start) for e in heldout], "summary": summary}, path)


def load_examples(path) -> tuple[list[Example], list[Example], dict]:
    d = torch.load(path, weights_only=False)
    return ([Example(*e) for e in d["train"]], [Example(*e) for e in d["heldout"]], d["summary"])
