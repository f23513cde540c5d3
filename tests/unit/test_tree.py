"""Draft trees: construction, masks, greedy walk, chain reductions and compaction, against brute-force
references in plain Python (CPU, small shapes)."""

import numpy as np
import pytest
import torch

from attnlab.engine.sampler import sample
from attnlab.errors import ConfigError
from attnlab.kvcache import PageAllocator, pages_needed
from attnlab.spec.acceptance import greedy_accept, rejection_accept
from attnlab.spec.tree import (
    chain_tree,
    check_tree_shape,
    draft_step_mask,
    draw_children,
    max_tree_nodes,
    sampling_proposal,
    select_tree,
    tree_start,
    tree_step,
)
from attnlab.spec.tree_accept import children_table, emitted_tokens, tree_greedy_accept, tree_rejection_accept
from attnlab.spec.tree_verify import (
    ancestor_mask,
    draft_compaction,
    flatten_custom_mask,
    mask_bits,
    target_compaction,
    verify_inputs,
    verify_mask,
)

# ---------------------------------------------------------------------------------------------------------
# shape checks


@pytest.mark.parametrize("topk,steps,n,want", [(1, None, 4, 4), (1, 4, 4, 4), (2, 3, 8, 3), (2, 2, 6, 2),
                                               (3, 3, 21, 3), (4, 1, 4, 1)])
def test_check_tree_shape_accepts(topk, steps, n, want):
    assert check_tree_shape(topk, steps, n) == want


@pytest.mark.parametrize("topk,steps,n,needle", [
    (2, None, 8, "spec.num_steps=null"),
    (1, 3, 4, "spec.num_draft_tokens=4 > 3"),  # a chain of 3 steps drafts 3 tokens
    (1, 5, 4, "spec.num_steps=5 > spec.num_draft_tokens=4"),
    (2, 2, 7, "spec.num_draft_tokens=7 > 6"),
    (2, 0, 4, "spec.num_steps=0"),
    (0, 1, 4, "spec.topk=0"),
])
def test_check_tree_shape_refuses_in_one_line(topk, steps, n, needle):
    with pytest.raises(ConfigError) as e:
        check_tree_shape(topk, steps, n)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sampling_proposal():
    assert sampling_proposal(1, 4, 4) == "without_replacement"  # chains
    assert sampling_proposal(2, 2, max_tree_nodes(2, 2)) == "without_replacement"  # full tree: no pruning
    assert sampling_proposal(2, 3, 8) == "onehot"  # EAGLE-2 pruning


# ---------------------------------------------------------------------------------------------------------
# construction vs a brute-force reference


def random_steps(B, K, S, V, g):
    """Per-step inputs as a draft loop would give them: sorted random log-probs, random tokens, q rows."""
    out = []
    for s in range(S):
        F_ = 1 if s == 0 else K
        q = torch.softmax(torch.randn(B, F_, V, generator=g) * 2, -1)
        logp = -torch.rand(B, F_, K, generator=g).mul(3).sort(-1).values  # descending, <= 0
        tok = torch.randint(0, V, (B, F_, K), generator=g)
        out.append((logp, tok, q))
    return out


def build(steps, root_pos, with_q=True):
    logp, tok, q = steps[0]
    st = tree_start(logp[:, 0], tok[:, 0], root_pos, q[:, 0] if with_q else None)
    states = [st]
    for logp, tok, q in steps[1:]:
        st = tree_step(st, logp, tok, q if with_q else None)
        states.append(st)
    return states


def reference_tree(steps, b, K, N):
    """EAGLE-2 in plain Python for request b: returns dict of lists, plus the per-step frontiers."""
    f32 = np.float32
    cands = []  # (token, parent cand, score, depth)
    logp, tok, _ = steps[0]
    for r in range(K):
        cands.append((int(tok[b, 0, r]), -1, f32(logp[b, 0, r]), 1))
    frontier, anc, fparent = list(range(K)), [[r] for r in range(K)], [0] * K
    expanded, qsrc = [-1], [(0, 0)]  # qsrc: (step, row) of each expanded node's q row
    hist = [(list(frontier), [a[:] for a in anc], list(fparent))]
    for s, (logp, tok, _) in enumerate(steps[1:], start=1):
        new = []
        for row, f in enumerate(frontier):
            for j in range(K):
                new.append((int(tok[b, row, j]), f, f32(cands[f][2] + f32(logp[b, row, j])), cands[f][3] + 1))
        off = len(cands)
        cands += new
        expanded += frontier
        qsrc += [(s, row) for row in range(K)]
        best = sorted(range(len(new)), key=lambda i: (-new[i][2], i))[:K]
        anc = [anc[i // K] + [rank] for rank, i in enumerate(best)]
        fparent = [i // K for i in best]
        frontier = [off + i for i in best]
        hist.append((list(frontier), [a[:] for a in anc], list(fparent)))
    keep = sorted(sorted(range(len(cands)), key=lambda c: (-cands[c][2], c))[:N])
    node = {c: i + 1 for i, c in enumerate(keep)}
    out = {"parents": [-1] + [0 if cands[c][1] < 0 else node[cands[c][1]] for c in keep],
           "tokens": [None] + [cands[c][0] for c in keep],
           "depth": [0] + [cands[c][3] for c in keep],
           "logp": [0.0] + [float(cands[c][2]) for c in keep],
           "slot": [-1] + [expanded.index(c) - 1 if c in expanded else -1 for c in keep],
           "qsrc": [qsrc[0]] + [qsrc[expanded.index(c)] if c in expanded else None for c in keep]}
    return out, hist


@pytest.mark.parametrize("K,S,N", [(1, 4, 4), (2, 1, 2), (2, 2, 5), (2, 3, 6), (3, 3, 10), (3, 2, 12),
                                   (2, 4, 10), (4, 3, 9)])
def test_construction_matches_brute_force(K, S, N):
    g = torch.Generator().manual_seed(100 * K + 10 * S + N)
    B, V = 5, 11
    steps = random_steps(B, K, S, V, g)
    root_pos = torch.randint(0, 50, (B,), generator=g)
    states = build(steps, root_pos)
    tree = select_tree(states[-1], torch.arange(B), N)
    assert tree.tokens.shape == (B, N + 1) and tree.draft_probs.shape == (B, N + 1, V)
    for b in range(B):
        ref, hist = reference_tree(steps, b, K, N)
        assert tree.parents[b].tolist() == ref["parents"]
        assert tree.tokens[b, 1:].tolist() == ref["tokens"][1:] and tree.tokens[b, 0] == b
        assert tree.depth[b].tolist() == ref["depth"]
        assert tree.draft_slot[b].tolist() == ref["slot"]
        torch.testing.assert_close(tree.logp[b], torch.tensor(ref["logp"]), rtol=0, atol=0)
        for i, src in enumerate(ref["qsrc"]):
            want = torch.zeros(V) if src is None else steps[src[0]][2][b, src[1]]
            assert torch.equal(tree.draft_probs[b, i], want)
        for s, st in enumerate(states):
            frontier, anc, fparent = hist[s]
            assert st.frontier[b].tolist() == frontier and st.frontier_anc[b].tolist() == anc
            assert st.frontier_parent[b].tolist() == fparent
            assert st.frontier_tokens[b].tolist() == [st.tokens[b, f].item() for f in frontier]
            assert (st.positions[b] == root_pos[b] + s + 1).all()


@pytest.mark.parametrize("fill", [0.0, float("-inf")])
def test_ties_keep_ancestors_closed(fill):
    """Probability-1 children (log q = 0) tie with their parent; -inf ties with -inf: parents still first."""
    K, S, N, B = 2, 4, 7, 3
    g = torch.Generator().manual_seed(0)
    steps = random_steps(B, K, S, 5, g)
    steps = [(torch.full_like(lp, fill).index_fill(-1, torch.tensor([0]), 0.0) if i else lp, t, q)
             for i, (lp, t, q) in enumerate(steps)]
    tree = select_tree(build(steps, torch.zeros(B, dtype=torch.long))[-1], torch.zeros(B, dtype=torch.long), N)
    par = tree.parents[:, 1:]
    assert ((par >= 0) & (par < torch.arange(1, N + 1))).all()
    assert (tree.depth[:, 1:] == tree.depth.gather(1, par) + 1).all()


def test_draw_children():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(64, 9, generator=torch.Generator().manual_seed(1)), -1)
    _, tok = draw_children(probs, 1, sampled=True, generator=g1)
    assert torch.equal(tok[:, 0], sample(probs, g2))  # topk 1 sampling is the chain's sampler
    logp, tok = draw_children(probs, 3, sampled=False)
    assert torch.equal(tok, probs.topk(3).indices) and torch.allclose(logp, probs.topk(3).values.log())
    _, tok = draw_children(probs, 4, sampled=True, generator=g1)
    assert (tok.sort(-1).values.diff(dim=-1) > 0).all()  # without replacement: distinct


# ---------------------------------------------------------------------------------------------------------
# masks and verify inputs


def random_parents(B, T, g):
    return torch.stack([torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, T)])
                        for _ in range(B)])


def dense_ancestors(par):
    T = len(par)
    m = [[False] * T for _ in range(T)]
    for i in range(T):
        j = i
        while j >= 0:
            m[i][j] = True
            j = par[j]
    return m


@pytest.mark.parametrize("T", [1, 2, 5, 9, 17])
def test_ancestor_mask_matches_dense_reference(T):
    g = torch.Generator().manual_seed(T)
    par = random_parents(4, T, g)
    mask = ancestor_mask(par, T - 1)
    for b in range(4):
        assert mask[b].tolist() == dense_ancestors(par[b].tolist())


def test_verify_inputs_and_flat_mask_of_a_built_tree():
    g = torch.Generator().manual_seed(7)
    B, K, S, N = 3, 3, 3, 9
    root_pos = torch.tensor([0, 5, 17])
    tree = select_tree(build(random_steps(B, K, S, 13, g), root_pos)[-1], torch.tensor([4, 5, 6]), N)
    ids, pos = verify_inputs(tree, root_pos)
    assert torch.equal(ids, tree.tokens) and torch.equal(pos, root_pos[:, None] + tree.depth)
    m = verify_mask(tree)
    flat = flatten_custom_mask(m, root_pos.tolist())
    ref = []
    for b in range(B):
        anc = dense_ancestors(tree.parents[b].tolist())
        block = [[True] * int(root_pos[b]) + anc[i] for i in range(N + 1)]
        ref += [x for row in block for x in row]
    assert flat.tolist() == ref
    bits = mask_bits(m)
    unpacked = (bits[..., None] >> torch.arange(N + 1)) & 1
    assert torch.equal(unpacked.bool(), m)


def test_mask_bits_uses_all_64_columns():
    m = torch.zeros(1, 2, 64, dtype=torch.bool)
    m[0, 0, 63] = m[0, 1, 0] = True
    bits = mask_bits(m)
    assert bits.tolist() == [[-(2 ** 63), 1]]
    with pytest.raises(ValueError):
        mask_bits(torch.zeros(1, 1, 65, dtype=torch.bool))


def test_draft_step_mask_is_each_branch_ancestors():
    g = torch.Generator().manual_seed(11)
    B, K, S = 4, 3, 4
    states = build(random_steps(B, K, S, 7, g), torch.zeros(B, dtype=torch.long))
    for st in states[:-1]:
        m = draft_step_mask(st)
        padded = draft_step_mask(st, width=(S - 1) * K)
        assert torch.equal(padded[..., :m.shape[-1]], m) and not padded[..., m.shape[-1]:].any()
        # slot (d-1)*K + r holds the depth-d frontier node of rank r; walk the real candidate parents
        for b in range(B):
            slot_of = {}
            for d, sd in enumerate(states[:st.step]):
                for r, c in enumerate(sd.frontier[b].tolist()):
                    slot_of[c] = d * K + r
            for i, c in enumerate(st.frontier[b].tolist()):
                want = set()
                while c >= 0:
                    want.add(slot_of[c])
                    c = st.parents[b, c].item()
                assert set(torch.nonzero(m[b, i]).flatten().tolist()) == want


# ---------------------------------------------------------------------------------------------------------
# greedy walk


def brute_greedy(tokens, parents, logits):
    cur, path = 0, [0]
    while True:
        top = int(np.argmax(logits[cur]))
        kids = [i for i in range(len(parents)) if parents[i] == cur and tokens[i] == top]
        if not kids:
            return len(path) - 1, path, top
        cur = kids[0]
        path.append(cur)


@pytest.mark.parametrize("K,S,N", [(2, 3, 6), (3, 3, 12), (2, 4, 14), (3, 1, 3)])
def test_greedy_walk_matches_brute_force(K, S, N):
    g = torch.Generator().manual_seed(K * S * N)
    B, V = 64, 3  # a tiny vocabulary: duplicate siblings and long accepted paths both occur
    tree = select_tree(build(random_steps(B, K, S, V, g), torch.zeros(B, dtype=torch.long))[-1],
                       torch.zeros(B, dtype=torch.long), N)
    logits = torch.randn(B, N + 1, V, generator=g)
    n, path, nxt = tree_greedy_accept(tree, logits)
    for b in range(B):
        rn, rpath, rnext = brute_greedy(tree.tokens[b].tolist(), tree.parents[b].tolist(), logits[b].numpy())
        assert n[b] == rn and path[b, :rn + 1].tolist() == rpath and (path[b, rn + 1:] == -1).all()
        assert nxt[b] == rnext
    assert n.max() >= min(2, S)  # the test walks deep paths too
    em = emitted_tokens(tree, path, n, nxt)
    for b in range(B):
        k = int(n[b])
        assert em[b, :k].tolist() == tree.tokens[b, path[b, 1:k + 1]].tolist() and em[b, k] == nxt[b]


# ---------------------------------------------------------------------------------------------------------
# topk = 1 is the chain


def test_children_table():
    par = torch.tensor([[-1, 0, 0, 1, 0, 3]])
    assert children_table(par, 3).tolist() == [[[1, 2, 4], [3, -1, -1], [-1] * 3, [5, -1, -1], [-1] * 3, [-1] * 3]]


@pytest.mark.parametrize("seed", range(4))
def test_chain_greedy_equals_greedy_accept(seed):
    g = torch.Generator().manual_seed(seed)
    B, k, V = 32, 5, 3
    draft = torch.randint(0, V, (B, k), generator=g)
    logits = torch.randn(B, k + 1, V, generator=g)
    n, path, nxt = tree_greedy_accept(chain_tree(torch.zeros(B, dtype=torch.long), draft), logits)
    rn, rnext = greedy_accept(draft, logits)
    assert torch.equal(n, rn) and torch.equal(nxt, rnext)
    assert torch.equal(path[:, 1:], torch.where(torch.arange(1, k + 1) <= n[:, None], torch.arange(1, k + 1), -1))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("proposal", ["without_replacement", "onehot"])
def test_chain_sampling_equals_rejection_accept(seed, proposal):
    """Same generator state in, same tokens out (bit for bit): the tree rule is the chain rule at topk 1."""
    g = torch.Generator().manual_seed(seed)
    B, k, V = 256, 4, 6
    q = torch.softmax(torch.randn(B, k, V, generator=g), -1)
    p = torch.softmax(torch.randn(B, k + 1, V, generator=g), -1)
    p[: B // 4, :k] = torch.cat([q[: B // 4]], 0)  # some rows with p == q: everything accepted
    draft = sample(q, g)
    tree = chain_tree(torch.zeros(B, dtype=torch.long), draft, q)
    qq = q if proposal == "without_replacement" else torch.nn.functional.one_hot(draft, V).float()
    g1, g2 = torch.Generator().manual_seed(seed + 50), torch.Generator().manual_seed(seed + 50)
    n, path, nxt = tree_rejection_accept(tree, p, g1, proposal)
    rn, rnext = rejection_accept(draft, qq, p, g2)
    assert torch.equal(n, rn) and torch.equal(nxt, rnext)
    assert torch.equal(path, torch.where(torch.arange(k + 1) <= n[:, None], torch.arange(k + 1), -1))
    assert (n == 0).any() and (n >= 2).any() and (proposal == "onehot" or (n == k).any())


def test_tree_sampling_accepts_everything_when_p_equals_q():
    g = torch.Generator().manual_seed(0)
    B, K, S, V = 16, 2, 3, 8
    q0 = torch.softmax(torch.randn(B, V, generator=g), -1)
    st = tree_start(*draw_children(q0, K, True, g), torch.zeros(B, dtype=torch.long), q0)
    for _ in range(S - 1):
        qs = torch.softmax(torch.randn(B, K, V, generator=g), -1)
        st = tree_step(st, *draw_children(qs, K, True, g), qs)
    tree = select_tree(st, torch.zeros(B, dtype=torch.long), max_tree_nodes(K, S))
    # the target equals the draft wherever the draft has a row; elsewhere anything
    p = torch.where(tree.draft_probs.sum(-1, keepdim=True) > 0, tree.draft_probs, 1.0 / V)
    n, path, _ = tree_rejection_accept(tree, p, g, "without_replacement")
    ch = children_table(tree.parents, K)
    for b in range(B):  # every step takes the first child; the walk ends at a node without children
        for j in range(1, int(n[b]) + 1):
            assert path[b, j] == ch[b, path[b, j - 1], 0]
        assert (ch[b, path[b, n[b]]] == -1).all()
    assert (n >= 2).all()


# ---------------------------------------------------------------------------------------------------------
# rollback: compaction moves at page sizes 1, 3, 16


def _page_tables(alloc, reqs, P):
    return torch.tensor([alloc.page_tables[r] + [0] * (P - len(alloc.page_tables[r])) for r in reqs])


def _apply(flat, src, dst, scratch):
    """What the pool does: -1 goes to the scratch slot; all reads before all writes."""
    s = torch.where(src < 0, scratch, src).reshape(-1)
    d = torch.where(dst < 0, scratch, dst).reshape(-1)
    flat[d] = flat[s]


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("K,S,N", [(2, 3, 6), (3, 3, 10), (1, 4, 4)])
def test_compaction_moves_and_no_page_leak(page_size, K, S, N):
    g = torch.Generator().manual_seed(page_size * 7 + K)
    B, V = 8, 50
    root_pos = torch.randint(0, 40, (B,), generator=g)
    tree = select_tree(build(random_steps(B, K, S, V, g), root_pos)[-1], torch.zeros(B, dtype=torch.long), N)
    logits = torch.randn(B, N + 1, V, generator=g)
    for b in range(B):  # the target agrees with the path to a random node (the root for some requests)
        i = int(torch.randint(0, N + 1, (1,), generator=g))
        while i > 0:
            logits[b, tree.parents[b, i], tree.tokens[b, i]] = 10.0
            i = int(tree.parents[b, i])
    n, path, _ = tree_greedy_accept(tree, logits)
    assert n.max() >= min(2, S)
    reqs = list(range(B))
    for side in ("target", "draft"):
        total = int(root_pos.max()) + N + (S - 1) * K + 2
        alloc = PageAllocator(num_pages=B * pages_needed(total, page_size) + 1, page_size=page_size)
        used = root_pos + 1 + (N if side == "target" else (S - 1) * K)  # tree storage after the root
        for step in range(1, int(used.max()) + 1):  # grow in turns: interleaved, non-contiguous page tables
            for r in reqs:
                if step <= used[r]:
                    alloc.allocate(r, step)
        P = max(len(t) for t in alloc.page_tables.values())
        table = _page_tables(alloc, reqs, P)
        scratch = alloc.num_pages * page_size
        flat = torch.full((scratch + 1,), -7)
        label = {}  # position -> what it holds: prefix p, tree node 1000 + i / draft slot 2000 + s
        for r in reqs:
            rp = int(root_pos[r])
            for pos in range(int(used[r])):
                if side == "target":
                    lab = pos if pos < rp else 1000 + pos - rp
                else:
                    lab = pos if pos <= rp else 2000 + pos - rp - 1
                flat[alloc.slot(r, pos)] = lab
                label[r, pos] = lab
        if side == "target":
            src, dst, keep = target_compaction(path, n, root_pos, table, page_size)
        else:
            src, dst, keep = draft_compaction(tree, path, n, root_pos, table, page_size)
        assert (src >= 0).any() == (K > 1)  # trees move KV; a chain is already in place
        _apply(flat, src, dst, scratch)
        for r in reqs:
            rp, a = int(root_pos[r]), int(n[r])
            fed = [j for j in range(1, a + 1) if tree.draft_slot[r, path[r, j]] >= 0]
            want_keep = rp + 1 + (a if side == "target" else len(fed))
            assert keep[r] == want_keep
            for pos in range(want_keep):
                j = pos - rp
                if j <= 0:
                    want = label[r, pos]  # the prefix and the root stay
                elif side == "target":
                    want = 1000 + int(path[r, j])
                else:
                    want = 2000 + int(tree.draft_slot[r, path[r, j]])
                assert flat[alloc.slot(r, pos)] == want, (side, r, pos)
            before = alloc.num_used
            alloc.truncate(r, want_keep)
            assert before - alloc.num_used == pages_needed(int(used[r]), page_size) - pages_needed(want_keep, page_size)
        assert alloc.num_used == sum(pages_needed(int(k), page_size) for k in keep)
        for r in reqs:
            alloc.free(r)
        assert alloc.num_free == alloc.num_pages  # no page leaked


def test_chain_compaction_is_the_chain_rollback():
    """topk 1: no move on either side, and the lengths the chain decoder truncates to."""
    B, k = 4, 5
    root_pos = torch.tensor([3, 0, 9, 20])
    tree = chain_tree(torch.zeros(B, dtype=torch.long), torch.zeros(B, k, dtype=torch.long))
    n = torch.tensor([0, 2, 4, 5])
    path = torch.where(torch.arange(k + 1) <= n[:, None], torch.arange(k + 1), -1)
    table = torch.arange(40).expand(B, 40)
    src, dst, keep = target_compaction(path, n, root_pos, table, 3)
    assert (src == -1).all() and (dst == -1).all() and torch.equal(keep, root_pos + 1 + n)  # n_before + a
    src, dst, keep = draft_compaction(tree, path, n, root_pos, table, 3)
    # ModelDrafter.commit: min(kv_len, n_before + a), the draft KV holding n_before + k - 1 tokens
    assert (src == -1).all() and torch.equal(keep, root_pos + 1 + n.clamp_max(k - 1))


# ---------------------------------------------------------------------------------------------------------
# config: spec.num_steps


def _validate(*overrides):
    from hydra import compose, initialize_config_dir

    from attnlab.cli import CONF_DIR
    from attnlab.config import validate

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return validate(compose("config", overrides=["device=cpu", *overrides]))


@pytest.mark.parametrize("overrides,needle", [
    (["spec.topk=2"], "spec.num_steps=null"),
    (["spec.topk=2", "spec.num_steps=2", "spec.num_draft_tokens=7"], "spec.num_draft_tokens=7 > 6"),
    (["spec.num_steps=2"], "spec.num_draft_tokens=4 > 2"),
    (["draft=ngram", "spec.topk=2", "spec.num_steps=2"], "draft=ngram drafts chains only"),
])
def test_config_refuses_impossible_tree_shapes(overrides, needle):
    with pytest.raises(ConfigError) as e:
        _validate(*overrides)
    assert needle in str(e.value)


def test_fa_refuses_tree_masks_at_config_time():
    """fa has no custom mask (and no cascade here): check_backend names the mask, on a GPU as on CPU."""
    from attnlab.backends.registry import get_backend_class

    caps = get_backend_class("fa").capabilities()
    assert "custom (tree) masks (spec.topk > 1)" in caps.problems(
        device="cuda", dtype="bf16", kv_dtype="bf16", head_dim=64, page_size=16, max_context=256, custom_mask=True)
    assert not any("custom" in p for p in caps.problems(
        device="cuda", dtype="bf16", kv_dtype="bf16", head_dim=64, page_size=16, max_context=256))


def test_config_accepts_tree_shapes():
    _validate("draft=self", "spec.topk=2", "spec.num_steps=3", "spec.num_draft_tokens=8")
    _validate("draft=eagle", "spec.topk=4", "spec.num_steps=3", "spec.num_draft_tokens=8")
    _validate("spec.num_steps=4")  # the chain, spelled out
    _validate("draft=none", "spec.topk=2")  # target-only decoding drafts no tree
