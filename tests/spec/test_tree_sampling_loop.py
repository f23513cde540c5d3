"""Tree sampling through the whole speculative loop is lossless: the second and third output tokens (one tree
verify pass of depth 2) are distributed as the target's own samples (chi-square over 20k requests against the
exact marginals, as tests/spec/test_sampling.py does for chains), for a pruned tree (top-k drafting, "onehot"
siblings: EAGLE-2's scheme) and a full tree (sampled drafting, "without_replacement")."""

import numpy as np
import pytest

from attnlab.spec.decoder import SpecParams, SpeculativeDecoder
from attnlab.spec.drafters import ModelDrafter
from tests.spec import test_sampling as ts
from tests.spec.tiny import runner

CTX = 12  # prompt 3 + first token + a whole tree of up to 6 nodes


def tree_samples(K, S, N, seed=0):
    toks, taus = [], []
    for c in range(ts.N // ts.CHUNK):
        tgt = runner(ts.TARGET, ts.CFG, max_batch=ts.CHUNK, max_context=CTX, page_size=4)
        drafter = ModelDrafter(runner(ts.DRAFT, ts.CFG, max_batch=ts.CHUNK, max_context=CTX, page_size=4,
                                      name="draft"))
        sp = ts.SP
        dec = SpeculativeDecoder(tgt, drafter, SpecParams(N, topk=K, num_steps=S, temperature=sp.temperature,
                                                          top_k=sp.top_k, top_p=sp.top_p), seed=seed + c)
        out = dec.generate([ts.PROMPT] * ts.CHUNK, max_new_tokens=3)
        toks += [r.output_ids[1:3] for r in out.requests]
        taus += [r.accept_lens[0] for r in out.requests]
    return np.array(toks), np.array(taus)


@pytest.fixture(scope="module")
def marginals():
    return ts.exact_marginals()


@pytest.mark.parametrize("K,S,N,proposal", [(2, 2, 3, "onehot"), (2, 2, 6, "without_replacement")])
def test_tree_sampling_in_the_loop_matches_target(marginals, K, S, N, proposal):
    m2, m3 = marginals
    toks, taus = tree_samples(K, S, N, seed=11)
    from attnlab.spec.tree import sampling_proposal

    assert sampling_proposal(K, S, N) == proposal
    # both rejections at the root and whole accepted paths occur, so every branch of the rule is exercised
    assert (taus == 1).mean() > 0.02 and (taus == 3).mean() > 0.01, {t: float((taus == t).mean()) for t in (1, 2, 3)}
    assert ts.chi2_pvalue(toks[:, 0], m2) > 1e-3
    assert ts.chi2_pvalue(toks[:, 1], m3) > 1e-3
