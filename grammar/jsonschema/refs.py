"""``$ref`` resolution inside one document: targets, anchors, aliases and in-place loops.

Only references into the document itself are followed (``#...``, or under the root's absolute
``$id``); remote and file references are never fetched. Each resolution counts against
``max_ref_expansions``, and every local reference must resolve, used or not, as the validator
would require.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple
from urllib.parse import unquote, urldefrag, urljoin

from tokenmold.grammar.errors import LimitExceeded, SchemaError, UnsupportedFeature
from tokenmold.grammar.json_pointer import pointer_to, pointer_token, read_token
from tokenmold.grammar.jsonschema.conjunct import MergeContext
from tokenmold.grammar.jsonschema.graph import find_cycle
from tokenmold.grammar.jsonschema.metaschema import Checker
from tokenmold.grammar.limits import Limits


class Located(NamedTuple):
    """A reference's target schema and its canonical pointer."""

    schema: Any
    pointer: str


class Resolver:
    """The references of one document, resolved once each, with the keywords they use reported."""

    def __init__(
        self, root: dict[str, Any], checker: Checker, legacy_ref: bool, limits: Limits, ctx: MergeContext
    ) -> None:
        self.root = root
        self.checker = checker
        self.known = checker.known
        self.legacy_ref = legacy_ref
        self.limits = limits
        self.ctx = ctx
        self._root_base = _root_base(root)
        self._resolved: dict[str, Located] = {}
        self._expansions = 0

    def pure_ref(self, schema: Any, pointer: str) -> tuple[str, str] | None:
        """``(ref, pointer)`` if ``schema`` asserts nothing but a ``$ref`` (maybe as a one-member allOf)."""
        if not isinstance(schema, dict) or "$ref" not in self.known:
            return None
        if "$ref" in schema:
            if self.legacy_ref or not any(key in self.known for key in schema if key != "$ref"):
                return schema["$ref"], pointer
            return None
        members = schema.get("allOf")
        if isinstance(members, list) and len(members) == 1 and not any(k in self.known for k in schema if k != "allOf"):
            self.ctx.enforce("allOf")
            return self.pure_ref(members[0], f"{pointer}/allOf/0")
        return None

    def target(self, ref: str, pointer: str) -> Located:
        """The target of ``ref`` with aliases (targets that are themselves bare references) followed."""
        target, target_pointer = self.resolve(ref, pointer)
        self.ctx.enforce("$ref")
        seen = [target_pointer]
        while (alias := self.pure_ref(target, target_pointer)) is not None:
            target, target_pointer = self.resolve(*alias)
            if target_pointer in seen:
                loop = " -> ".join(p or "/" for p in (*seen[seen.index(target_pointer) :], target_pointer))
                raise SchemaError(f"$ref alias loop: {loop}", pointer=seen[0], keyword="$ref")
            seen.append(target_pointer)
        return Located(target, target_pointer)

    def check_local_refs(self) -> None:
        """Every reference inside the document must resolve, used or not (the validator would fail).

        References to other documents are refused only where normalization needs them.
        """
        index = 0
        while index < len(self.checker.refs):  # resolving checks new targets, which may add refs
            ref, pointer = self.checker.refs[index]
            index += 1
            if ref.startswith("#"):
                self._located(ref, pointer)

    def check_in_place_loops(self) -> None:
        """Refuse a ``$ref`` cycle that never descends into the instance (only ``allOf``/``anyOf``/
        ``oneOf``/``not``/``if``/``then``/``else``/``dependentSchemas`` and ``$ref`` in between).

        The specification leaves such schemas undefined and validators recurse until they crash on
        them; the grammar may simplify the loop away (``anyOf: [{"$ref": "#"}, true]``), but the
        validation layer could then judge no output. Depth-first over schema positions, iteratively;
        every cycle passes through a ``$ref`` target, so starting from the root and each target
        finds them all.
        """
        schemas: dict[str, Any] = {"": self.root}
        for ref, at in self.checker.refs:
            if ref.startswith("#"):
                target, target_pointer = self._located(ref, at)
                schemas[target_pointer] = target

        def successors(pointer: str) -> Iterator[str]:
            for child, child_pointer in self._in_place_children(schemas[pointer], pointer):
                schemas[child_pointer] = child
                yield child_pointer

        cycle = find_cycle(list(schemas), successors)
        if cycle is not None:
            raise SchemaError(
                f"$ref loop that never descends into the instance: {' -> '.join(p or '/' for p in cycle)}",
                pointer=f"{cycle[-2]}/$ref",
                keyword="$ref",
            )

    def _in_place_children(self, schema: Any, pointer: str) -> Iterator[tuple[Any, str]]:
        """The subschemas applied to the same instance location as ``schema``."""
        if not isinstance(schema, dict):
            return
        for key in ("allOf", "anyOf", "oneOf"):
            if key in self.known and isinstance(schema.get(key), list):
                yield from ((sub, f"{pointer}/{key}/{i}") for i, sub in enumerate(schema[key]))
        for key in ("not", "if", "then", "else"):
            if key in self.known and key in schema:
                yield schema[key], f"{pointer}/{key}"
        if "dependentSchemas" in self.known and isinstance(schema.get("dependentSchemas"), dict):
            for name, sub in schema["dependentSchemas"].items():
                yield sub, f"{pointer}/dependentSchemas/{pointer_token(name)}"
        ref = schema.get("$ref")
        if "$ref" in self.known and isinstance(ref, str) and ref.startswith("#"):
            yield self._located(ref, pointer)

    def resolve(self, ref: str, pointer: str) -> Located:
        """The target of ``ref`` and its canonical pointer, counted against ``max_ref_expansions``."""
        self._expansions += 1
        if self._expansions > self.limits.max_ref_expansions:
            raise LimitExceeded(
                f"more than {self.limits.max_ref_expansions} $ref resolutions",
                pointer=f"{pointer}/$ref",
                keyword="max_ref_expansions",
            )
        return self._located(ref, pointer)

    def _located(self, ref: str, pointer: str) -> Located:
        """The target of ``ref``; only references inside the document are followed."""
        if ref not in self._resolved:
            target, target_pointer = self._lookup(self._fragment(ref, pointer), ref, pointer)
            self.checker.check(target, target_pointer, "$ref")
            if target_pointer.startswith(("/$defs/", "/definitions/")):
                self.ctx.enforce(target_pointer.split("/")[1])
            self._resolved[ref] = Located(target, target_pointer)
        return self._resolved[ref]

    def _fragment(self, ref: str, pointer: str) -> str:
        """The fragment of a reference into this document (``#...``, or under the root's ``$id``).

        A nested ``$id`` does not change the base: every local reference resolves against the root.
        """
        if ref.startswith("#"):
            return ref[1:]
        base, fragment = urldefrag(ref)
        if self._root_base and urljoin(self._root_base, base) == self._root_base:
            return fragment
        raise UnsupportedFeature(
            f"$ref {ref!r} is not inside this schema: remote and file references are never fetched",
            pointer=f"{pointer}/$ref",
            keyword="$ref",
        )

    def _lookup(self, fragment: str, ref: str, pointer: str) -> Located:
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            if fragment not in self.checker.anchors:
                raise SchemaError(
                    f"$ref {ref!r}: no anchor {fragment!r} in the schema", pointer=f"{pointer}/$ref", keyword="$ref"
                )
            return Located(*self.checker.anchors[fragment])
        node: Any = self.root
        tokens = [read_token(token) for token in fragment.split("/")[1:]]
        for token in tokens:
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise SchemaError(
                    f"$ref {ref!r} points at nothing in the schema", pointer=f"{pointer}/$ref", keyword="$ref"
                )
        if not isinstance(node, (dict, bool)):
            raise SchemaError(f"$ref {ref!r} does not point at a schema", pointer=f"{pointer}/$ref", keyword="$ref")
        return Located(node, pointer_to(tokens))


def _root_base(root: dict[str, Any]) -> str | None:
    """The absolute URI of the root (its ``$id``/``id``), under which ``$ref`` may also be local."""
    identifier = root.get("$id", root.get("id"))
    if isinstance(identifier, str) and "://" in identifier:
        return urldefrag(identifier)[0]
    return None
