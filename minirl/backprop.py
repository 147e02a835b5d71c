"""Backpropagation by hand through the policies' MLPs (``PPOConfig(hand_grad=True)``, ``minirl.algos.ppo``).

Autograd records every operation of the forward pass and replays it backwards; for a 64-64 MLP on 256 rows that
bookkeeping costs more than the arithmetic. Written out, the chain rule of an MLP is a few lines per layer. For a
linear layer u = a W^T + b, with a (B, in), W (out, in) and the upstream gradient g = dL/du (B, out):

    dL/dW = g^T a     (out, in)
    dL/db = sum_B g   (out,)
    dL/da = g W       (B, in)

and through an activation h = tanh(u): dL/du = dL/dh * (1 - h^2); through h = relu(u): dL/du = dL/dh * [h > 0].

``forward`` runs the network's layers (the same function: the linear layers with the kernel ``nn.Linear`` calls,
tanh within two units in the last place, see ``tanh``) and keeps each one's output; ``backward`` adds the gradients
into the parameters' ``.grad``, as ``loss.backward()`` would. ``tests/test_backprop.py`` checks both against autograd.
"""

import numpy as np
import torch
from torch import nn


def tanh(u: torch.Tensor) -> torch.Tensor:
    """tanh(u), by NumPy's kernel when ``u`` is on the CPU.

    Why: on the benchmarks' AMD EPYC ``torch.tanh`` takes about 43 us for a 256 x 64 minibatch and ``np.tanh``
    (NumPy's vectorised float32 tanh) about 6 us, four times per PPO minibatch. The two agree within one unit in
    the last place on CPUs with AVX2 or AVX-512, two without (``tests/test_backprop.py`` checks), and
    ``rollout.NumpyActor`` acts with ``np.tanh`` too. The result shares NumPy's array, no copy."""
    if u.device.type != "cpu":
        return torch.tanh(u)
    return torch.from_numpy(np.tanh(u.numpy()))


@torch.no_grad()
def forward(net: nn.Sequential, x: torch.Tensor) -> list[torch.Tensor]:
    """[x, out_1, ..., out_L]: the input and every module's output, (B, width) each; the last is ``net(x)`` within
    rounding (exactly, without tanh layers).

    The kernels are called directly (``addmm`` is what ``nn.Linear`` runs): a module call costs a few microseconds
    of its own, a tenth of this function's time on a 64-64 MLP."""
    outs = [x]
    for module in net:
        a = outs[-1]
        if isinstance(module, nn.Linear):
            outs.append(torch.addmm(module.bias, a, module.weight.t()))  # a W^T + b
        elif isinstance(module, nn.Tanh):
            outs.append(tanh(a))
        elif isinstance(module, nn.ReLU):
            outs.append(torch.relu(a))
        else:
            raise TypeError(f"forward knows Linear, Tanh and ReLU layers, not {type(module).__name__}")
    return outs


@torch.no_grad()
def backward(net: nn.Sequential, outs: list[torch.Tensor], g: torch.Tensor) -> None:
    """Add dL/dW and dL/db of every linear layer of ``net`` into its ``.grad``, given ``outs`` from ``forward`` and
    g = dL/d(net's output), (B, out). The gradients must exist (zero them first, as before ``loss.backward()``).

    g^T a for the first layer (64 x 256 times 256 x 4 for CartPole) takes 21 us on the benchmarks' AMD EPYC,
    its transpose a^T g (4 x 64) 5 us: matrix products whose result has few columns run a slow kernel there. The same
    numbers within rounding: the order of the sums differs."""
    for i in range(len(net) - 1, -1, -1):
        module, a_in, a_out = net[i], outs[i], outs[i + 1]
        if isinstance(module, nn.Linear):
            if a_in.shape[1] < g.shape[1]:  # a narrow input (the observation): the wide way round (docstring)
                module.weight.grad.add_((a_in.t() @ g).t())  # += (a^T g)^T = g^T a
            else:
                module.weight.grad.addmm_(g.t(), a_in)  # += g^T a
            module.bias.grad.add_(g.sum(0))
            if i > 0:  # the input's gradient, unless the input is the observation
                g = g @ module.weight  # (B, in)
        elif isinstance(module, nn.Tanh):
            g = torch.ops.aten.tanh_backward(g, a_out)  # g * (1 - h^2) in one call
        elif isinstance(module, nn.ReLU):
            g = g * (a_out > 0)
        else:
            raise TypeError(f"backward knows Linear, Tanh and ReLU layers, not {type(module).__name__}")
