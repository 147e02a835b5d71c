"""Input checks shared by the public functions: each error names the argument and the fix."""

import contextlib
import contextvars
import dataclasses
import math
import types
import typing

import numpy as np
import torch

# True inside ``finite_checked()``: the caller has already checked every float it passes for NaN and inf
_FINITE_CHECKED = contextvars.ContextVar("finite_checked", default=False)


@contextlib.contextmanager
def finite_checked():
    """Inside the block, ``as_tensor`` skips its scan for NaN and inf (the dimension and dtype checks stay).

    For a trainer's inner loop only, over slices of a batch it has checked once: there the scan is a dozen extra
    tensor operations per minibatch, as many as the loss itself, and a NaN that appears inside the loop (a
    diverging network) still stops training at the gradient-norm check before ``optimizer.step()``.
    """
    token = _FINITE_CHECKED.set(True)
    try:
        yield
    finally:
        _FINITE_CHECKED.reset(token)


def as_tensor(name: str, x, *, ndims: tuple[int, ...] | None = None, dtype: str = "float") -> torch.Tensor:
    """Return ``x`` as a tensor after checking its number of dimensions, its dtype kind and finiteness.

    ``dtype`` is ``"float"`` (floating point, all finite), ``"bool"`` (bool, or 0/1 numbers), or ``"any"``. The
    finiteness scan is skipped inside ``finite_checked()``.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}; wrap it with torch.as_tensor")
    if ndims is not None and x.dim() not in ndims:
        raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dimensions, got shape {tuple(x.shape)}")
    if dtype == "float":
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}; use {name}.float()")
        if not _FINITE_CHECKED.get() and not torch.isfinite(x).all():
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


def check_finite(step: int, causes: str, **values) -> None:
    """Stop training at the first non-finite number: raise ``FloatingPointError`` naming the step, the quantity and
    ``causes`` (the likely reasons, in words). ``values`` are floats or tensors (a loss, a gradient norm)."""
    for name, value in values.items():
        if torch.is_tensor(value) and value.dim() > 0:
            bad = not torch.isfinite(value).all()
        else:  # one number (a float, a 0-d tensor): math.isfinite takes a tenth of the time of three tensor calls
            bad = not math.isfinite(value.detach() if torch.is_tensor(value) else value)
        if bad:
            raise FloatingPointError(
                f"{name} is not finite (NaN or inf) at step {step}; training stopped and nothing was saved after "
                f"this point. Likely causes: {causes}"
            )


def check_finite_parameters(module: torch.nn.Module, step: int, causes: str) -> None:
    """Raise like ``check_finite`` when any parameter of ``module`` is NaN or inf, naming the first one."""
    for name, p in module.named_parameters():
        if not torch.isfinite(p).all():
            check_finite(step, causes, **{f"parameter {name}": p})


def check_config(
    cfg,
    positive: tuple[str, ...] = (),
    nonneg: tuple[str, ...] = (),
    unit: tuple[str, ...] = (),
    choices: dict[str, tuple] | None = None,
):
    """Check every field of the config dataclass ``cfg`` against its annotation and the ranges named here; return it.

    Types come from the annotations: ``bool`` takes True/False only; ``int`` takes integers (NumPy's too), never a
    bool; ``float`` takes any finite real number (NumPy's too), never a bool; ``tuple[int, ...]`` takes a non-empty
    sequence of ints >= 1; ``X | None`` also takes None. NumPy scalars are turned into Python numbers in place.
    Ranges: ``positive`` > 0, ``nonneg`` >= 0, ``unit`` in [0, 1], ``choices`` one of the listed values.
    """
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        name, value, kind = f.name, getattr(cfg, f.name), hints[f.name]
        if isinstance(kind, types.UnionType) and type(None) in kind.__args__:
            if value is None:
                continue
            (kind,) = [a for a in kind.__args__ if a is not type(None)]
        setattr(cfg, name, _typed(name, value, kind))
        value = getattr(cfg, name)
        if name in positive and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
        if name in nonneg and not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
        if name in unit and not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if choices and name in choices:
            one_of(name, value, choices[name])
    return cfg


def _typed(name: str, value, kind):
    """``value`` as the Python type ``kind`` names, or a ValueError/TypeError that names the field."""
    if kind is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise TypeError(f"{name} must be True or False, got {value!r}")
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got the bool {value!r}")
    if kind is int:
        if isinstance(value, (int, np.integer)):
            return int(value)
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if kind is float:
        if isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value):
            return float(value)
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if kind is str:
        if isinstance(value, str):
            return value
        raise TypeError(f"{name} must be a string, got {value!r}")
    if typing.get_origin(kind) is tuple:
        ok = isinstance(value, (tuple, list)) and value and all(isinstance(v, (int, np.integer)) for v in value)
        if ok and not any(isinstance(v, (bool, np.bool_)) for v in value) and all(v >= 1 for v in value):
            return tuple(int(v) for v in value)
        raise ValueError(f"{name} must be a non-empty sequence of integers >= 1 (layer sizes), got {value!r}")
    return value
