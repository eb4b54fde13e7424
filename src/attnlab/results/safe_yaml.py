"""YAML for table specs and paper numbers: the safe loader, with a bound on what aliases may expand to.

``yaml.safe_load`` builds an alias as a shared reference, so a "billion laughs" file loads in kilobytes and
then explodes in whatever walks it (validation, JSON, rendering) until the memory cap kills the process.
The node graph is composed first and its size with every alias expanded is counted (memoised per node,
so the count itself stays cheap); a file over the bound is refused before anything is built from it.
"""

from __future__ import annotations

from typing import Any

import yaml

from attnlab.errors import UserError

# The largest spec and paper_tables.yaml of this repo expand to a few thousand nodes; a thousand times
# that is still nothing to hold in memory, and a bomb of ten levels of ten aliases is 10^10.
MAX_EXPANDED_NODES = 2_000_000


class UnsafeYamlError(UserError, ValueError):
    """Not valid YAML, or YAML whose aliases expand beyond :data:`MAX_EXPANDED_NODES`; one line."""


def _expanded_size(node: yaml.Node, memo: dict[int, int], limit: int) -> int:
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a node reached again while being counted is a cycle: count it once
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    for child in children:
        total += _expanded_size(child, memo, limit)
        if total > limit:
            break
    memo[id(node)] = total
    return total


def load_yaml(text: str, limit: int = MAX_EXPANDED_NODES) -> Any:
    """Parse ``text`` with the safe loader; UnsafeYamlError for invalid YAML or an alias bomb."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}, limit) > limit:
            raise UnsafeYamlError(
                f"its aliases expand to more than {limit:,} nodes (a YAML alias bomb?); write the values out"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise UnsafeYamlError(f"not valid YAML ({str(exc).splitlines()[0]})") from exc
    except RecursionError as exc:
        raise UnsafeYamlError("nested too deeply to read") from exc
    finally:
        loader.dispose()
