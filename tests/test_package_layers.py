"""The package's import structure (docs/architecture.md, "The Python
package"): each part imports only from the parts after it in LAYERS, no
module imports the package's ``__init__``, and no modules import each
other in a circle, at module level or inside functions. Read from the
source, nothing imported."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "lazy_mlir"
# highest first; a top-level module not listed (minify, models) stands above all
LAYERS = ["zero", "backend", "trace", "run", "compile", "cache", "lowering", "codegen", "cluster", "observe",
          "native", "config"]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("lazy_mlir",) + path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    found["lazy_mlir.native._C"] = PACKAGE / "native"  # the C++ extension
    return found


def _imports(name: str, path: Path, known) -> list[tuple[str, int]]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("lazy_mlir") and target != name:
                edges.append((target, node.lineno))
    return edges


def _graph():
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items() if path.suffix == ".py"}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else None
    return LAYERS.index(top) if top in LAYERS else -1


def test_each_part_imports_only_the_parts_below_it():
    against = [f"{m} -> {t} (line {line})" for m, edges in _graph().items() for t, line in edges
               if _layer(t) != -1 and _layer(m) != -1 and _layer(t) < _layer(m)]
    assert not against, "imports against the layers:\n" + "\n".join(against)


def test_no_module_imports_the_package_init():
    back = [f"{m} (line {line})" for m, edges in _graph().items() for t, line in edges
            if t == "lazy_mlir" and m != "lazy_mlir"]
    assert not back, "import the package's __init__: " + ", ".join(back)


def test_no_import_circle():
    graph = {m: {t for t, _ in edges} for m, edges in _graph().items()}
    index, low, stack, on, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_the_layers_name_the_package_parts():
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    parts |= {p.stem for p in PACKAGE.glob("*.py")}
    assert set(LAYERS) <= parts
    assert parts - set(LAYERS) == {"__init__", "minify", "models"}, "a new part needs its place in LAYERS"


def test_a_long_module_says_why_it_is_one():
    """A module over ~500 lines says at its top why it is not split."""
    long = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if len(p.read_text().splitlines()) > 520
            and "Why one module" not in (ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert not long, f"over ~500 lines with no reason at the top: {long}"
