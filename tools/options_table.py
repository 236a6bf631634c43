"""Writes docs/options.md: every field of ``lazy_mlir.config.Config`` as a
markdown table (option, default, environment variable, whether it changes
compiled code, one line of description), then each option's full comment.

    .venv/bin/python tools/options_table.py > docs/options.md

The descriptions are the comments above each field in
python/lazy_mlir/config.py; the environment variable is the ``LAZY_MLIR_*``
name its default reads. tests/test_docs.py fails when docs/options.md is not
this script's output (edit config.py, then run the command above).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import sys

import lazy_mlir.config as config

COMMAND = ".venv/bin/python tools/options_table.py > docs/options.md"
# Module-level helpers whose result depends on the machine; used when the
# helper has no docstring to say so.
MACHINE_DEFAULTS = {
    "_default_device": '"cuda" when torch sees a GPU, else "cpu"',
    "_default_cache_dir": "`$XDG_CACHE_HOME/lazy_mlir`, else `~/.cache/lazy_mlir`",
}
# Helpers that only read the environment (their result is the default when
# no variable is set).
ENV_HELPERS = {"_env_flag", "_on_off_auto"}
ENV_NAME = re.compile(r"^LAZY_MLIR_[A-Z0-9_]+$")


def _class_node(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _comments(lines: list[str], node: ast.ClassDef) -> dict[str, str]:
    """The comment block right above each field, joined into one paragraph.
    A field with none shares the comment of the field block it is part of
    (fields on consecutive lines after a commented one)."""
    found: dict[str, str] = {}
    shared_with = None
    previous_end = None
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            previous_end = None
            continue
        name = stmt.target.id
        block = []
        i = stmt.lineno - 2  # 0-based index of the line above
        while i >= 0 and lines[i].strip().startswith("#"):
            block.append(lines[i].strip().lstrip("#").strip())
            i -= 1
        if block:
            found[name] = " ".join(reversed(block))
            shared_with = name
        elif previous_end is not None and stmt.lineno == previous_end + 1 and shared_with:
            found[name] = f"See `{shared_with}`."
        else:
            found[name] = ""
            shared_with = None
        previous_end = stmt.end_lineno
    return found


def _values(node: ast.ClassDef) -> dict[str, ast.expr | None]:
    return {s.target.id: s.value for s in node.body
            if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _factory_body(value: ast.expr | None) -> ast.expr | None:
    """The lambda body of ``dataclasses.field(default_factory=lambda: ...)``."""
    if isinstance(value, ast.Call):
        for kw in value.keywords:
            if kw.arg == "default_factory" and isinstance(kw.value, ast.Lambda):
                return kw.value.body
    return None


def _env_vars(expr: ast.expr | None) -> list[str]:
    if expr is None:
        return []
    names = [n.value for n in ast.walk(expr) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and ENV_NAME.match(n.value)]
    return list(dict.fromkeys(names))


def _machine_helper(expr: ast.expr) -> str | None:
    """A module-level function of config.py, not an environment reader,
    called by a default factory: its default depends on the machine."""
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id not in ENV_HELPERS:
            if inspect.isfunction(getattr(config, n.func.id, None)):
                return n.func.id
    return None


def _first_sentence(text: str) -> str:
    """Up to the first period that ends a sentence outside brackets."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == "." and depth == 0:
            rest = text[i + 1:]
            if not rest or (rest[0] == " " and rest.lstrip()[:1].isupper()):
                return text[:i + 1]
    return text


def _helper_text(name: str) -> str:
    doc = inspect.getdoc(getattr(config, name)) or ""
    if doc:
        first = _first_sentence(doc.split("\n\n")[0].replace("\n", " "))
        first = re.split(r"[.:;]\s", first + " ")[0].rstrip(".")
        return first[:1].lower() + first[1:]
    return MACHINE_DEFAULTS.get(name, f"`{name}()`")


def _literal(value) -> str:
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`"


def _default(field: dataclasses.Field, factory_body: ast.expr | None) -> str:
    if field.default is not dataclasses.MISSING:
        return _literal(field.default)
    if field.default_factory is dataclasses.MISSING:
        return "(required)"
    if factory_body is not None:
        helper = _machine_helper(factory_body)
        if helper:
            return _helper_text(helper)
    # the factory with no LAZY_MLIR_* variable set: the default itself
    saved = {k: v for k, v in os.environ.items() if k.startswith("LAZY_MLIR_")}
    for k in saved:
        del os.environ[k]
    try:
        return _literal(field.default_factory())
    finally:
        os.environ.update(saved)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").strip() or "-"


def render() -> str:
    source = inspect.getsource(config)
    lines = source.splitlines()
    node = _class_node(ast.parse(source), "Config")
    comments, values = _comments(lines, node), _values(node)
    not_in_key = getattr(config.Config, "_NOT_IN_KEY", None)
    fields = [f for f in dataclasses.fields(config.Config) if not f.name.startswith("_")]

    out = [
        "# Options",
        "",
        f"_Generated from `python/lazy_mlir/config.py` by `{COMMAND}`; "
        "edit the comments there and regenerate (tests/test_docs.py checks it)._",
        "",
        "Set an option with `lazy_mlir.init(level, **options)` (`lazy_mlir.init(\"O1\", check=True)`),",
        "or, where the table names one, with its environment variable: the variable only gives",
        "the default, so an argument to `init()` wins. Each `init()` reads the environment again.",
        "Boolean variables: `0`, `false`, `off` or `no` turn the option off, any other non-empty",
        "value turns it on. `auto`/`on`/`off` options also take `1`/`true` (on) and `0`/`false`/`no`",
        "(off). `lazy_mlir.config.current` is the configuration in force.",
        "",
    ]
    if not_in_key is not None:
        out += ["\"Recompiles\": the option is part of every group's cache key, so changing it",
                "compiles the step's groups again (or loads other entries from the compile cache).", ""]
        out += ["| Option | Default | Environment variable | Recompiles | Description |",
                "|---|---|---|---|---|"]
    else:
        out += ["| Option | Default | Environment variable | Description |", "|---|---|---|---|"]
    for f in fields:
        body = _factory_body(values.get(f.name))
        env = ", ".join(f"`{e}`" for e in _env_vars(body)) or "-"
        row = [f"`{f.name}`", _cell(_default(f, body)), env]
        if not_in_key is not None:
            row.append("" if f.name in not_in_key else "yes")
        row.append(_cell(_first_sentence(comments.get(f.name, ""))))
        out.append("| " + " | ".join(row) + " |")
    out += ["", "## Details", ""]
    for f in fields:
        text = comments.get(f.name, "")
        out += [f"### `{f.name}`", "", text or "(no comment in config.py)", ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
