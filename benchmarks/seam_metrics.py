"""Structure metrics of ``src/rlvr`` for issue 13 (the trainer / schedule / sampler seam).

Prints, and writes to ``benchmarks/results/seam_metrics.json`` (or ``--out``):

* files over 400 lines, functions (and methods) over 80 lines;
* import cycles among rlvr modules — every ``import`` / ``from … import`` anywhere in a module (top level
  or inside a function) and ``importlib.import_module("rlvr…")`` with a literal name count as an edge, so
  lazy back-imports are cycles too; a package's ``__init__`` importing its submodules (also via ``pkgutil``) is an edge too;
* upward imports: an edge from a lower layer to a higher one, layers per ``docs/architecture.md``
  (imports under ``if TYPE_CHECKING:`` are skipped: they run nothing; a variant's ``config`` module is at
  the config layer, see :func:`layer`);
* private imports across packages (``from rlvr.x import _name``);
* every ``meta`` access (``x.meta``, ``x.meta[...]``, ``x.meta.get(...)``, a ``meta`` field of a class), the
  distinct keys read or written through it, and variant names under ``trainer/`` (issues 13 and 24);
* every module has a layer (a top-level module missing from ``LAYERS`` is listed: its imports went unchecked).

Run: ``python benchmarks/seam_metrics.py [--src src/rlvr] [--out FILE]`` (pure ``ast``; no imports of rlvr).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

# lower number = lower layer; a module may import its own layer or lower ones
LAYERS = {
    "errors": 0, "types": 0, "registry": 0, "util": 0, "precision": 0, "user_modules": 0, "loggers": 0, "__init__": 0,
    "core": 1, "config": 1, "plugins": 1, "sandbox": 1,
    "models": 2, "tasks": 2, "engines": 2, "rewards": 2, "rollout_io": 2, "lora": 2, "envs": 2,
    "samplers": 3, "distributed": 3, "parts": 4, "schedules": 4, "variants": 5, "trainer": 6,
    "eval": 7, "compare": 7, "testbed": 7, "testing": 7, "cli": 8, "__main__": 8,
}


def meta_uses(tree: ast.AST) -> tuple[int, set[str], int]:
    """``(accesses, keys, fields)``: attribute accesses ``x.meta``, the string keys used through them
    (``x.meta["k"]``, ``x.meta.get("k")`` / ``setdefault`` / ``pop``, ``x.meta = {"k": ...}``) and class
    fields named ``meta``."""
    accesses, keys, fields = 0, set(), 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "meta":
            accesses += 1
        if (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr", "setattr")
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "meta"):
            accesses += 1
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "meta":
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                keys.add(node.slice.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "meta" and node.args and isinstance(node.args[0], ast.Constant)):
            keys.add(str(node.args[0].value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "meta" for t in node.targets):
            if isinstance(node.value, ast.Dict):
                keys |= {str(k.value) for k in node.value.keys if isinstance(k, ast.Constant)}
        if isinstance(node, ast.ClassDef):
            fields += sum(isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name) and b.target.id == "meta"
                          for b in node.body)
    return accesses, keys, fields


def module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def layer(mod: str) -> int | None:
    """The module's layer: its top-level package's, except a variant's config section
    (``rlvr.variants.<name>.config``), which is at the config layer: ``rlvr.config`` imports it so that the
    section validates before any part loads, so it may import only that layer or lower ones."""
    parts = mod.split(".")
    if len(parts) < 2:
        return 0
    if len(parts) == 4 and parts[1] == "variants" and parts[3] == "config":
        return LAYERS["config"]
    return LAYERS.get(parts[1])


def imports_of(tree: ast.AST, mod: str, is_pkg: bool) -> list[tuple[str, list[str]]]:
    """``(imported module, names)`` for every rlvr import in the module."""
    out = []
    pkg = mod if is_pkg else mod.rsplit(".", 1)[0]
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}  # annotation-only imports run nothing
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("rlvr")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")
                up = up[: len(up) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base.startswith("rlvr"):
                out.append((base, [a.name for a in node.names]))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("rlvr"):
                out.append((str(node.args[0].value), []))
    if any(isinstance(n, ast.Attribute) and n.attr == "import_module" for n in ast.walk(tree)):
        # importlib.import_module(name) with the name from a literal elsewhere in the module (a loop)
        out += [(n.value, []) for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"rlvr(\.\w+)*", n.value)]
    if is_pkg and "iter_modules" in ast.unparse(tree):  # a package importing all its submodules
        out.append((f"{mod}.*", []))
    return out


def resolve(name: str, names: list[str], known: set[str]) -> list[str]:
    """Modules an import statement loads: ``from rlvr.a import b`` is module ``rlvr.a.b`` if that exists."""
    if name.endswith(".*"):
        return sorted(k for k in known if k.startswith(name[:-1]))
    mods = []
    for n in names:
        if f"{name}.{n}" in known:
            mods.append(f"{name}.{n}")
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return mods + [name]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default="src/rlvr")
    ap.add_argument("--out", default="benchmarks/results/seam_metrics.json")
    args = ap.parse_args()
    src = Path(args.src)
    files = sorted(src.rglob("*.py"))
    known = {module_name(f, src) for f in files}
    long_files, long_funcs, upward, private = [], [], [], []
    graph: dict[str, set[str]] = {}
    meta_access, meta_keys, meta_fields = [], set(), []
    unlayered = sorted({m.split(".")[1] for m in known if "." in m and layer(m) is None})
    for f in files:
        text = f.read_text()
        tree = ast.parse(text)
        mod = module_name(f, src)
        n_lines = len(text.splitlines())
        if n_lines > 400:
            long_files.append((str(f.relative_to(src)), n_lines))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    long_funcs.append((f"{f.relative_to(src)}:{node.name}", n))
        acc, keys, flds = meta_uses(tree)
        if acc:
            meta_access.append((str(f.relative_to(src)), acc))
        if flds:
            meta_fields.append(str(f.relative_to(src)))
        meta_keys |= keys
        edges = graph.setdefault(mod, set())
        for name, names in imports_of(tree, mod, f.name == "__init__.py"):
            for target in resolve(name, names, known):
                if target == mod:
                    continue
                edges.add(target)
                a, b = layer(mod), layer(target)
                if a is not None and b is not None and b > a:
                    upward.append(f"{mod} -> {target}")
            if name.split(".")[:2] != mod.split(".")[:2]:
                private += [f"{mod} -> {name}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    trainer_text = "\n".join(p.read_text() for p in (src / "trainer").glob("*.py"))
    variant_words = sorted({w for w in re.findall(r"\b(FBOS|UEC|EPA|ECC|explore)\b", trainer_text, flags=re.I)})
    res = {
        "files_over_400_lines": sorted(long_files, key=lambda x: -x[1]),
        "functions_over_80_lines": sorted(long_funcs, key=lambda x: -x[1]),
        "import_cycles": cycles(graph),
        "upward_imports": sorted(set(upward)),
        "private_cross_package_imports": sorted(set(private)),
        "trainer_mentions_variant_words": variant_words,
        "meta_keys": sorted(meta_keys),
        "meta_accesses": sorted(meta_access, key=lambda x: -x[1]),
        "meta_fields": meta_fields,
        "modules_without_layer": unlayered,
    }
    for k, v in res.items():
        print(f"{k}: {len(v) if isinstance(v, list) else v}")
        if isinstance(v, list):
            for x in v:
                print(f"    {x}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
