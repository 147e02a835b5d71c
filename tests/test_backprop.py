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
    assert torch.equal(outs[-1], out.detach())  # the same kernels: the same numbers
    (out * g).sum().backward()  # dL/d(out) = g
    want = [p.grad.clone() for p in net.parameters()]
    for p in net.parameters():
        p.grad = torch.full_like(p, 0.5)  # backward adds into .grad, as loss.backward() does
    backprop.backward(net, outs, g)
    for p, w in zip(net.parameters(), want, strict=True):
        torch.testing.assert_close(p.grad, w + 0.5)
        assert w.abs().max() > 0


def test_unknown_layers_name_the_problem():
    net = nn.Sequential(nn.Linear(2, 2), nn.Sigmoid(), nn.Linear(2, 1))
    with pytest.raises(TypeError, match="not Sigmoid"):
        backprop.forward(net, torch.zeros(1, 2))
    outs = [torch.zeros(1, 2)] * 4
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    with pytest.raises(TypeError, match="not Sigmoid"):
        backprop.backward(net, outs, torch.zeros(1, 1))
