"""A prompt and how text becomes token ids (chat template on/off)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prompt:
    id: str
    category: str
    text: str | None  # None for synthetic token prompts
    token_ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None  # a chat (hf rows whose field is a message list)
    answer: str | None = None  # the source's recorded reply (sharegpt: the first gpt turn; humaneval: the solution)
    max_new_tokens: int | None = None  # this prompt's output budget (workload.output_len=recorded); None = the run's


def _ids(encoded) -> list[int]:
    """tokenizer(...) / apply_chat_template(...) results -> list of ints (dict, BatchEncoding or list)."""
    if hasattr(encoded, "keys") and "input_ids" in encoded:
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    if encoded and isinstance(encoded[0], list):  # a batch of one
        encoded = encoded[0]
    return [int(t) for t in encoded]


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None)) or type(tokenizer).__name__ == "ByteTokenizer"


def encode(tokenizer, prompt: Prompt, chat_template: bool) -> list[int]:
    """chat_template=true and the tokenizer has one: apply_chat_template(add_generation_prompt=True);
    otherwise exactly ``tokenizer(text)["input_ids"]`` (a chat is then joined into plain text)."""
    messages = prompt.messages or [{"role": "user", "content": prompt.text or ""}]
    if chat_template and has_chat_template(tokenizer):
        return _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    text = prompt.text if prompt.text is not None else "\n".join(str(m.get("content", "")) for m in messages)
    return _ids(tokenizer(text))
