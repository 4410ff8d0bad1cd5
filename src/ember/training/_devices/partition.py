"""Where each array of a train state goes on a mesh: the model's own names, then rules, then automatic FSDP."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

#: A sequence of ``(regex, PartitionSpec)`` pairs, matched with ``re.search`` against a leaf's dotted path
#: (``params.Dense_0.kernel``); the first match wins, as in Keras 3's ``LayoutMap``.
Rules = Sequence[tuple[str, P]]


def dotted(path: Any) -> str:
    """``params.Dense_0.kernel`` for a JAX key path (the names checkpoints use too)."""
    parts = []
    for key in path:
        name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))
        parts.append(str(name))
    if parts and parts[-1] == "value" and type(path[-1]).__name__ == "GetAttrKey":
        parts.pop()  # an NNX variable's value: the variable's own path
    return ".".join(parts)


def model_names(params: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """The partition names a model put on its parameters, as ``((path, names), ...)`` (hashable).

    Linen's ``nn.with_logical_partitioning`` / ``nn.with_partitioning`` boxes, and NNX variables with
    ``out_sharding`` (or ``sharding``) metadata. Paths are relative to ``params``.
    """
    from flax import linen as nn

    nnx = sys.modules.get("flax.nnx")  # without it imported, no leaf is an NNX variable

    def names_of(leaf: Any) -> tuple[Any, ...] | None:
        if isinstance(leaf, nn.Partitioned):
            return tuple(leaf.names)
        if nnx is not None and isinstance(leaf, nnx.Variable):
            meta = leaf.get_metadata()
            found = meta.get("out_sharding") or meta.get("sharding")
            return tuple(found) if found is not None else None
        return None

    boxed = lambda x: isinstance(x, nn.Partitioned) or (nnx is not None and isinstance(x, nnx.Variable))  # noqa: E731
    found = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params, is_leaf=boxed)[0]:
        names = names_of(leaf)
        if names is not None:
            found.append((dotted(path), names))
    return tuple(found)


class Partitioner:
    """Resolves a `PartitionSpec` for every leaf of a train state on ``mesh``.

    Args:
        mesh: the device mesh.
        rules: ``(regex, PartitionSpec)`` pairs on the leaf's dotted path; first match wins.
        logical_rules: maps a model's logical axis names to mesh axes (Flax's ``(("embed", "fsdp"),
            ("mlp", "model"), ...)``); names the mesh has map to themselves.
        fsdp_axis: the mesh axis the automatic rule shards over (``None``: no automatic rule).
        min_size: parameters with fewer elements stay replicated under the automatic rule.

    Examples:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> from ember.training._devices.partition import Partitioner
        >>> mesh = Mesh(np.array(jax.devices()[:1]), ("fsdp",))
        >>> p = Partitioner(mesh, fsdp_axis="fsdp", min_size=4)
        >>> p.spec("params.w", (6, 8), ()), p.spec("params.b", (2,), ())
        (P(None, 'fsdp'), P())
    """

    def __init__(
        self,
        mesh: Mesh,
        *,
        rules: Rules = (),
        logical_rules: Sequence[tuple[str, Any]] = (),
        fsdp_axis: str | None = None,
        min_size: int = 2**14,
    ) -> None:
        self.mesh = mesh
        self.rules = [(re.compile(pattern), spec) for pattern, spec in rules]
        self.logical = dict(logical_rules)
        self.fsdp_axis = fsdp_axis
        self.min_size = min_size
        self.notes: dict[str, str] = {}  # by path: what the automatic rule left replicated, and why
        self.layout: list[tuple[str, tuple[int, ...], P, int]] = []  # the last state's (path, shape, spec, bytes)
        self._matched: set[int] = set()  # the rules and logical names the last state used
        self._named: set[str] = set()
        for pattern, spec in rules:
            self._check_axes(spec, f"The rule {pattern!r}")
        for logical, axes in self.logical.items():
            self._check_axes(P(axes), f"`logical_rules`[{logical!r}]")

    def _check_axes(self, spec: P, where: str) -> None:
        for entry in spec:
            for axis in entry if isinstance(entry, tuple) else (entry,):
                if axis is not None and axis not in self.mesh.axis_names:
                    raise ValueError(
                        f"{where} names the mesh axis {axis!r}, but the mesh has only the axes {self.mesh.axis_names}."
                    )

    def _from_names(self, path: str, names: tuple[Any, ...]) -> P:
        axes = []
        for name in names:
            if name is None or name in self.mesh.axis_names:
                axes.append(name)
            elif name in self.logical:
                self._named.add(name)
                axes.append(self.logical[name])
            else:
                raise ValueError(
                    f"The model partitions {path} over {name!r}, which is neither an axis of the mesh "
                    f"{self.mesh.axis_names} nor a name in logical_rules {sorted(self.logical)}."
                )
        return P(*axes)

    def _check_fits(self, path: str, shape: tuple[int, ...], spec: P, where: str) -> None:
        if len(spec) > len(shape):
            raise ValueError(f"{where} gives {path} of shape {shape} the spec {spec}, with more axes than it has.")
        for dim, entry in zip(shape, spec, strict=False):
            axes = entry if isinstance(entry, tuple) else (entry,)
            size = math.prod(self.mesh.shape[a] for a in axes if a is not None)
            if dim % size:
                raise ValueError(
                    f"{where} splits {path} (shape {shape}) over {entry!r} of size {size}, which does not divide "
                    f"its dimension of {dim}."
                )

    def spec(self, path: str, shape: tuple[int, ...], model_names: tuple[Any, ...] | None) -> P:
        """The spec of the leaf at ``path``: the model's names, else the first matching rule, else automatic."""
        if model_names:
            spec = self._from_names(path, model_names)
            self._check_fits(path, shape, spec, "The model's partitioning")
            return spec
        for i, (pattern, spec) in enumerate(self.rules):
            if pattern.search(path):
                self._matched.add(i)
                self._check_fits(path, shape, spec, f"The rule {pattern.pattern!r}")
                return spec
        return self._automatic(path, shape)

    def _automatic(self, path: str, shape: tuple[int, ...]) -> P:
        axis = self.fsdp_axis
        if axis is None or not shape:
            return P()
        size = int(self.mesh.shape[axis])
        if math.prod(shape) < self.min_size:
            return P()
        fits = [d for d in range(len(shape)) if shape[d] % size == 0]
        if not fits:
            self.notes[path] = f"{path} {shape}: no dimension divisible by {axis!r} ({size}); replicated"
            return P()
        largest = max(fits, key=lambda d: (shape[d], -d))
        return P(*[axis if d == largest else None for d in range(len(shape))])

    def shardings(self, abstract: Any, names: Mapping[str, tuple[Any, ...]]) -> Any:
        """A ``NamedSharding`` for every leaf of the train state ``abstract`` (shapes suffice).

        ``params`` and ``model_state`` get `spec`; the optimizer state follows its parameters
        (``optax.tree_map_params``: moments sharded like their parameter, counts replicated); ``step``,
        ``rng``, a loss scale and a step guard are replicated.
        """
        replicated = NamedSharding(self.mesh, P())
        self._matched, self._named, self.layout = set(), set(), []

        def resolve(prefix: str, tree: Any, names: Mapping[str, tuple[Any, ...]]) -> Any:
            def one(path: Any, leaf: Any) -> NamedSharding:
                where, shape = dotted(path), tuple(np.shape(leaf))
                spec = self.spec(f"{prefix}.{where}", shape, names.get(where))
                itemsize = leaf.dtype.itemsize  # a PRNG key type has one too (its key data's)
                self.layout.append((f"{prefix}.{where}", shape, spec, math.prod(shape) * itemsize))
                return NamedSharding(self.mesh, spec)

            return jax.tree_util.tree_map_with_path(one, tree)

        params = resolve("params", abstract.params, names)
        opt_state = optax.tree_map_params(
            abstract.tx,
            lambda _, sharding: sharding,
            abstract.opt_state,
            params,
            transform_non_params=lambda _: replicated,
            is_leaf=lambda x: isinstance(x, NamedSharding),
        )
        model_state = resolve("model_state", abstract.model_state, {})
        self._check_all_used(names)
        return abstract.replace(
            step=replicated,
            params=params,
            opt_state=opt_state,
            model_state=model_state,
            rng=jax.tree.map(lambda _: replicated, abstract.rng),
            loss_scale=jax.tree.map(lambda _: replicated, abstract.loss_scale),
            guard=jax.tree.map(lambda _: replicated, abstract.guard),
        )

    def _check_all_used(self, names: Mapping[str, tuple[Any, ...]]) -> None:
        """Raise for a rule that matched no array, or a logical name no array of the model carries (a typo)."""
        paths = [path for path, *_ in self.layout]
        for i, (pattern, _) in enumerate(self.rules):
            if i not in self._matched:
                shown = ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else ".")
                raise ValueError(
                    f"The rule {pattern.pattern!r} matches no array of the train state, so it places nothing (a "
                    f"typo?). Rules are searched in the dotted paths: {shown}"
                )
        used = {n for found in names.values() for n in found if n is not None}
        for name in self.logical:
            if name not in self._named:
                raise ValueError(
                    f"`logical_rules` names {name!r}, which no parameter of the model carries (a typo?); the model's "
                    f"names are {sorted(str(n) for n in used) or 'none'}."
                )

    def spread(self) -> tuple[float, int]:
        """``(fullest device's bytes / (total / N), N)`` for the last state's arrays of at least ``min_size`` elements.

        Smaller arrays stay replicated by design and are left out. N is the size of the mesh axes the specs use, with
        the automatic rule's ``fsdp_axis``: tensor parallelism over ``model`` with the batch over ``data`` is meant to
        split the state 4 ways on a 2 x 4 mesh, not 8.
        """
        large = [(spec, size) for _, shape, spec, size in self.layout if math.prod(shape) >= max(self.min_size, 1)]
        axes = {a for spec, _ in large for entry in spec for a in _axes(entry) if a is not None}
        if self.fsdp_axis is not None:
            axes.add(self.fsdp_axis)
        n = math.prod(int(self.mesh.shape[a]) for a in axes)
        total = sum(size for _, size in large)
        fullest = sum(size / self.shards(spec) for spec, size in large)
        return (fullest / (total / n) if total else 1.0), n

    def shards(self, spec: P) -> int:
        """Into how many pieces ``spec`` splits an array on this mesh."""
        return math.prod(int(self.mesh.shape[a]) for entry in spec for a in _axes(entry) if a is not None)


def _axes(entry: Any) -> tuple[Any, ...]:
    return entry if isinstance(entry, tuple) else (entry,)
