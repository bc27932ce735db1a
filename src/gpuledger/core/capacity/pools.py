"""Pools: named groups of hosts, from a small TOML file (docs/CAPACITY.md). Pure.

```toml
[[pool]]
name = "train-a100"
hosts = ["gpu-a*", "gpu-b01"]      # host names or shell-style patterns
instance_type = "p4d.24xlarge"     # optional: its GPUs are priced as this rate-card instance
```

A host belongs to the first pool whose patterns match it. A GPU on no pool's host is in the pool
named after its instance type, or after its GPU model when it has none: GPUs priced by the same
rate-card line group together without any configuration. Errors name the file, line and key, all
at once, as rate cards do.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from gpuledger.core.toml_lines import Locator

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["Pool", "Pools", "PoolsError", "parse_pools"]

_KEYS = frozenset({"name", "hosts", "instance_type", "description"})


class PoolsError(ValueError):
    """A pools file that cannot be used; ``problems`` holds one line per problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Pool:
    name: str
    hosts: tuple[str, ...]
    instance_type: str | None = None
    description: str = ""


@dataclass(frozen=True)
class Pools:
    pools: tuple[Pool, ...] = ()
    source: str = ""  # the file, or "" without one

    def pool_of_host(self, host: str) -> Pool | None:
        for pool in self.pools:
            if any(fnmatch.fnmatchcase(host, pattern) for pattern in pool.hosts):
                return pool
        return None

    def instance_type(self, host: str, reported: str | None = None) -> str | None:
        """The instance type a host's GPUs are priced as: its pool's, else what its agent reported."""
        pool = self.pool_of_host(host)
        return pool.instance_type if pool is not None and pool.instance_type else reported

    def name(self, host: str, instance_type: str | None, model: str) -> str:
        """The pool of a GPU on ``host`` (module doc)."""
        pool = self.pool_of_host(host)
        if pool is not None:
            return pool.name
        return instance_type or model


def parse_pools(text: str, source: str = "pools.toml") -> Pools:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PoolsError([f"{source}: {exc}"]) from None
    where = Locator(text)
    problems: list[str] = []

    def say(index: int | None, key: str | None, what: str) -> None:
        line = where.header("pool", index) if index is not None else None
        if line is not None and key is not None:
            line = where.key(line, key) or line
        at = f"{source}:{line + 1}" if line is not None else source
        entry = f"[[pool]] #{index + 1}" if index is not None else "file"
        problems.append(f"{at}: {entry}{' ' + key if key else ''}: {what}")

    unknown = sorted(set(data) - {"pool"})
    for key in unknown:
        say(None, key, "unknown table (a pools file holds [[pool]] entries only)")
    entries = data.get("pool", [])
    if not isinstance(entries, list):
        say(None, "pool", "write pools as [[pool]] entries")
        entries = []
    pools: list[Pool] = []
    names: set[str] = set()
    for i, entry in enumerate(entries):
        for key in sorted(set(entry) - _KEYS):
            say(i, key, f"unknown key (expected one of: {', '.join(sorted(_KEYS))})")
        name, hosts, instance = entry.get("name"), entry.get("hosts"), entry.get("instance_type")
        if not isinstance(name, str) or not name.strip():
            say(i, "name", "required: a non-empty text")
        elif name in names:
            say(i, "name", f"{name!r} is the name of an earlier pool")
        if isinstance(hosts, str):
            hosts = [hosts]
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h.strip() for h in hosts):
            say(i, "hosts", 'required: a list of host names or patterns, e.g. ["gpu-a*", "gpu-b01"]')
            hosts = []
        if instance is not None and (not isinstance(instance, str) or not instance.strip()):
            say(i, "instance_type", "must be a text naming a rate card [[instance]] type")
            instance = None
        if isinstance(name, str) and name.strip():
            names.add(name)
            pools.append(
                Pool(name.strip(), tuple(h.strip() for h in hosts), instance, str(entry.get("description", "")))
            )
    if problems:
        raise PoolsError(problems)
    return Pools(tuple(pools), source)
