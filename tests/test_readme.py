"""The README's Python examples run as written.

The examples run in order, in groups, so that `pytest -n 2` can run the
groups side by side: a block joins the group of every earlier block that
binds a name it uses (other than by an import); each group runs in a fresh
namespace after the import statements of the blocks before it.
"""

import ast
import builtins
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(README, encoding="utf-8").read(), re.S)
# Blocks with "..." (a plugin's class body) or that start with "# sketch"
# (they need hardware or data a test machine lacks) are not run.
RUNNABLE = [
    b for b in BLOCKS if "    ...\n" not in b and not b.startswith("# sketch")
]


def _imports(block):
    """The block's top-level import statements and the names they bind."""
    statements, names = [], set()
    for node in ast.parse(block).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            statements.append(ast.unparse(node))
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
    return statements, names


def _names(block):
    """`(free, bound)`: the names the block reads without binding them
    itself (builtins aside), and the names it binds."""
    loaded, bound = set(), set()
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add(node.asname or node.name.split(".")[0])
    return loaded - bound - set(dir(builtins)), bound


def _groups(blocks):
    """`[(prelude, [block, ...]), ...]`: each group's blocks in README
    order, and the import statements of the other blocks before its last."""
    group_of = list(range(len(blocks)))  # union-find over block indices

    def root(i):
        while group_of[i] != i:
            i = group_of[i]
        return i

    binders = {}  # name -> the latest block that binds it other than by import
    for i, block in enumerate(blocks):
        free, bound = _names(block)
        for name in free & binders.keys():
            group_of[root(binders[name])] = root(i)
        imported = _imports(block)[1]
        binders.update({name: i for name in bound - imported})
    members = {}
    for i in range(len(blocks)):
        members.setdefault(root(i), []).append(i)
    groups = []
    for indices in sorted(members.values()):
        prelude = [
            statement
            for j in range(indices[-1]) if j not in indices
            for statement in _imports(blocks[j])[0]
        ]
        groups.append((prelude, [blocks[j] for j in indices]))
    return groups


GROUPS = _groups(RUNNABLE)


def test_readme_has_examples():
    assert len(RUNNABLE) >= 2
    # Every runnable block is in exactly one group.
    assert sorted(b for _, group in GROUPS for b in group) == sorted(RUNNABLE)


@pytest.mark.parametrize("index", range(len(GROUPS)))
def test_readme_examples_run_in_order(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prelude, blocks = GROUPS[index]
    namespace = {}
    exec(compile("\n".join(prelude), README, "exec"), namespace)
    for block in blocks:
        exec(compile(block, README, "exec"), namespace)


def test_a_block_runs_with_the_blocks_that_bind_its_names():
    blocks = ["import os\nx = 1\n", "import sys\n", "print(x, os.sep, sys)\n"]
    groups = _groups(blocks)
    assert [group for _, group in groups] == [[blocks[0], blocks[2]], [blocks[1]]]
    assert [prelude for prelude, _ in groups] == [["import sys"], ["import os"]]
