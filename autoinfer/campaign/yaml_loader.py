"""Reading a campaign file's YAML without letting its content hang, crash or fool autoinfer.

yaml.safe_load builds no objects from tags, but it still accepts what a campaign must not hold: aliases and merge
keys that expand a few hundred bytes into billions of nodes (a "billion laughs" file takes minutes), nesting deep
enough to exhaust Python's recursion, duplicate keys (silently last-wins), .inf/.nan and integers of thousands of
digits. This loader is yaml.SafeLoader with those bounded; every refusal names its line.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from autoinfer.errors import UserError

MAX_BYTES = 1 << 20  # a campaign is a few hundred bytes; a megabyte is already absurd
MAX_DEPTH = 32  # nesting of mappings and lists, aliases expanded
MAX_NODES = 20_000  # values once every alias and merge key is expanded
MAX_INT_DIGITS = 19  # |n| < 2^63: what any count, size or seed in a campaign can be
MERGE_TAG = "tag:yaml.org,2002:merge"


class CampaignYAMLError(ValueError):
    """The YAML is well-formed but not acceptable as a campaign; `line` is 1-based (0: the whole document)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(message)
        self.line = line


def _line(node: Node) -> int:
    return node.start_mark.line + 1


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader with limits on depth, expanded size, integer size; no duplicate keys, no .inf/.nan."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise CampaignYAMLError(f"nested more than {MAX_DEPTH} levels deep",
                                        self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    raise CampaignYAMLError(f"a mapping key must be a plain value, not {type(key).__name__}",
                                            _line(key_node)) from None
                if first is not None:
                    raise CampaignYAMLError(f"key {key!r} appears twice (first on line {first}); keep one",
                                            _line(key_node))
                seen[key] = _line(key_node)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        digits = node.value.replace("_", "").lstrip("+-")
        if len(digits) > MAX_INT_DIGITS + 2:  # room for a 0x/0b/0o prefix
            raise CampaignYAMLError(f"integer of {len(digits)} characters; give a number below 2^63", _line(node))
        value = super().construct_yaml_int(node)
        if abs(value) >= 1 << 63:
            raise CampaignYAMLError(f"integer {value} is too large; give a number below 2^63", _line(node))
        return value

    def construct_yaml_float(self, node: ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        if not math.isfinite(value):
            raise CampaignYAMLError(f"{node.value} is not a finite number; give a number (or null where allowed)",
                                    _line(node))
        return value


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
BoundedLoader.add_constructor("tag:yaml.org,2002:map", BoundedLoader.construct_yaml_map)


def _check_expansion(root: Node) -> None:
    """Count the nodes and depth the document has once aliases and merges are expanded, without expanding them:
    each distinct node is visited once (iteratively), its expanded size memoised. A node that contains itself is
    refused too (it would expand forever)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_NODES:
                raise CampaignYAMLError(f"aliases and merge keys expand to more than {MAX_NODES} values; "
                                        "write the values out", _line(node))
            if depth[key] > MAX_DEPTH:
                raise CampaignYAMLError(f"aliases nest more than {MAX_DEPTH} levels deep", _line(node))
            continue
        if key in size:
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                raise CampaignYAMLError("an alias refers to a value that contains it; write the values out",
                                        _line(child))
            if id(child) not in size:
                stack.append((child, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_yaml(path: Path) -> Any:
    """The YAML document in `path`, bounded as above; UserError naming the file, the line and the fix."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise UserError(f"{path}: {size} bytes is too large for a campaign file (limit {MAX_BYTES}); "
                            "is this the right file?")
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the campaign file ({exc.strerror}); check the path and permissions") \
            from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise UserError(f"{path} line {line}: byte 0x{raw[exc.start]:02x} is not UTF-8; save the file as UTF-8") \
            from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise UserError(f"{path} line {line}: a NUL byte; a campaign file is text, save it as UTF-8")
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - BoundedLoader is a SafeLoader
    except CampaignYAMLError as exc:
        where = f" line {exc.line}" if exc.line else ""
        raise UserError(f"{path}{where}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{path}{where}: not valid YAML ({problem})") from None
