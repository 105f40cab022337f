"""grpo_core.md §7, acceptance §14.5.

Hand values: logp = [−1, −2, −0.5], ref_logp = [−1.5, −1, −0.5] → Δ = ref − logp = [−0.5, 1, 0]

    k1  = −Δ               = [0.5, −1, 0]
    k2  = Δ²/2             = [0.125, 0.5, 0]
    k3  = e^Δ − Δ − 1      = [e^−0.5 − 0.5, e − 2, 0] = [0.10653065971263342, 0.7182818284590451, 0]
    abs = |Δ|              = [0.5, 1, 0]

Gradients w.r.t. logp (dΔ/dlogp = −1):
    k1: 1 ;  k2: −Δ = logp − ref = [0.5, −1, 0] ;  k3: 1 − e^Δ = [0.3934693402873666, −1.718281828459045, 0]
    abs: −sign(Δ) = [1, −1, 0]
"""

import pytest
import torch

from rlvr.core import canonical_kl_estimator, kl_penalty

LOGP = [-1.0, -2.0, -0.5]
REF = [-1.5, -1.0, -0.5]

VALUES = {
    "k1": [0.5, -1.0, 0.0],
    "k2": [0.125, 0.5, 0.0],
    "k3": [0.10653065971263342, 0.7182818284590451, 0.0],
    "abs": [0.5, 1.0, 0.0],
}
GRADS = {
    "k1": [1.0, 1.0, 1.0],
    "k2": [0.5, -1.0, 0.0],
    "k3": [0.3934693402873666, -1.718281828459045, 0.0],
    "abs": [1.0, -1.0, 0.0],
}


def value_and_grad(est):
    logp = torch.tensor([LOGP], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([REF], dtype=torch.float64)
    kl = kl_penalty(logp, ref, est)
    (g,) = torch.autograd.grad(kl.sum(), logp)
    return kl.detach()[0].tolist(), g[0].tolist()


@pytest.mark.parametrize("est", ["k1", "k2", "k3", "abs"])
def test_values_and_gradients(est):
    v, g = value_and_grad(est)
    assert v == pytest.approx(VALUES[est], abs=1e-14)
    assert g == pytest.approx(GRADS[est], abs=1e-14)


@pytest.mark.parametrize("est", ["k1+", "k2+", "k3+", "abs+", "low_var_kl+", "kl+", "mse"])
def test_plus_straight_through_and_k2_gradient(est):
    base = canonical_kl_estimator(est).rstrip("+")
    v, g = value_and_grad(est)
    assert v == pytest.approx(VALUES[base], abs=1e-14)  # value of the named estimator (exactly)
    assert g == pytest.approx([0.5, -1.0, 0.0], abs=1e-14)  # = logp − ref_logp


def test_aliases_have_the_alias_values():
    for alias, name in (("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")):
        assert value_and_grad(alias) == value_and_grad(name)


def test_k3_clamped():
    # Δ = 15: e^15 − 16 ≫ 10 -> 10 ; Δ = 100 would overflow exp without the Δ clamp
    logp = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[15.0, 100.0, -100.0]], dtype=torch.float64)
    kl = kl_penalty(logp, ref, "k3")
    assert kl.detach().tolist() == [[10.0, 10.0, 10.0]]  # Δ=−100: e^−20 + 20 − 1 ≈ 19 -> clamped
    (g,) = torch.autograd.grad(kl.sum(), logp)
    assert torch.isfinite(g).all()


def test_canonical_names():
    assert canonical_kl_estimator("kl") == "k1"
    assert canonical_kl_estimator("mse") == "k2"
    assert canonical_kl_estimator("low_var_kl") == "k3"
    assert canonical_kl_estimator("low_var_kl+") == "k3+"
    assert canonical_kl_estimator("abs+") == "abs+"
    assert canonical_kl_estimator(" K3 ") == "k3"
    for bad in ("k4", "full", "k3++", "", "+", None):
        with pytest.raises(ValueError):
            canonical_kl_estimator(bad)


def test_shape_mismatch():
    with pytest.raises(ValueError):
        kl_penalty(torch.zeros(2, 3), torch.zeros(2, 2), "k3")
