"""A logged ``model.custom`` network is self-contained: its module travels in the model's code
paths, and so do the dbspec modules the served model imports (only those), its requirements are
installable pins, and it loads and scores in a fresh process in another directory with no
``PYTHONPATH``, the original module gone and dbspec not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dbspec.models.portable import (PortabilityError, custom_code, installable_version, pin,
                                    served_modules)
from tests.conftest import run_main as run

PACKAGE = "dbspec_selfnet_zz"  # a name nothing else imports: the run imports it in this process

LAYERS = """\
import torch
from torch import nn

from .blocks import hidden_block


class TinyNet(nn.Module):
    def __init__(self, in_features, out_features, hidden=8):
        super().__init__()
        self.body = hidden_block(in_features, hidden)
        self.head = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.head(self.body(x))
"""

BLOCKS = """\
from torch import nn


def hidden_block(width, hidden):
    return nn.Sequential(nn.Linear(width, hidden), nn.Tanh())
"""

SPEC = f"""\
name: self-contained
data: {{source: {{kind: sklearn, name: diabetes}}, task: regression,
       preprocessing: [standard_scale]}}
model: {{custom: {{class: "{PACKAGE}.layers:TinyNet", kwargs: {{hidden: 8}}}}}}
training: {{epochs: 2, batch_size: 64}}
tracking: {{system_metrics: false}}
registry: {{name: self_contained_net}}
"""


def _forget(prefix: str) -> None:
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One run of a custom package network; the package is deleted afterwards."""
    from sklearn.datasets import load_diabetes

    from dbspec.models.served import load_served_model

    source = tmp_path_factory.mktemp("user_code")
    (source / PACKAGE).mkdir()
    (source / PACKAGE / "__init__.py").write_text("")
    (source / PACKAGE / "layers.py").write_text(LAYERS)
    (source / PACKAGE / "blocks.py").write_text(BLOCKS)
    workdir = tmp_path_factory.mktemp("project")
    (workdir / "spec.yaml").write_text(SPEC)
    previous, saved = Path.cwd(), os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(workdir)
    sys.path.insert(0, str(source))
    try:
        code, out, err = run("run", "spec.yaml", "--summary-json", "s.json")
        assert code == 0, err
        frame = load_diabetes(as_frame=True).data.head(25)
        served = load_served_model(workdir / ".dbspec/runs/self-contained/stages/train/served")
        expected = served.predict_frame(frame)["prediction"].tolist()
    finally:
        os.chdir(previous)
        sys.path.remove(str(source))
        _forget(PACKAGE)
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    shutil.rmtree(source)  # the loaded model can only get the package from its own code paths
    frame.to_json(workdir / "rows.json", orient="split")
    yield {"workdir": workdir, "source": source, "expected": expected,
           "summary": json.loads((workdir / "s.json").read_text()),
           "tracking_uri": f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}"}


PYFUNC = """\
import importlib.machinery, json, sys
from pathlib import Path


class DbspecNotInstalled:  # dbspec only from the model's code/, as where it is not installed
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "dbspec":
            return None
        found = importlib.machinery.PathFinder.find_spec(name, sys.path)
        if found is None or Path(found.origin).parent.parent.name != "code":
            raise ModuleNotFoundError("No module named 'dbspec' (not installed here)")
        return found


sys.meta_path.insert(0, DbspecNotInstalled)
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model("models:/self_contained_net/1")
out = model.predict(pd.read_json(sys.argv[1], orient="split"))
import dbspec, {package}
print(json.dumps({{"prediction": out["prediction"].tolist(), "net": {package}.__file__,
                  "dbspec": dbspec.__file__, "path": sys.path}}))
"""

SERVE = """\
import json, sys
import mlflow, pandas as pd
from dbspec.serving.source import ModelTarget, load_version
loaded = load_version(mlflow.MlflowClient(), ModelTarget("self_contained_net", version="1"), "1")
out = loaded.model.predict_frame(pd.read_json(sys.argv[1], orient="split"))
import {package}
print(json.dumps({{"prediction": out["prediction"].tolist(), "net": {package}.__file__,
                  "path": sys.path}}))
"""


def test_the_registered_model_scores_in_a_fresh_process_elsewhere(trained, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["MLFLOW_TRACKING_URI"] = trained["tracking_uri"]
    rows = str(trained["workdir"] / "rows.json")
    scripts = {"pyfunc": PYFUNC, "dbspec serve": SERVE}
    processes = {name: subprocess.Popen(
        [sys.executable, "-c", script.format(package=PACKAGE), rows], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, script in scripts.items()}  # both at once: each pays for importing torch
    for name, process in processes.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"{name}: {err[-3000:]}"
        result = json.loads(out.strip().splitlines()[-1])
        assert not any(str(trained["source"]) in p for p in result["path"])
        assert Path(result["net"]).parent.parent.name == "code", result["net"]
        assert result["prediction"] == pytest.approx(trained["expected"], rel=1e-6, abs=1e-6)
        if name == "pyfunc":  # dbspec too came from the model, not from this checkout
            assert Path(result["dbspec"]).parent.parent.name == "code", result["dbspec"]


def test_the_model_carries_its_code_and_installable_pins(trained, tmp_path):
    import mlflow
    import torch

    import dbspec

    client = mlflow.MlflowClient(tracking_uri=trained["tracking_uri"])
    local = Path(mlflow.artifacts.download_artifacts(
        artifact_uri=client.get_model_version_download_uri("self_contained_net", "1"),
        dst_path=str(tmp_path), tracking_uri=trained["tracking_uri"]))
    code = local / "code"
    assert sorted(p.name for p in code.iterdir()) == sorted(["dbspec", PACKAGE])
    # of dbspec, only what the served model imports: not the CLI, training, serving, ...
    shipped = sorted(p.relative_to(code).as_posix() for p in (code / "dbspec").rglob("*.py"))
    checkout = Path(dbspec.__file__).parent.parent
    needed = sorted(path.relative_to(checkout).as_posix()
                    for path in served_modules("dbspec.models.pyfunc").values())
    assert shipped == needed
    assert not [p for p in shipped if p.startswith("dbspec/cli/")]
    assert "dbspec/models/served.py" in shipped
    assert sorted(p.name for p in (code / PACKAGE).iterdir()) == [
        "__init__.py", "blocks.py", "layers.py"]
    requirements = (local / "requirements.txt").read_text().split()
    assert f"torch=={installable_version(torch.__version__)}" in requirements
    assert not [r for r in requirements if "+" in r], requirements
    for name in ("conda.yaml", "python_env.yaml"):
        pins = [line for line in (local / name).read_text().splitlines() if "==" in line]
        assert pins and not [line for line in pins if "+" in line], name


def test_installable_versions():
    assert installable_version("2.13.0+cpu") == "2.13.0"
    assert installable_version("2.5.1+cu121") == "2.5.1"
    assert installable_version("3.17.2") == "3.17.2"
    assert "+" not in pin("torch")


@pytest.fixture
def importable(tmp_path, monkeypatch):
    """Write ``{relative path: source}`` under a directory on ``sys.path``; forget the modules
    afterwards."""
    written: list[str] = []

    def write(files: dict[str, str], root: Path = tmp_path / "src") -> Path:
        for relative, text in files.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(textwrap.dedent(text))
            written.append(Path(relative).parts[0].removesuffix(".py"))
        monkeypatch.syspath_prepend(str(root))
        return root

    yield write
    for name in written:
        _forget(name)


NET = "from torch import nn\nclass Net(nn.Linear):\n    pass\n"


def test_what_travels(importable):
    root = importable({"dbspec_single_zz.py": NET, "dbspec_pkg_zz/sub/net.py": NET})
    single = custom_code({"custom": {"class": "dbspec_single_zz:Net"}})
    assert single.code_paths == [str((root / "dbspec_single_zz.py").resolve())]
    # a namespace package (no __init__.py) travels as its directory, too
    package = custom_code({"custom": {"class": "dbspec_pkg_zz.sub.net:Net"}})
    assert package.code_paths == [str((root / "dbspec_pkg_zz").resolve())]
    installed = custom_code({"custom": {"class": "torch.nn:Linear"}})
    assert installed.code_paths == [] and installed.requirements == [pin("torch")]
    assert custom_code({"layers": [{"linear": {"out": 1}}], "custom": None}).code_paths == []


def test_what_cannot_travel(importable, tmp_path, monkeypatch):
    with pytest.raises(PortabilityError, match="defined in __main__"):
        custom_code({"custom": {"class": "__main__:Net"}})
    importable({"dbspec_loose_zz.py": NET}, root=tmp_path / "lib" / "site-packages")
    with pytest.raises(PortabilityError, match="no installed distribution provides it"):
        custom_code({"custom": {"class": "dbspec_loose_zz:Net"}})
    root = importable({"dbspec_project_zz/__init__.py": NET})
    monkeypatch.chdir(root / "dbspec_project_zz")
    with pytest.raises(PortabilityError, match="it holds the working directory"):
        custom_code({"custom": {"class": "dbspec_project_zz:Net"}})


UNTRAVELLABLE = """\
name: untravellable
data: {source: {kind: sklearn, name: diabetes}, task: regression}
model: {custom: {class: "__main__:DbspecScriptNet"}}
training: {epochs: 1}
tracking: {system_metrics: false}
registry: {name: never_registered_zz}
"""


def test_a_class_in_main_fails_the_run_cleanly(workdir, monkeypatch):
    import mlflow
    from torch import nn

    class DbspecScriptNet(nn.Linear):
        pass

    monkeypatch.setattr(sys.modules["__main__"], "DbspecScriptNet", DbspecScriptNet,
                        raising=False)
    # as in `python script.py`: a script's __main__ has no spec (importlib's find_spec then
    # raised ValueError, a traceback instead of the reason)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    (workdir / "spec.yaml").write_text(UNTRAVELLABLE)
    code, _, err = run("run", "spec.yaml")
    assert code == 1
    assert "model.custom.class: __main__:DbspecScriptNet is defined in __main__" in err, err
    assert "Traceback" not in err
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / '.dbspec' / 'mlflow.db'}")
    assert client.search_registered_models() == []
    experiments = [e.experiment_id for e in client.search_experiments()]
    assert client.search_runs(experiments) == []  # refused before any stage, not after training
