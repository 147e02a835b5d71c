"""minirl.backprop against autograd: the same outputs, the same gradients, on the policies' MLPs."""

import pytest
import torch
from torch import nn

from minirl import backprop
from minirl.policies import mlp


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_forward_and_backward_are_autograds(activation):
    torch.manual_seed(0)
    net = mlp([4, 16, 8, 3], out_gain=1.0, activation=activation)
    x, g = torch.randn(32, 4), torch.randn(32, 3)
    out = net(x)
    outs = backprop.forward(net, x)
    assert len(outs) == len(net) + 1
    if activation == "relu":
        assert torch.equal(outs[-1], out.detach())  # the same kernels: the same numbers
    else:  # NumPy's tanh: within rounding
        torch.testing.assert_close(outs[-1], out.detach(), rtol=1e-6, atol=1e-7)
    (out * g).sum().backward()  # dL/d(out) = g
    want = [p.grad.clone() for p in net.parameters()]
    for p in net.parameters():
        p.grad = torch.full_like(p, 0.5)  # backward adds into .grad, as loss.backward() does
    backprop.backward(net, outs, g)
    for p, w in zip(net.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, w + 0.5)
        assert w.abs().max() > 0


def test_tanh_is_torchs_within_two_ulps():
    u = torch.cat([torch.linspace(-12, 12, 1_000_001), torch.tensor([0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0])])
    got, want = backprop.tanh(u), torch.tanh(u)
    ulps = (got.view(torch.int32).long() - want.view(torch.int32).long()).abs()  # same sign: ulps apart
    assert ulps.max() <= 2  # numpy's own tolerance for float32 tanh: 1 on AVX2 and AVX-512 CPUs, 2 without
    assert torch.equal(got[-6:], want[-6:])  # 0, -0, tiny and saturated values exactly
    special = torch.tensor([float("nan"), float("inf"), float("-inf")])
    assert torch.equal(backprop.tanh(special)[1:], torch.tensor([1.0, -1.0])) and backprop.tanh(special)[0].isnan()
    x64 = torch.randn(100, dtype=torch.float64)
    assert backprop.tanh(x64).dtype == torch.float64
    torch.testing.assert_close(backprop.tanh(x64), torch.tanh(x64), rtol=1e-15, atol=0)


def test_unknown_layers_name_the_problem():
    net = nn.Sequential(nn.Linear(2, 2), nn.Sigmoid(), nn.Linear(2, 1))
    with pytest.raises(TypeError, match="not Sigmoid"):
        backprop.forward(net, torch.zeros(1, 2))
    outs = [torch.zeros(1, 2)] * 4
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    with pytest.raises(TypeError, match="not Sigmoid"):
        backprop.backward(net, outs, torch.zeros(1, 1))
