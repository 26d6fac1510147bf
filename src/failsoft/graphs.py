"""Service graphs: the HAMS DAG description format, failsoft's graph files, and the shipped graphs.

A *service graph* (``graph`` services, :class:`~failsoft.services.GraphParams`) is a DAG of models;
every request walks it from the entry nodes to the sinks, and a node with several inputs joins them
request by request. HAMS (DSN'20) describes its six evaluation services in a plain-text format that
:func:`parse_hams_dag` reads:

.. code-block:: text

    6                                  # number of node lines
    2                                  # number of edge lines
    c0,1,detection:container0,false,0  # name, version, image, stateful, batch size
    ...
    dist[1->2,4;2->3;4->5]             # fan-out: node 1 feeds 2 and 4, 2 feeds 3, 4 feeds 5
    reduce[3,5->6]                     # fan-in: node 6 joins the outputs of 3 and 5 per request

Nodes are numbered from 1 in the order of their lines. A negative batch size is dynamic batching up
to its magnitude, a positive one a static batch padded to it; 0 (most public graphs) is taken as
batch size 1 (the request-at-a-time serving the paper's latency numbers use).

failsoft's own graph files (YAML, :func:`graph_from_document`) say the same with names instead of
numbers, and the node fields of :class:`~failsoft.services.GraphNode`::

    name: fatigue
    nodes:
      - {name: c2, variant: "detection:container2", stateful: true, batch_size: 1}
      - {name: c5, variant: "detection:container5", joins: [c3, c4]}
    edges: [[c0, c1], [c1, c2], ...]

The public graphs, converted, ship in ``failsoft/data/hams/graphs`` (their sources beside them in
``public/``, see PROVENANCE.md there): :func:`shipped_graphs` lists them, :func:`load_graph` loads one.
Every bad input is a :class:`~failsoft.errors.ConfigError` that names the node: a cycle, an edge to
an unknown node, a fan-in whose inputs do not match its join, and (given what each variant can do,
:func:`check_stateful_variants`) a stateful node whose variant exposes no state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import yaml

from failsoft.errors import ConfigError
from failsoft.services import GraphNode, GraphParams

# shipped graph -> its source in the HAMS repository (``public/`` holds the copies)
PUBLIC_SOURCES: Mapping[str, str] = {
    "stock-prediction": "prediction/dag_formatted",
    "stock-prediction-echo": "prediction/dag_formatted_echo",
    "imagequery": "imagequery/dag_formatted",
    "imagequery-echo": "imagequery/dag_formatted_echo",
    "fatigue": "Fatigue/dag_formatted_Fatigue",
    "fatigue-echo": "Fatigue/dag_formatted_echo",
    "auto-pilot": "auto_pilot/dag_formatted",
    "auto-pilot-echo": "auto_pilot/dag_formatted_echo",
    "translation": "translation/dag_formatted",
    "translation-echo": "translation/dag_formatted_echo",
    "simpledag": "simpledag/dag_formatted",
    "echo-chain": "echo-chain/dag_description",
    "echo-chain-stateful": "echo-chain/complex_dag",
    "echo-chain-reduce": "echo-chain/dag_reduce_description",
    "echo-chain-stock": "echo-chain/dag_stock_description",
    "echo-chain-fatigue": "echo-chain/dag_fatigue_description",
}
_EDGE_LINE = re.compile(r"^(dist|reduce)\[(.*)\]$")
_NODE_FIELDS = ("name", "variant", "stateful", "batch_size", "dynamic_batching", "joins", "app")


def parse_hams_dag(text: str, source: str = "dag") -> GraphParams:
    """A HAMS DAG description (the format above) as graph parameters; each node's app is its name."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        raise ConfigError(f"{source}: a HAMS DAG starts with a node count and an edge-line count")
    n_nodes = _count(lines[0], source, 1, "the node count")
    n_edges = _count(lines[1], source, 2, "the edge-line count")
    body = lines[2:]
    if len(body) != n_nodes + n_edges:
        raise ConfigError(
            f"{source}: the header declares {n_nodes} node lines and {n_edges} edge lines, "
            f"but {len(body)} lines follow"
        )
    names = [_node_name(line, source, n) for n, line in enumerate(body[:n_nodes], start=3)]
    edges: list[tuple[str, str]] = []
    joins: dict[str, tuple[str, ...]] = {}
    for n, line in enumerate(body[n_nodes:], start=3 + n_nodes):
        match = _EDGE_LINE.match(line.replace(" ", ""))
        if not match:
            raise ConfigError(f"{source}:{n}: expected 'dist[...]' or 'reduce[...]', got {line!r}")
        for group in filter(None, match.group(2).split(";")):
            ups, _, downs = group.partition("->")
            up_names = [_node_ref(i, names, source, n) for i in ups.split(",")]
            down_names = [_node_ref(i, names, source, n) for i in downs.split(",")]
            if match.group(1) == "reduce":
                if len(down_names) != 1 or len(up_names) < 2:
                    raise ConfigError(f"{source}:{n}: a reduce joins two or more nodes into one: {group!r}")
                joins[down_names[0]] = tuple(up_names)
            edges += [(u, d) for u in up_names for d in down_names if (u, d) not in edges]
    node_lines = enumerate(zip(names, body, strict=False), start=3)
    nodes = tuple(_hams_node(line, source, n, joins.get(name, ())) for n, (name, line) in node_lines)
    return _graph(source, nodes, tuple(edges))


def graph_from_document(doc: Mapping[str, Any], source: str = "graph") -> GraphParams:
    """A failsoft graph document (``nodes``, ``edges``; the format above) as graph parameters."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
        raise ConfigError(f"{source}: a graph document has a 'nodes' list")
    nodes = []
    for i, raw in enumerate(doc["nodes"]):
        if not isinstance(raw, Mapping) or "name" not in raw:
            raise ConfigError(f"{source}: nodes[{i}]: a node is a mapping with a 'name'")
        unknown = sorted(set(raw) - set(_NODE_FIELDS))
        if unknown:
            raise ConfigError(f"{source}: node {raw['name']!r}: unknown field {unknown[0]!r}")
        fields = dict(raw) | {"app": raw.get("app", raw["name"]), "joins": tuple(raw.get("joins", ()))}
        try:
            nodes.append(GraphNode(**fields))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: node {raw['name']!r}: {exc}") from exc
    edges = tuple((str(e[0]), str(e[1])) for e in doc.get("edges", ()))
    return _graph(source, tuple(nodes), edges)


def graph_to_document(graph: GraphParams, name: str) -> dict[str, Any]:
    """The graph as a failsoft graph document; fields at their defaults are left out."""
    defaults = GraphNode("", "")
    nodes = []
    for node in graph.nodes:
        entry: dict[str, Any] = {"name": node.name}
        for field in _NODE_FIELDS[1:]:
            value = getattr(node, field)
            if field == "app" and value == node.name:
                continue
            if value != getattr(defaults, field):
                entry[field] = list(value) if isinstance(value, tuple) else value
        nodes.append(entry)
    return {"name": name, "nodes": nodes, "edges": [list(e) for e in graph.edges]}


def shipped_graphs() -> list[str]:
    """The names of the graphs shipped in ``failsoft/data/hams/graphs``, sorted."""
    folder = _data() / "graphs"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_graph(name: str) -> GraphParams:
    """The shipped graph ``name`` (``shipped_graphs()`` lists them)."""
    path = _data() / "graphs" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown graph {name!r} (shipped: {', '.join(shipped_graphs())})")
    return graph_from_document(yaml.safe_load(path.read_text()), f"graph {name!r}")


def public_source(name: str) -> str:
    """The text of the HAMS description that shipped graph ``name`` was converted from."""
    if name not in PUBLIC_SOURCES:
        raise ConfigError(f"graph {name!r} has no public source (those that do: {', '.join(PUBLIC_SOURCES)})")
    return (_data() / "public" / PUBLIC_SOURCES[name]).read_text()


def convert_public_graphs(folder: Any) -> list[str]:
    """Write every public graph, converted, as ``folder/<name>.yaml``; returns the names written.

    This is how ``failsoft/data/hams/graphs`` was made (a test checks that the two still agree).
    """
    for name, path in PUBLIC_SOURCES.items():
        doc = graph_to_document(parse_hams_dag(public_source(name), path), name)
        header = f"# {name}: converted from hku-systems/hams applications/{path} (see ../PROVENANCE.md)\n"
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=110)
        (folder / f"{name}.yaml").write_text(header + text)
    return list(PUBLIC_SOURCES)


def check_stateful_variants(graph: GraphParams, exposes_state: Callable[[GraphNode], bool]) -> None:
    """Refuse a stateful node whose variant cannot hand its state over (``state()``/``apply_state()``).

    ``exposes_state`` answers for a node's variant; the serving config passes the zoo's answer.
    """
    for node in graph.nodes:
        if node.stateful and not exposes_state(node):
            what = f"variant {node.variant!r}" if node.variant else f"the primary variant of app {node.app!r}"
            raise ConfigError(
                f"graph node {node.name!r} is stateful, but {what} exposes no state "
                f"(a stateful node's model needs state() and apply_state() for its backup)"
            )


def _data() -> Any:
    return resources.files("failsoft") / "data" / "hams"


def _graph(source: str, nodes: tuple[GraphNode, ...], edges: tuple[tuple[str, str], ...]) -> GraphParams:
    try:
        return GraphParams(nodes, edges)
    except ValueError as exc:
        raise ConfigError(f"{source}: {str(exc).removeprefix('GraphParams: ')}") from exc


def _count(line: str, source: str, n: int, what: str) -> int:
    try:
        value = int(line)
    except ValueError:
        raise ConfigError(f"{source}:{n}: {what} must be an integer, got {line!r}") from None
    if value < 0:
        raise ConfigError(f"{source}:{n}: {what} must be >= 0, got {value}")
    return value


def _fields(line: str, source: str, n: int) -> list[str]:
    fields = [f.strip() for f in line.split(",")]
    if len(fields) != 5:
        raise ConfigError(
            f"{source}:{n}: a node line is 'name,version,image,stateful,batch_size'; got {line!r}"
        )
    return fields


def _node_name(line: str, source: str, n: int) -> str:
    return _fields(line, source, n)[0]


def _hams_node(line: str, source: str, n: int, joins: tuple[str, ...]) -> GraphNode:
    name, _version, image, stateful, batch = _fields(line, source, n)
    if stateful.lower() not in ("true", "false"):
        raise ConfigError(f"{source}:{n}: node {name!r}: stateful must be true or false, got {stateful!r}")
    try:
        size = int(batch)
    except ValueError:
        raise ConfigError(
            f"{source}:{n}: node {name!r}: batch size must be an integer, got {batch!r}"
        ) from None
    try:
        return GraphNode(name, name, stateful.lower() == "true", image, max(1, abs(size)), size < 0, joins)
    except ValueError as exc:
        raise ConfigError(f"{source}:{n}: node {name!r}: {exc}") from exc


def _node_ref(token: str, names: list[str], source: str, n: int) -> str:
    try:
        index = int(token)
    except ValueError:
        raise ConfigError(f"{source}:{n}: an edge names nodes by number (from 1), got {token!r}") from None
    if not 1 <= index <= len(names):
        raise ConfigError(
            f"{source}:{n}: an edge names unknown node {index} (the graph has nodes 1 to {len(names)})"
        )
    return names[index - 1]
