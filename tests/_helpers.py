"""Helpers shared by the gymnasium algorithm tests."""

import torch


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    """Every parameter and buffer of ``module`` in one flat vector, to compare two runs exactly."""
    return torch.cat([p.detach().flatten() for p in module.state_dict().values()])
