"""Pinned staging: a pass's int metadata reaches the device in one copy, as views of one buffer."""

import torch

from attnlab.backends.base import Mode
from attnlab.engine.staging import HostStaging
from attnlab.kvcache import build_layout, slot_mapping
from tests.spec.tiny import runner, tiny_config, tiny_model

CFG = tiny_config()
MODEL = tiny_model(CFG, seed=0)


def _pass_tensors(p):
    lay = p.meta.layout
    return [p.slots, p.positions, p.last_rows, p.meta.qo_indptr, lay.kv_indptr, lay.kv_indices,
            lay.kv_last_page_len, lay.kv_lens]


def test_one_copy_per_pass_and_one_buffer():
    r = runner(MODEL, CFG, page_size=4)
    before = r.staging.copies
    calls = []
    orig_to = torch.Tensor.to

    def counting_to(self, *a, **kw):  # the old path made ~8 of these per pass
        calls.append(a)
        return orig_to(self, *a, **kw)

    torch.Tensor.to = counting_to
    try:
        p = r.prepare([0, 1, 2], [0, 0, 0], [5, 2, 9], Mode.PREFILL)
    finally:
        torch.Tensor.to = orig_to
    assert r.staging.copies - before == 1
    assert calls == []  # no per-tensor host-to-device moves left
    ptrs = {t.untyped_storage().data_ptr() for t in _pass_tensors(p)}
    assert len(ptrs) == 1, "every metadata tensor is a view of the one staged buffer"
    for t in _pass_tensors(p):
        assert t.data_ptr() % 16 == 0


def test_staged_values_match_the_per_tensor_build():
    r = runner(MODEL, CFG, page_size=4)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8] * 9]
    p = r.prepare([0, 1, 2], [0, 0, 0], [len(x) for x in prompts], Mode.PREFILL)
    tables = [r.allocator.page_tables[i] for i in range(3)]
    ref = build_layout(tables, [5, 2, 9], 4)
    for a, b in zip([p.meta.layout.kv_indptr, p.meta.layout.kv_indices, p.meta.layout.kv_last_page_len,
                     p.meta.layout.kv_lens], [ref.kv_indptr, ref.kv_indices, ref.kv_last_page_len, ref.kv_lens]):
        assert a.dtype == b.dtype == torch.int32 and torch.equal(a, b)
    assert p.meta.qo_indptr.tolist() == [0, 5, 7, 16] and p.meta.qo_indptr.dtype == torch.int32
    assert p.slots.dtype == p.positions.dtype == p.last_rows.dtype == torch.int64
    assert p.slots.tolist() == [s for t, n in zip(tables, [5, 2, 9]) for s in slot_mapping(t, 0, n, 4)]
    assert p.positions.tolist() == [*range(5), *range(2), *range(9)]
    assert p.last_rows.tolist() == [4, 6, 15]


def test_passes_prepared_ahead_keep_their_own_values():
    # a multi-step draft prepares k passes before running any: their buffers must not alias
    r = runner(MODEL, CFG, page_size=4)
    r.prepare([0], [0], [3], Mode.PREFILL)
    steps = [r.prepare([0], [3 + j], [1], Mode.DECODE) for j in range(4)]
    assert [s.positions.tolist() for s in steps] == [[3], [4], [5], [6]]
    assert [s.meta.layout.kv_lens.tolist() for s in steps] == [[4], [5], [6], [7]]


def test_empty_segments_and_cpu_buffer():
    st = HostStaging("cpu")
    a, b, c = st.stage([([], torch.int64), ([7, 8, 9], torch.int32), ([-1], torch.int64)])
    assert a.numel() == 0 and b.tolist() == [7, 8, 9] and c.tolist() == [-1] and st.copies == 1


def test_unpacked_staging_is_the_per_tensor_path():
    # bench.e2e's "legacy" host path: the same values, one copy per tensor
    a, b = runner(MODEL, CFG, page_size=4), runner(MODEL, CFG, page_size=4)
    b.staging.packed = False
    pa, pb = (r.prepare([0, 1], [0, 0], [5, 3], Mode.PREFILL) for r in (a, b))
    assert a.staging.copies == 1 and b.staging.copies == 8
    for x, y in zip(_pass_tensors(pa), _pass_tensors(pb)):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert len({t.untyped_storage().data_ptr() for t in _pass_tensors(pb)}) == 8


def test_prepare_steps_stages_n_passes_in_one_copy():
    a, b = runner(MODEL, CFG, page_size=4), runner(MODEL, CFG, page_size=4)
    for r in (a, b):
        r.prepare([0, 1], [0, 0], [3, 6], Mode.PREFILL)
    before = a.staging.copies
    steps = a.prepare_steps([0, 1], [3, 6], 5)
    assert a.staging.copies - before == 1 and a.prepare_steps([0, 1], [8, 11], 0) == []
    assert len({t.untyped_storage().data_ptr() for s in steps for t in _pass_tensors(s)}) == 1
    for j, s in enumerate(steps):
        ref = b.prepare([0, 1], [3 + j, 6 + j], [1, 1], Mode.DECODE)
        assert s.meta.q_lens == ref.meta.q_lens and s.meta.kv_lens_host == ref.meta.kv_lens_host
        for x, y in zip(_pass_tensors(s), _pass_tensors(ref)):
            assert x.dtype == y.dtype and torch.equal(x, y)
