"""No pickle anywhere in vlarun: no pickle-family import, no call that unpickles (torch.load,
except torch.load(weights_only=True) in apps/convert.py; np.load without allow_pickle=False;
pyzmq's send/recv_pyobj),
checked on the syntax tree of every module so a docstring that mentions pickle does not count
and an alias cannot hide."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vlarun"
BANNED_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "cloudpickle",
    "dill",
    "joblib",
    "shelve",
    "marshal",
    "copyreg",
}
BANNED_ATTRS = {"recv_pyobj", "send_pyobj", "read_pickle", "to_pickle", "Unpickler"}


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [(node.module or "").split(".")[0]]
        else:
            names = []
        out += [f"{path}:{node.lineno} imports {n}" for n in names if n in BANNED_MODULES]
        if isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRS:
            out.append(f"{path}:{node.lineno} uses {node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            owner_name = owner.id if isinstance(owner, ast.Name) else ""
            converter = path.name == "convert.py" and path.parent.name == "apps"
            restricted = converter and _literal(node, "weights_only", True)
            if node.func.attr == "load" and owner_name == "torch" and not restricted:
                out.append(f"{path}:{node.lineno} calls torch.load (unpickles)")
            numpy_load = node.func.attr == "load" and owner_name in ("np", "numpy")
            if numpy_load and not _literal(node, "allow_pickle", False):
                out.append(f"{path}:{node.lineno} calls np.load without allow_pickle=False")
    return out


def _literal(call: ast.Call, keyword: str, value: bool) -> bool:
    """Whether ``call`` passes ``keyword=value`` as a literal (not a variable that could vary)."""
    return any(
        k.arg == keyword and isinstance(k.value, ast.Constant) and k.value.value is value
        for k in call.keywords
    )


def test_the_checker_flags_unpickling_calls(tmp_path):
    """torch.load is allowed only as torch.load(..., weights_only=True) - torch's restricted
    unpickler that rebuilds tensors and plain containers and refuses everything else - and only
    in apps/convert.py (``vlarun convert`` of OpenVLA-OFT's pickled heads, once, never at run
    time; no loader or wire module imports it)."""
    (tmp_path / "apps").mkdir()
    bad = tmp_path / "apps" / "convert.py"
    bad.write_text(
        "import torch\nimport numpy as np\nflag = True\n"
        "torch.load('a.pt')\ntorch.load('a.pt', weights_only=False)\n"
        "torch.load('a.pt', weights_only=flag)\nnp.load('a.npy')\n"
        "torch.load('a.pt', weights_only=True)\nnp.load('a.npy', allow_pickle=False)\n"
    )
    lines = sorted(int(p.rsplit(":", 1)[1].split()[0]) for p in _problems(bad))
    assert lines == [4, 5, 6, 7]
    elsewhere = tmp_path / "checkpoint.py"  # the allowed form anywhere else is flagged too
    elsewhere.write_text("import torch\ntorch.load('a.pt', weights_only=True)\n")
    assert len(_problems(elsewhere)) == 1


def test_no_pickle_anywhere_in_vlarun():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20
    problems = [p for f in files for p in _problems(f)]
    assert problems == []


def test_the_checker_catches_pickle(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle as p\nimport numpy as np\nnp.load('x')\nsock.recv_pyobj()\n")
    assert len(_problems(bad)) == 3


def test_no_loader_or_wire_module_imports_the_converter():
    """The checkpoint loaders, the wire and everything that serves inference never import the
    module that may read a pickle: only the `vlarun convert` command does."""
    importers = [
        f
        for f in sorted(PACKAGE.rglob("*.py"))
        if "vlarun.apps.convert" in f.read_text() and f.name not in ("convert.py", "model.py")
    ]
    assert importers == []
