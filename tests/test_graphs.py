"""The HAMS DAG parser on every shipped public graph, the shipped conversions, and bad input."""

import re
from pathlib import Path

import pytest
import yaml

from failsoft import graphs
from failsoft.errors import ConfigError
from failsoft.services import GraphNode, GraphParams


def _source_facts(text):
    """Node count, stateful nodes and edges read from the raw text, independently of the parser."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    count = int(lines[0])
    rows = [line.split(",") for line in lines[2 : 2 + count]]
    names = [r[0] for r in rows]
    stateful = {r[0] for r in rows if r[3] == "true"}
    edges = set()
    for line in lines[2 + count :]:
        body = re.search(r"\[(.*)\]", line).group(1)
        for group in body.split(";"):
            ups, downs = group.split("->")
            pairs = [(u, d) for u in ups.split(",") for d in downs.split(",")]
            edges |= {(names[int(u) - 1], names[int(d) - 1]) for u, d in pairs}
    return count, stateful, edges


@pytest.mark.parametrize("name", sorted(graphs.PUBLIC_SOURCES))
def test_every_public_graph_parses_as_its_source_says(name):
    text = graphs.public_source(name)
    count, stateful, edges = _source_facts(text)
    graph = graphs.parse_hams_dag(text, name)
    assert len(graph.nodes) == count
    assert {n.name for n in graph.nodes if n.stateful} == stateful
    assert set(graph.edges) == edges
    for node in graph.nodes:  # a fan-in joins exactly its inputs
        inputs = {u for u, d in graph.edges if d == node.name}
        assert set(node.joins) == (inputs if len(inputs) > 1 else set())
    assert graphs.load_graph(name) == graph  # the shipped conversion still agrees with its source


def test_the_shipped_files_are_a_fresh_conversion(tmp_path):
    written = graphs.convert_public_graphs(tmp_path)
    shipped = Path(graphs.__file__).parent / "data" / "hams" / "graphs"
    assert sorted(written) == graphs.shipped_graphs()
    for name in written:
        assert (tmp_path / f"{name}.yaml").read_text() == (shipped / f"{name}.yaml").read_text()


def test_the_six_services_and_their_echo_variants_are_shipped():
    apps = ("stock-prediction", "imagequery", "fatigue", "auto-pilot", "translation")
    assert {*apps, *(f"{a}-echo" for a in apps), "simpledag"} <= set(graphs.shipped_graphs())
    # two stateful models in sequence, as the source has them
    pilot = graphs.load_graph("auto-pilot")
    assert ("c2", "c3") in pilot.edges and {n.name for n in pilot.nodes if n.stateful} == {"c2", "c3"}


def test_batch_sizes_follow_the_format():
    text = "3\n1\na,1,img,false,-8\nb,1,img,true,64\nc,1,img,false,0\ndist[1->2;2->3]\n"
    a, b, c = graphs.parse_hams_dag(text).nodes
    assert (a.batch_size, a.dynamic_batching) == (8, True)
    assert (b.batch_size, b.dynamic_batching, b.variant) == (64, False, "img")
    assert c.batch_size == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2\n1\na,1,i,false,0\nb,1,i,false,0\ndist[1->2;2->1]\n", "cycle through node 'a'"),
        ("2\n1\na,1,i,false,0\nb,1,i,false,0\ndist[1->3]\n", "unknown node 3"),
        ("3\n1\na,1,i,false,0\nb,1,i,false,0\nc,1,i,false,0\ndist[1->2,3;2->3]\n", "node 'c' has inputs"),
        ("3\n2\na,1,i,false,0\nb,1,i,false,0\nc,1,i,false,0\ndist[1->2]\nreduce[1,2->3]\n", None),
        ("2\n1\na,1,i,maybe,0\nb,1,i,false,0\ndist[1->2]\n", "node 'a': stateful must be true or false"),
        ("2\n1\na,1,i\nb,1,i\n1,2\n", "a node line is"),
        ("3\n1\na,1,i,false,0\nb,1,i,false,0\ndist[1->2]\n", "declares 3 node lines"),
    ],
)
def test_bad_hams_descriptions_name_the_node(text, message):
    if message is None:  # a well-formed reduce parses
        assert graphs.parse_hams_dag(text).nodes[2].joins == ("a", "b")
        return
    with pytest.raises(ConfigError, match=re.escape(message)):
        graphs.parse_hams_dag(text)


def test_bad_graph_documents_name_the_node():
    doc = yaml.safe_load("nodes: [{name: a}, {name: b}, {name: c, joins: [a]}]\nedges: [[a, c], [b, c]]")
    with pytest.raises(ConfigError, match=r"node 'c' joins \['a'\], but its inputs are \['a', 'b'\]"):
        graphs.graph_from_document(doc)
    with pytest.raises(ConfigError, match=r"edge .* names unknown node 'z'"):
        graphs.graph_from_document({"nodes": [{"name": "a"}], "edges": [["a", "z"]]})
    with pytest.raises(ConfigError, match="node 'a': unknown field 'statefull'"):
        graphs.graph_from_document({"nodes": [{"name": "a", "statefull": True}]})
    with pytest.raises(ConfigError, match="unknown graph 'nope'"):
        graphs.load_graph("nope")


def test_a_stateful_node_whose_variant_exposes_no_state_is_refused():
    nodes = (GraphNode("a", "app_a"), GraphNode("rnn", "app_r", stateful=True, variant="mlp"))
    graph = GraphParams(nodes, (("a", "rnn"),))
    with pytest.raises(ConfigError, match=r"graph node 'rnn' is stateful, but variant 'mlp' exposes no"):
        graphs.check_stateful_variants(graph, lambda node: node.variant == "gru")
    graphs.check_stateful_variants(graph, lambda node: node.variant in ("gru", "mlp"))
