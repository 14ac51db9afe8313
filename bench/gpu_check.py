"""The checks of bench/gpu_check.sh, one line each; a failed check prints its error and the next one still runs.
Exit status: 0 when every check that ran passed (or no GPU: nothing ran), 1 otherwise."""
from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from clfjudge import machine

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_check_out")
# --cpu: the same checks on the CPU, to test this script where no GPU is (each check then expects the CPU's choice)
DEVICE = "cpu" if "--cpu" in sys.argv else "cuda"
failed: list[str] = []


def check(name: str, run: Callable[[], str]) -> None:
    start = time.monotonic()
    try:
        detail = run()
        print(f"gpu_check {name}: ok ({time.monotonic() - start:.1f} s) {detail}", flush=True)
    except Exception as e:  # noqa: BLE001 - report and go on to the next check
        failed.append(name)
        print(f"gpu_check {name}: FAIL ({time.monotonic() - start:.1f} s) {type(e).__name__}: {e}", flush=True)
        traceback.print_exc(limit=4, file=sys.stderr)


def probe() -> str:
    caps = {name: c.as_dict() for name, c in machine.probe().capabilities().items()}
    (OUT / "machine.json").write_text(json.dumps(machine.describe(), indent=2))
    return json.dumps({k: caps[k] for k in ("cuda", "cuda_bf16", "onnxruntime_cuda")})


def backbone() -> Path:
    from clfjudge.testing import tiny_llama

    path = OUT / "tiny-llama"
    if not path.exists():
        tiny_llama(path)
    return path


def fine_tune() -> str:
    from clfjudge.card import JudgeCard
    from clfjudge.training.config import TrainConfig
    from clfjudge.training.trainer import train

    cfg = TrainConfig.from_dict({
        "backbone": str(backbone()), "head": "cls3", "sources": ["pandalm-test"], "max_length": 384,
        "dev_fraction": 0.3, "batch_size": 4, "max_steps": 4, "eval_every": 4, "logging_steps": 1,
        "early_stopping_patience": 0, "precision": "bf16", "output_dir": str(OUT / "cls3")})
    card = JudgeCard.load(train(cfg))
    expected = machine.training_precision("bf16")[0]
    if card.training.get("precision") != expected:
        raise AssertionError(f"trained in {card.training.get('precision')}, not {expected}")
    return f"precision {card.training['precision']}, dev {card.validation.get('dev', {}).get('accuracy')}"


def reader_judge() -> str:
    from clfjudge.card import JudgeCard
    from clfjudge.configs import config_path
    from clfjudge.training.config import TrainConfig
    from clfjudge.training.trainer import train

    cfg = TrainConfig.from_yaml(config_path("recipes/main-smollm2.yaml"), [
        f"backbone={backbone()}", f"embedding.device={DEVICE}", "embedding.precision=auto", "embedding.layer=1",
        "sources=[pandalm-test]", "decontaminate_against=[]",  # what the test fixtures' data holds
        "max_train_records=48", "max_dev_records=16", "eval_sources=[]", f"output_dir={OUT / 'reader'}"])
    card = JudgeCard.load(train(cfg))
    read_in, expected = card.runtime.get("read_in", {}), machine.decoder_precision("auto", DEVICE)[0]
    if read_in.get("precision") != expected:
        raise AssertionError(f"read in {read_in}, not {expected}")
    return f"read in {read_in}"


def export_cuda() -> str:
    from clfjudge.export.onnx import export_judge

    result = export_judge(OUT / "cls3", OUT / "cls3-onnx", n_records=16, providers=[DEVICE])
    key = "model.onnx" if DEVICE == "cpu" else f"model.onnx @ {DEVICE}"
    if key not in result.report["variants"]:
        raise AssertionError(f"the gate did not run {key}: {sorted(result.report['variants'])}")
    gate = result.report["variants"][key]
    return f"{key}: passed {gate['passed']}, agreement {gate['agreement']}, {gate['records_per_s']} records/s"


def score_cuda() -> str:
    from clfjudge.judges.base import Judge

    judge = Judge.load(OUT / "cls3-onnx", provider=DEVICE)
    items = [{"question": f"What is {i} + {i}?", "answer_a": str(2 * i), "answer_b": str(2 * i + 1)}
             for i in range(64)]
    start = time.monotonic()
    results = judge.compare_batch(items)
    if len(results) != len(items):
        raise AssertionError(f"{len(results)} results for {len(items)} items")
    return f"{len(items)} pairs in {time.monotonic() - start:.2f} s ({judge.runtime_choice})"


def verdict() -> str:
    """A verdict judge (a tiny random chat LLaMA asked "is this answer correct?") read on the device in its auto
    precision, against the CPU in fp32, and its shared-prefix reading against whole prompts on the device."""
    import numpy as np

    from clfjudge.judges.base import Judge
    from clfjudge.judges.verdict import questions_from, verdict_card
    from clfjudge.testing import tiny_llama

    model = tiny_llama(OUT / "tiny-chat", chat=True)
    answers = ["Because of Rayleigh scattering.", "7", "The sky reflects the ocean.", "Blue light scatters more."]
    items = [{"question": "Why is the sky blue? Explain it to a child in two sentences, naming the effect.",
              "answer": a} for a in answers] + [{"question": "Name a prime.", "answer": a} for a in ("7", "9")]
    runs = {}
    for name, precision, provider in (("cpu-fp32", "fp32", "cpu"), ("device", "auto", DEVICE)):
        directory = OUT / f"verdict-{name}"
        directory.mkdir(exist_ok=True)
        verdict_card(str(model), questions_from(["correct"], "gpu_check"), precision=precision).save(directory)
        judge = Judge.load(directory, provider=provider)
        runs[name] = np.array([s.value for s in judge.score_batch(items)])
    judge.reader.share_prefix, judge.reader.memory = False, type(judge.reader.memory)(1024)
    whole = np.array([s.value for s in judge.score_batch(items)])
    gap = float(np.abs(runs["device"] - runs["cpu-fp32"]).max())
    share_gap = float(np.abs(runs["device"] - whole).max())
    if share_gap > 0.05 or gap > 0.1:
        raise AssertionError(f"log-odds differ: device vs CPU fp32 {gap:.3g}, shared vs whole {share_gap:.3g}")
    return f"{judge.runtime_choice}; max |device - CPU fp32| {gap:.2g}, shared vs whole {share_gap:.2g}"


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    check("probe", probe)
    if DEVICE == "cuda" and not machine.probe().cuda():
        print(f"gpu_check: not run: {machine.probe().cuda().why}", flush=True)
        return 0
    for name, run in (("fine-tune (bf16 asked)", fine_tune), ("reader (precision auto)", reader_judge),
                      (f"verdict ({DEVICE})", verdict)):
        check(name, run)
    # the ONNX checks need onnxruntime's CUDA provider (the onnxruntime-gpu wheel): a machine without it says why
    ort_cuda = machine.probe().capabilities()["onnxruntime_cuda"] if DEVICE == "cuda" else None
    for name, run in ((f"export + gate ({DEVICE})", export_cuda), (f"score ({DEVICE})", score_cuda)):
        if ort_cuda is not None and not ort_cuda:
            print(f"gpu_check {name}: not run: {ort_cuda.why}", flush=True)
        else:
            check(name, run)
    print(f"gpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
