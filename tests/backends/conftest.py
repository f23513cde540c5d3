"""Fixtures of the backend tests: the fake flashinfer / FlashAttention modules of fakes.py, installed."""

from __future__ import annotations

import sys
import types

import pytest

from tests.backends.fakes import (
    MODULES,
    XQA_CALLS,
    FakeDecode,
    FakePrefill,
    fake_fa_module,
    fake_xqa_batch_decode_with_kv_cache,
)


@pytest.fixture
def fake_fi(monkeypatch):
    mod = types.ModuleType("flashinfer")
    mod.__version__ = "0.7.2+fake"  # its wrappers transliterate 0.7.2's schedulers (fakes.py)
    FakeDecode.created, FakePrefill.created = [], []
    mod.BatchDecodeWithPagedKVCacheWrapper = FakeDecode
    mod.BatchPrefillWithPagedKVCacheWrapper = FakePrefill
    decode = types.ModuleType("flashinfer.decode")
    decode.xqa_batch_decode_with_kv_cache = fake_xqa_batch_decode_with_kv_cache
    XQA_CALLS.clear()
    mod.decode = decode
    monkeypatch.setitem(sys.modules, "flashinfer", mod)
    monkeypatch.setitem(sys.modules, "flashinfer.decode", decode)
    return mod


@pytest.fixture
def use_flavor(monkeypatch):
    """use_flavor(name) installs that fake and hides the higher-priority modules; returns the call log."""

    def install(flavor: str | None) -> list:
        calls: list = []
        for name, module in MODULES.items():
            monkeypatch.setitem(sys.modules, module, fake_fa_module(name, calls) if name == flavor else None)
        return calls

    return install
