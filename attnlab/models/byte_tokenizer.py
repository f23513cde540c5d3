"""A byte-level tokenizer for models without one (tiny-llama): ids 0..255 are bytes, then bos, eos."""

from __future__ import annotations


class ByteTokenizer:
    """The small subset of the HF tokenizer API the engine and workloads use."""

    def __init__(self, bos_token_id: int = 256, eos_token_id: int = 257):
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.pad_token_id = eos_token_id
        self.vocab_size = max(bos_token_id, eos_token_id) + 1
        self.chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, **_):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        text += "assistant: " if add_generation_prompt else ""
        return self.encode(text) if tokenize else text

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.encode(text, add_special_tokens)}
