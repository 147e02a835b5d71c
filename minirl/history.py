"""The metric history every trainer returns, gymnasium and language model alike: one row of numbers per update."""

import csv
from pathlib import Path


class History:
    """Metrics logged once per update: ``history["return_mean"]`` is a list over updates, ``history.rows`` the
    list of per-update dicts."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def log(self, **metrics: float) -> None:
        self.rows.append({k: float(v) for k, v in metrics.items()})

    def __getitem__(self, key: str) -> list[float]:
        if not self.rows or key not in self.rows[-1]:
            known = sorted(self.rows[-1]) if self.rows else []
            raise KeyError(f"no metric {key!r} in this history; logged metrics: {known}")
        return [row.get(key, float("nan")) for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def keys(self) -> list[str]:
        return list(self.rows[-1]) if self.rows else []

    def to_csv(self, path: str | Path) -> None:
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(self.rows)
