"""The typed stubs (nexar/_core.pyi) name what the compiled module has, and the reverse."""

import ast
import pathlib

import nexar
from nexar import _core

STUB = pathlib.Path(__file__).resolve().parents[2] / "python" / "nexar" / "_core.pyi"


def stub_names():
    tree = ast.parse(STUB.read_text())
    top, classes = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
            classes[node.name] = members
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
    return top, classes


def public(obj):
    if hasattr(obj, "__members__"):  # a pybind11 enum: its values
        return set(obj.__members__)
    return {n for n in dir(obj) if not n.startswith("_")}


def test_module_level_names_match():
    top, _ = stub_names()
    assert public(_core) <= top, public(_core) - top
    assert {n for n in top if not n[0] == "_"} - {"Buffer", "Seconds", "DTypeLike"} <= public(_core)


def test_class_members_match():
    _, classes = stub_names()
    for name, members in classes.items():
        cls = getattr(_core, name)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            continue
        have = public(cls)
        assert have <= members, f"{name}: missing in the stub: {sorted(have - members)}"
        assert {m for m in members if not m.startswith("_")} <= have, \
            f"{name}: only in the stub: {sorted({m for m in members if not m.startswith('_')} - have)}"


def test_package_exports():
    for n in ("init", "bootstrap_local", "Communicator", "Error", "Request", "SUM", "wait_all"):
        assert n in nexar.__all__
