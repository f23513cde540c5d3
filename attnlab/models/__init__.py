"""Llama-family decoder, its config, and weight loading (HF folder, GGUF, hub id, random init, presets)."""

from attnlab.models.config import ModelConfig
from attnlab.models.decoder import Decoder
from attnlab.models.loading import load_model, load_tokenizer
from attnlab.models.presets import PRESETS, preset_names

__all__ = ["PRESETS", "Decoder", "ModelConfig", "load_model", "load_tokenizer", "preset_names"]
