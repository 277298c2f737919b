"""The package's shape stays what docs/design.md promises (issue 15): no
import cycle inside `keras_attention` (lazy imports in functions included),
no file over 600 lines, no function over 120 lines; every benchmark
prints its machine."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "keras_attention"
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 120


def module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def module_imports(name, path):
    """The package's modules that `name` imports, at module level or inside
    its functions (a lazy import closes a cycle as well, only later)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                if target in MODULES:
                    found.add(target)
                elif base in MODULES:
                    found.add(base)
    found.discard(name)
    return found


def import_cycles(graph):
    """The strongly connected components of more than one module."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle():
    graph = {name: module_imports(name, path) for name, path in MODULES.items()}
    assert sum(len(v) for v in graph.values()) > 100  # the scan sees imports
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_file_over_600_lines():
    long = {
        name: n
        for name, path in MODULES.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert long == {}, f"split these modules (lines): {long}"


def test_no_function_over_120_lines():
    long = {}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{name}.{node.name}"] = length
    assert long == {}, f"split these functions (lines): {long}"


def test_every_benchmark_prints_its_machine():
    """Issue 17: no figure without its machine (CPU model, instruction sets,
    cores, versions, load), so every benchmark script prints
    `benchmarks/machine.py`'s line."""
    benchmarks = ROOT.parent / "benchmarks"
    scripts = [
        p for p in sorted(benchmarks.glob("*.py"))
        if p.name.startswith(("bench_", "profile_", "train_", "gpu_"))
    ]
    assert scripts, "no benchmark scripts found"
    silent = [
        p.name for p in scripts
        if not any(
            marker in p.read_text(encoding="utf-8")
            for marker in ("describe()", "print_machine()")
        )
    ]
    assert silent == [], f"print the machine in: {silent}"


def test_no_benchmark_shadows_the_machine_line():
    """A script that imports `describe` from `machine.py` and defines its
    own `describe` too calls the wrong one: `bench_classification.py`
    stopped on `describe()` (a TypeError) before measuring anything."""
    benchmarks = ROOT.parent / "benchmarks"
    shadowed = []
    for path in sorted(benchmarks.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = any(
            isinstance(node, ast.ImportFrom) and node.module == "machine"
            and any((a.asname or a.name) == "describe" for a in node.names)
            for node in tree.body
        )
        defined = any(
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == "describe"
            for node in tree.body
        )
        if imported and defined:
            shadowed.append(path.name)
    assert shadowed == [], f"rename the local describe() in: {shadowed}"


CHECKOUT_ROOT_MARKERS = (
    "os.path.dirname(os.path.dirname(os.path.abspath(__file__)))",
    "os.path.dirname(HERE)",
)


def test_every_benchmark_measures_this_checkout():
    """A benchmark run as `python benchmarks/x.py` has `benchmarks/` on its
    path, not the checkout: without the checkout's root put first it imports
    whichever `keras_attention` is installed (an editable install of another
    checkout here), so its figures would belong to other code. The root must
    go on the path before the first module-level `keras_attention` import
    (or, where the imports are all inside functions, somewhere in the
    script)."""
    benchmarks = ROOT.parent / "benchmarks"
    wrong = []
    for path in sorted(benchmarks.glob("*.py")):
        if not path.name.startswith(("bench_", "profile_", "train_", "gpu_")):
            continue
        text = path.read_text(encoding="utf-8")
        if "keras_attention" not in text:
            continue
        lines = text.splitlines()
        marked = [
            i for i, line in enumerate(lines, 1)
            if any(m in line for m in CHECKOUT_ROOT_MARKERS)
        ]
        first_import = min(
            (
                node.lineno for node in ast.parse(text).body
                if isinstance(node, ast.Import)
                and any(a.name.split(".")[0] == "keras_attention" for a in node.names)
                or isinstance(node, ast.ImportFrom)
                and (node.module or "").split(".")[0] == "keras_attention"
            ),
            default=None,
        )
        if not marked or (first_import is not None and marked[0] > first_import):
            wrong.append(path.name)
    assert wrong == [], f"put the checkout first on sys.path in: {wrong}"


def test_the_serializable_decorator_registers_no_private_function():
    # A helper function put between `@register_keras_serializable` and its
    # class took the registration: the class's `.keras` files no longer
    # loaded ("Could not locate class 'TextClassifierBackbone'"). Public
    # functions (an activation, a metric) are registered on purpose.
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.name.startswith("_")
            ):
                for decorator in node.decorator_list:
                    if "register_keras_serializable" in ast.unparse(decorator):
                        found.append(f"{name}.{node.name}")
    assert not found, found


def test_every_exported_layer_and_model_is_registered():
    import keras

    import keras_attention.applications
    import keras_attention.layers

    bases = {"Translator"}  # never built itself: its subclasses are saved
    unregistered = []
    for package in (keras_attention.layers, keras_attention.applications):
        for name in dir(package):
            value = getattr(package, name)
            if (
                isinstance(value, type)
                and issubclass(value, keras.layers.Layer)
                and value.__module__.startswith("keras_attention")
                and name not in bases
                and not keras.saving.get_registered_name(value).startswith(
                    "keras_attention>"
                )
            ):
                unregistered.append(name)
    assert not unregistered, unregistered
