"""Pictures of backward graphs: ``view`` (what to show: all, around a node, collapsed), ``timing`` (what
colours it: times, costs, changes), ``dot`` (the DOT text, our own), ``render`` (SVG, PNG, HTML through
Graphviz)."""
