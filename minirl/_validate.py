"""Input checks shared by the public functions: each error names the argument and the fix."""

import torch


def as_tensor(name: str, x, *, ndims: tuple[int, ...] | None = None, dtype: str = "float") -> torch.Tensor:
    """Return ``x`` as a tensor after checking its number of dimensions, its dtype kind and finiteness.

    ``dtype`` is ``"float"`` (floating point, all finite), ``"bool"`` (bool, or 0/1 numbers), or ``"any"``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}; wrap it with torch.as_tensor")
    if ndims is not None and x.dim() not in ndims:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got shape {tuple(x.shape)}")
    if dtype == "float":
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}; use {name}.float()")
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} contains NaN or inf; check the computation that produced it")
    elif dtype == "bool":
        if x.dtype != torch.bool:
            if x.is_complex() or not ((x == 0) | (x == 1)).all():
                raise ValueError(f"{name} must be boolean (or hold only 0 and 1), got values other than 0/1")
            x = x.bool()
    return x


def same_shape(**tensors: torch.Tensor) -> None:
    """Raise if the named tensors do not all share one shape."""
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shapes must match: {listed}")


def in_range(name: str, value: float, low: float, high: float) -> float:
    """Raise unless ``low <= value <= high``."""
    if not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


def one_of(name: str, value: str, allowed: tuple[str, ...]) -> str:
    """Raise unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value
