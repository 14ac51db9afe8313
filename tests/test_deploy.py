"""The repository's export/: presets the CLI accepts (export/*.yaml), and the container recipe (export/Dockerfile),
whose start command is run here as written against a tiny exported judge, without the packages it leaves out,
until its own health check passes."""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from clfjudge.cli import main
from clfjudge.export.presets import OPTIONS, load_preset

REPO = Path(__file__).resolve().parents[1]
EXPORT = REPO / "export"


# -- presets ------------------------------------------------------------------------------------------------

def test_the_presets_cover_fp32_int8_per_isa_int4_openvino_bf16_and_cuda():
    presets = {p.stem: load_preset(p) for p in sorted(EXPORT.glob("*.yaml"))}
    isas = sorted((yaml.safe_load((REPO / "clfjudge/configs/int8.yaml").read_text()) or {})["isa"])
    assert presets["fp32"] == {"int8": False, "optimize": False, "fallback": False}
    for isa in isas:  # one int8 preset per instruction set int8.yaml has settings for
        assert presets[f"int8-{isa.replace('_', '-')}"]["int8"] is True
        assert presets[f"int8-{isa.replace('_', '-')}"]["isa"] == isa
    assert presets["int4"] == {"int4": True, "fallback": False}
    assert presets["openvino-bf16"]["providers"] == ["openvino-bf16"]
    assert presets["cuda"]["providers"] == ["cuda"]
    for name in presets:  # each says what it is and how to use it
        assert f"--preset export/{name}.yaml" in (EXPORT / f"{name}.yaml").read_text()


@pytest.mark.parametrize("text,message", [
    ("int8: true\nisa: avx9\n", r"x.yaml: key 'isa': expected one of auto, .*got 'avx9'"),
    ("int8: yes please\n", r"x.yaml: key 'int8': expected true or false, got 'yes please'"),
    ("int9: true\n", r"x.yaml: unknown key 'int9' \(did you mean 'int8'\?\); known: int8, "),
    ("provider: [openvino-fp64]\n", r"x.yaml: key 'provider': unknown provider\(s\) \['openvino-fp64'\]"),
    ("n: 0\n", r"x.yaml: key 'n': expected a positive integer, got 0"),
    ("int8: true\n  isa: [\n", r"x.yaml, line 2: not valid YAML"),
    ("- int8\n", r"x.yaml: expected a mapping of clfjudge export options"),
])
def test_a_bad_preset_names_the_file_and_the_key(tmp_path, text, message):
    (tmp_path / "x.yaml").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_preset(tmp_path / "x.yaml")


def test_every_preset_key_is_an_export_option_and_parity_config_is_relative_to_the_preset(tmp_path):
    from clfjudge.cli import build_parser

    args = build_parser().parse_args(["export", "judge", "--out", "o"])
    assert all(hasattr(args, dest) for dest, _ in OPTIONS.values())
    (tmp_path / "p.yaml").write_text("parity_config: gate.yaml\nthreshold: int8.min_agreement=0.98\nn: 64\n")
    assert load_preset(tmp_path / "p.yaml") == {"parity_config": str(tmp_path / "gate.yaml"),
                                                "thresholds": ["int8.min_agreement=0.98"], "n_records": 64}


def test_clfjudge_export_takes_a_preset_and_options_given_override_it(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from clfjudge.export import gate, onnx

    calls = []

    def fake_export(judge_dir, out_dir, options):
        calls.append(options)
        return SimpleNamespace(out_dir=out_dir, primary="model.onnx", report={
            "validation": {"n": 0, "source": "none", "batch_size": 1}, "variants": {},
            "export": {"exporter": "fake", "opset": 17}})

    monkeypatch.setattr(onnx, "export_judge", fake_export)
    monkeypatch.setattr("clfjudge.judges.base.open_judge", lambda *_: None)  # no judge directory: "judge" is a name
    monkeypatch.setattr(gate, "served", lambda report: {"file": "model.onnx", "provider": "cpu", "records_per_s": 1})
    preset = str(EXPORT / "int8-avx2.yaml")
    assert main(["export", "judge", "--out", str(tmp_path / "a"), "--preset", preset]) == 0
    assert calls[-1].int8 is True and calls[-1].isa == "avx2" and calls[-1].fallback is False
    assert "preset " + preset + ": int8=True, isa=avx2, fallback=False" in capsys.readouterr().out
    assert main(["export", "judge", "--out", str(tmp_path / "b"), "--preset", preset, "--isa", "arm64",
                 "--fallback", "--provider", "openvino"]) == 0
    assert calls[-1].isa == "arm64" and calls[-1].fallback is True and calls[-1].int8 is True
    assert calls[-1].providers == ("openvino",) and calls[-1].int4 is None
    assert main(["export", "judge", "--out", str(tmp_path / "d"), "--preset", str(EXPORT / "int4.yaml")]) == 0
    assert calls[-1].int4 is True and calls[-1].int8 is False
    assert main(["export", "judge", "--out", str(tmp_path / "c"), "--preset", str(tmp_path / "none.yaml")]) == 2
    assert "export preset" in capsys.readouterr().err and len(calls) == 3


# -- the container recipe --------------------------------------------------------------------------------------

# pyproject's dependencies that export/requirements-serve.txt leaves out (distribution -> module): the server runs
# with them unimportable, as in the image. The rest of pyproject's list comes in as dependencies of what it installs.
LEFT_OUT = {"torch": "torch", "accelerate": "accelerate", "datasets": "datasets", "deepspeed": "deepspeed",
            "sentence-transformers": "sentence_transformers", "scikit-learn": "sklearn", "scipy": "scipy",
            "onnxscript": "onnxscript", "sentencepiece": "sentencepiece", "gguf": "gguf",
            "matplotlib": "matplotlib", "skops": "skops"}

BLOCKER = """\
import importlib.machinery, os
_BLOCKED = set(os.environ["CLFJUDGE_TEST_BLOCKED"].split(","))
_find = importlib.machinery.PathFinder.find_spec
def _find_spec(name, path=None, target=None):
    if name.split(".")[0] in _BLOCKED:
        with open(os.environ["CLFJUDGE_TEST_BLOCK_LOG"], "a") as log:
            log.write(name + "\\n")
        return None  # as if it were not installed
    return _find(name, path, target)
importlib.machinery.PathFinder.find_spec = staticmethod(_find_spec)
"""


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per instruction, comments dropped, continuation lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            name = re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].lower()
            pins[name] = line
    return pins


def test_the_image_installs_pyprojects_pins_and_copies_what_the_context_has():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = _pins(project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds])
    serve = _pins((EXPORT / "requirements-serve.txt").read_text().splitlines())
    assert {name: pin for name, pin in serve.items() if name in declared} == {n: declared[n] for n in serve
                                                                              if n in declared}
    assert set(serve) - set(declared) == {"jinja2"}  # chat templates: transformers brings it only with torch
    assert set(LEFT_OUT) <= set(_pins(project["dependencies"])) and not set(LEFT_OUT) & set(serve)
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copies = [shlex.split(rest)[:-1] for op, rest in _instructions(EXPORT / "Dockerfile") if op == "COPY"]
    sources = [s for c in copies for s in c if not s.startswith("${")]
    assert sources == ["export/requirements-serve.txt", "pyproject.toml", "README.md", "clfjudge"]
    for src in sources:
        assert (REPO / src).exists() and src.split("/")[0] not in ignored, src


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def exported_judge(tmp_path_factory, tiny_bert_dir) -> Path:
    from tiny_judges import make_judge

    from clfjudge.export.onnx import export_judge

    root = tmp_path_factory.mktemp("deploy")
    return export_judge(make_judge(tiny_bert_dir, root / "judge"), root / "onnx", n_records=8).out_dir


def test_the_images_start_command_serves_an_exported_judge_without_the_training_stack(exported_judge, tmp_path):
    steps = dict(_instructions(EXPORT / "Dockerfile"))
    command = steps["CMD"]  # shell form: the image's ENV gives JUDGE_DIR, HOST and PORT
    health = steps["HEALTHCHECK"].split(" CMD ", 1)[1]
    assert {"JUDGE_DIR", "HOST", "PORT"} <= {kv.split("=")[0] for kv in shlex.split(steps["ENV"])}
    assert command.startswith("exec clfjudge serve ")
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "clfjudge").exists(), f"no clfjudge script beside {sys.executable}: pip install -e . first"
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "JUDGE_DIR": str(exported_judge),
           "HOST": "127.0.0.1", "PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")]),
           "CLFJUDGE_TEST_BLOCKED": ",".join(LEFT_OUT.values()), "CLFJUDGE_TEST_BLOCK_LOG": str(tmp_path / "log")}
    server = subprocess.Popen(["sh", "-c", command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while subprocess.run(["sh", "-c", health], env=env, capture_output=True).returncode != 0:
            assert server.poll() is None, f"the server stopped:\n{server.stdout.read()[-3000:]}"
            assert time.monotonic() < deadline, "the health check never passed"
            time.sleep(0.5)
        url = f"http://127.0.0.1:{env['PORT']}"
        got = httpx.post(f"{url}/compare", json={"question": "Name a prime.", "answer_a": "7", "answer_b": "9"},
                         timeout=30)
        assert got.status_code == 200 and got.json()["verdict"] in ("A", "B", "TIE")
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    assert subprocess.run(["sh", "-c", health], env=env, capture_output=True).returncode != 0  # it can fail
    assert "torch" in (tmp_path / "log").read_text().split()  # the server ran without PyTorch: it looked for it
