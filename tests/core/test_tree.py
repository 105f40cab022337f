"""IB-TPO tree math (rlvr.core.tree): hand-computed toy tree, closed-form mutual information, value
unbiasedness under selective branching, estimator properties, weights and Eff-Rate (docs/ib_tpo.md §7)."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.core import tree as T

# the spec's §7.4 fixture: q → u; u → {a, b}; a → leaves (1, 1); b → {b1 = leaf 0, b2 → leaves (1, 0)}
#          q  u  a  b  a1 a2 b1 b2 b21 b22
PARENT = [-1, 0, 1, 1, 2, 2, 3, 3, 7, 7]
R = torch.tensor([0, 0, 0, 0, 1, 1, 0, 0, 1, 0], dtype=torch.float64)
Q, U_, A_, B_, A1, A2, B1, B2, B21, B22 = range(10)


def h(x):
    return -x * math.log(x) - (1 - x) * math.log(1 - x)


def kl(p, q, eps=1e-6):
    p, q = min(max(p, eps), 1 - eps), min(max(q, eps), 1 - eps)
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


def toy(surprisal=None, **kw):
    V = T.node_values(PARENT, R)
    s = torch.zeros(10, dtype=torch.float64) if surprisal is None else surprisal
    st = T.ib_statistics(PARENT, V, s, beta=kw.pop("ib_beta", 1.0), ib_form=kw.get("ib_form", "h_plus_beta_i"))
    return V, st, T.tree_advantages(PARENT, V, s, st, R, **kw)


def test_toy_tree_values_and_advantages_match_the_spec_table():
    V, st, adv = toy(ib_lambda=0.0, adv_scale="none")
    assert V[[A_, B2, B_, U_, Q]].tolist() == [1.0, 0.5, 0.25, 0.625, 0.625]
    assert adv.A_GL[A_] == pytest.approx(0.375) and adv.A_loc[A_] == pytest.approx(0.375)
    assert adv.A_GL[B_] == pytest.approx(-0.375) and adv.A_loc[B_] == pytest.approx(-0.375)
    assert adv.A_loc[B1] == pytest.approx(-0.25) and adv.A_loc[B2] == pytest.approx(0.25)
    assert adv.A_loc[B21] == pytest.approx(0.5) and adv.A_loc[B22] == pytest.approx(-0.5)
    assert adv.A_loc[U_] == 0.0 and adv.A_GL[U_] == 0.0  # u is q's only child and V(u) = V(q)
    assert float(st.I[U_]) == pytest.approx(0.5 * (kl(1.0, 0.625) + kl(0.25, 0.625)), rel=1e-12)
    assert float(st.I[A_]) == 0.0 and float(st.I[Q]) == 0.0  # equal children / K = 1
    # λ = 0, no scaling: A = A_GL + A_loc
    assert adv.A[A_] == pytest.approx(0.75) and adv.A[B21] == pytest.approx((1 - 0.625) + 0.5)


def test_leaf_advantage_is_global_plus_local_over_leaf_std():
    V, st, adv = toy(ib_lambda=0.0)
    leaves = R[[A1, A2, B1, B21, B22]]
    D = float(leaves.std(unbiased=True)) + 1e-6
    for s in (A_, B_, B1, B2, B21, B22):
        want = ((V[s] - V[Q]) + (V[s] - V[PARENT[s]])) / D
        assert float(adv.A[s]) == pytest.approx(float(want), rel=1e-12)
    assert adv.scale == pytest.approx(D)


@pytest.mark.parametrize("ib_form", ["h_plus_beta_i", "i_minus_beta_h"])
@pytest.mark.parametrize("gate", [True, False])
def test_sibling_sets_sum_to_zero(ib_form, gate):
    s = torch.tensor([0, 0.7, 0.3, 1.9, 0.2, 0.9, 1.4, 0.5, 2.0, 0.1], dtype=torch.float64)
    V, st, adv = toy(s, ib_lambda=0.3, ib_form=ib_form, ib_gate=gate, adv_scale="none")
    kids = T.tree_children(PARENT)
    for p, c in enumerate(kids):
        if len(c) >= 2:
            assert float(adv.A_loc[c].sum()) == pytest.approx(0.0, abs=1e-12)
            assert float(adv.A_reg[c].sum()) == pytest.approx(0.0, abs=1e-12)
    # the gate switches A_reg off under a whose children agree (both 1), on under u, b, b2
    assert bool(adv.gate[A1]) is (not gate)
    assert bool(adv.gate[A_]) and bool(adv.gate[B21])
    # hand value of A_reg(a) for h_plus_beta_i: [ĥ(a) − Ĥ(u)] + β[κ(a) − Î(u)]
    if ib_form == "h_plus_beta_i":
        want = (0.3 - (0.3 + 1.9) / 2) + (kl(1.0, 0.625) - float(st.I[U_]))
        assert float(adv.A_reg[A_]) == pytest.approx(want, rel=1e-10)


def test_constant_rewards_give_exactly_zero_advantages_with_the_gate():
    r = torch.tensor([0, 0, 0, 0, 1, 1, 1, 0, 1, 1], dtype=torch.float64)  # every leaf 1
    s = torch.rand(10, dtype=torch.float64) * 3
    V = T.node_values(PARENT, r)
    assert V.tolist() == [1.0] * 10
    st = T.ib_statistics(PARENT, V, s)
    on = T.tree_advantages(PARENT, V, s, st, r, ib_lambda=0.1, ib_gate=True)
    assert on.A.abs().max() == 0 and on.A_GL.abs().max() == 0 and on.A_loc.abs().max() == 0
    off = T.tree_advantages(PARENT, V, s, st, r, ib_lambda=0.1, ib_gate=False)
    assert off.A.abs().max() > 0  # ungated entropy part: the destabilising regulariser the gate removes
    assert off.scale == 1.0  # D = 1 for zero-variance trees
    partial = torch.full((10,), 0.05, dtype=torch.float64)  # partial credit shared by all leaves
    V2 = T.node_values(PARENT, partial)
    assert V2.tolist() == [0.05] * 10
    assert T.tree_advantages(PARENT, V2, s, T.ib_statistics(PARENT, V2, s), partial).A.abs().max() == 0


def test_value_only_drops_the_ib_term_and_i_over_h_requires_it():
    s = torch.rand(10, dtype=torch.float64)
    _, _, vo = toy(s, ib_lambda=0.5, ib_local="value_only")
    _, _, lam0 = toy(s, ib_lambda=0.0)
    assert torch.equal(vo.A, lam0.A) and vo.A_reg.abs().max() == 0
    with pytest.raises(ValueError, match="i_over_h"):
        toy(s, ib_form="i_over_h", ib_local="full")
    _, st, _ = toy(s, ib_form="i_over_h", ib_local="value_only")
    assert float(st.IB[U_]) == pytest.approx(float(st.I[U_] / (st.H[U_] + 1e-6)))


def _closed_form(pi, p):
    V = sum(a * b for a, b in zip(pi, p))
    return V, h(V) - sum(a * h(b) for a, b in zip(pi, p)), -sum(a * math.log(a) for a in pi)


@pytest.mark.parametrize("pi,p", [((0.5, 0.5), (0.2, 0.9)), ((0.3, 0.7), (0.1, 0.6))])
def test_mutual_information_estimator_matches_closed_form(pi, p):
    """§7.2: K = R = 64, 800 trials, mean Î within 0.01 nats of I (vectorised; one trial also
    checked through ib_statistics on the explicit tree)."""
    g = torch.Generator().manual_seed(0)
    K = Rr = 64
    trials = 800
    V_true, I_true, _ = _closed_form(pi, p)
    kind = (torch.rand(trials, K, generator=g) >= pi[0]).long()  # [trials, K] child type
    pk = torch.tensor(p, dtype=torch.float64)[kind]
    Vc = torch.binomial(torch.full((trials, K), float(Rr), dtype=torch.float64), pk, generator=g) / Rr
    Vu = Vc.mean(1, keepdim=True)
    I_hat = T.bernoulli_kl(Vc, Vu).mean(1)  # [trials]
    assert float(I_hat.mean()) == pytest.approx(I_true, abs=0.01)
    assert float(Vu.mean()) == pytest.approx(V_true, abs=0.01)
    # the explicit tree for trial 0 gives the same Î through the public API
    parent, rewards = [-1], [0.0]
    for c in range(K):
        parent.append(0)
        rewards.append(0.0)
    leaves = torch.bernoulli(pk[0].repeat_interleave(4), generator=g)  # 4 leaves per child
    for c in range(K):
        for j in range(4):
            parent.append(1 + c)
            rewards.append(float(leaves[c * 4 + j]))
    r = torch.tensor(rewards, dtype=torch.float64)
    V = T.node_values(parent, r)
    st = T.ib_statistics(parent, V, torch.zeros(len(parent), dtype=torch.float64))
    Vc0 = V[1 : K + 1]
    assert float(st.I[0]) == pytest.approx(float(T.bernoulli_kl(Vc0, Vc0.mean()).mean()), rel=1e-9)


@pytest.mark.parametrize("K", [1, 2, 8])
def test_mean_surprisal_is_unbiased_for_step_entropy(K):
    pi = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    H_true = float(-(pi * pi.log()).sum())
    g = torch.Generator().manual_seed(K)
    trials = 4000
    draws = torch.multinomial(pi.float(), trials * K, replacement=True, generator=g).view(trials, K)
    # one-token steps: ĥ(c) = −log π(c); Ĥ(u) = mean over the K sampled children
    parent = [-1] + [0] * K
    first = T.ib_statistics(parent, torch.zeros(K + 1, dtype=torch.float64),
                            T.step_surprisal([[]] + [[float(pi[d].log())] for d in draws[0]]))
    assert float(first.H[0]) == pytest.approx(float(-pi[draws[0]].log().mean()))
    est = -pi[draws].log().mean(1)
    se = float(est.std()) / math.sqrt(trials)
    assert abs(float(est.mean()) - H_true) < 4 * se


def test_mi_properties_zero_cases_and_ln2_bound():
    g = torch.Generator().manual_seed(3)
    for _ in range(200):
        n = int(torch.randint(2, 14, (1,), generator=g))
        parent = [-1] + [int(torch.randint(0, u, (1,), generator=g)) for u in range(1, n)]
        r = torch.randint(0, 2, (n,), generator=g).double()
        V = T.node_values(parent, r)
        st = T.ib_statistics(parent, V, torch.rand(n, generator=g, dtype=torch.float64))
        assert bool((st.I >= 0).all()) and bool((st.I <= math.log(2) + 1e-12).all())
        assert bool((st.H >= 0).all())
        kids = T.tree_children(parent)
        for u, c in enumerate(kids):
            if len(c) <= 1 or len(set(V[c].tolist())) == 1:
                assert float(st.I[u]) == 0.0
    # the bound is reached: two children, values 0 and 1
    st = T.ib_statistics([-1, 0, 0], torch.tensor([0.5, 0.0, 1.0]), torch.zeros(3))
    assert float(st.I[0]) == pytest.approx(math.log(2), abs=1e-4)


def test_recursive_value_is_unbiased_under_selective_branching():
    """§7.3: K = 4 children, 2 leaves each, 6 extra leaves under every child of type 2."""
    pi, p = (0.3, 0.7), (0.1, 0.6)
    V_true = pi[0] * p[0] + pi[1] * p[1]
    g = torch.Generator().manual_seed(1)
    rec, flat, trials = [], [], 1500
    for _ in range(trials):
        parent, r = [-1], [0.0]
        kinds = (torch.rand(4, generator=g) >= pi[0]).long().tolist()
        for c, k in enumerate(kinds):
            parent.append(0)
            r.append(0.0)
        for c, k in enumerate(kinds):
            for _j in range(2 + (6 if k == 1 else 0)):
                parent.append(1 + c)
                r.append(float(torch.rand(1, generator=g) < p[k]))
        rt = torch.tensor(r, dtype=torch.float64)
        rec.append(float(T.node_values(parent, rt)[0]))
        flat.append(float(T.node_values(parent, rt, value_est="leaf_mean")[0]))
    rec_t, flat_t = torch.tensor(rec), torch.tensor(flat)
    se = float(rec_t.std()) / math.sqrt(trials)
    assert abs(float(rec_t.mean()) - V_true) < 4 * se
    assert float(flat_t.mean()) - V_true > 0.05  # pulled toward p_2 = 0.6 by the extra leaves


def test_prefix_weights_counts_and_paths():
    paths = T.root_to_leaf_paths(PARENT)
    assert paths == [[U_, A_, A1], [U_, A_, A2], [U_, B_, B1], [U_, B_, B2, B21], [U_, B_, B2, B22]]
    assert T.leaf_counts(PARENT).tolist() == [5, 5, 2, 3, 1, 1, 1, 2, 1, 1]
    w = T.path_node_weights(PARENT, paths, "sqrt")
    assert w[0] == pytest.approx([1 / math.sqrt(5), 1 / math.sqrt(2), 1.0])
    inv = T.path_node_weights(PARENT, paths, "inv")
    total: dict[int, float] = {}
    for path, row in zip(paths, inv):
        for s, x in zip(path, row):
            total[s] = total.get(s, 0.0) + x
    assert all(v == pytest.approx(1.0) for v in total.values())  # each node counted once in all
    dd = T.path_node_weights(PARENT, paths, "dedup")
    assert dd[0] == [1.0, 1.0, 1.0] and dd[1] == [0.0, 0.0, 1.0] and dd[4] == [0.0, 0.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="mode"):
        T.path_node_weights(PARENT, paths, "nope")


def test_branch_counts_eff_rates_surprisal_modes_and_errors():
    V, st, _ = toy(ib_lambda=0.0)
    assert st.K.tolist() == [1, 2, 2, 2, 0, 0, 0, 2, 0, 0]
    assert T.path_branch_counts(PARENT, st.K).tolist() == [0, 1, 2, 2, 2, 2, 2, 3, 3, 3]
    assert T.eff_rate_node(PARENT, V) == (3, 4)  # u, b, b2 informative; a's children agree
    assert T.eff_rate_prompt([torch.tensor([1.0, 1.0]), torch.tensor([0.0, 1.0])]) == 0.5
    lp = [[], [-1.0, -3.0, -2.0]]
    assert T.step_surprisal(lp).tolist() == [0.0, 2.0]
    assert T.step_surprisal(lp, mode="head_surprisal", head_tokens=2).tolist() == [0.0, 4.0]
    with pytest.raises(ValueError, match="parent"):
        T.node_values([0, 0], torch.zeros(2))
    with pytest.raises(ValueError, match="parents precede"):
        T.tree_children([-1, 2, 0])
    with pytest.raises(ValueError, match="non-finite"):
        T.node_values([-1, 0], torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="ib_form"):
        T.ib_statistics(PARENT, V, torch.zeros(10), ib_form="x")
