"""What ``ema=on`` costs per update, beside what a training step costs, on the same model.

For each model: the median time of a training step (forward, backward, SGD step: the hand loop
of bench/overhead.py, no framework) and of one EMA update (plugins/ema.py's
``WeightAverage.update``: one ``torch._foreach_lerp_`` over the parameters and floating
buffers), each timed over ``--steps`` repeats after a warm-up, the device synchronised only at
the ends. ``every_n_steps=k`` divides the update's share by k.

    python bench/ema.py                                  # mlp and small_resnet, batch 64
    python bench/ema.py --models resnet50 --batch-size 128 --image-size 224   # on a GPU
    python bench/ema.py --accuracy          # steps to 95% val acc, ema off | on, mlp on digits

``--accuracy`` trains model=mlp on data=digits (real handwritten digits, the tuneup[digits]
extra) for 4 epochs of 23 steps, seeds 0-2, scheduler=cosine and constant, with ema=off and
ema=on ema.decay=0.9, validating every 5 steps: the steps to 95% val acc (target=, docs/race.md)
and the final val acc of each run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import tuneup
from tuneup.plugins.ema import WeightAverage
from tuneup.trainer.components import Plan
from tuneup.trainer.task import classification_loss as cross_entropy


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def seconds_per_call(fn, calls: int, device: torch.device, repeats: int = 5) -> float:
    """The median over ``repeats`` of the mean time of ``calls`` back-to-back calls."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync(device)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure(model_name: str, batch_size: int, image_size: int | None, steps: int, device):
    overrides = [f"model={model_name}", f"data.batch_size={batch_size}"]
    if image_size:
        overrides.append(f"data.image_size={image_size}")
    plan = Plan(tuneup.compose(overrides))
    model = plan.build_model().to(device)
    x = torch.randn(batch_size, *plan.input_shape, device=device)
    y = torch.randint(0, plan.num_classes, (batch_size,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        cross_entropy(model(x), y).backward()
        optimizer.step()

    average = WeightAverage(model)
    step_s = seconds_per_call(step, steps, device)
    update_s = seconds_per_call(lambda: average.update(0.999), steps, device)
    values = sum(t.numel() for t in average.live)
    return {
        "model": model_name,
        "values": values,
        "step_ms": step_s * 1e3,
        "update_ms": update_s * 1e3,
        "share": update_s / step_s,
    }


def race(scheduler: str, seeds=(0, 1, 2)) -> dict[str, list[tuple]]:
    """(steps to 95% val acc, final val acc) of the mlp on digits per seed, ema off and on."""
    found: dict[str, list[tuple]] = {}
    for ema in ([], ["ema=on", "ema.decay=0.9"]):
        for seed in seeds:
            run_dir = Path(tempfile.mkdtemp(prefix="bench-ema-"))
            overrides = [
                "model=mlp",
                "data=digits",
                f"seed={seed}",
                "trainer.max_epochs=4",
                f"scheduler={scheduler}",
                "optimizer.lr=0.05",
                "target.metric=val/acc",
                "target.value=0.95",
                "target.check_every_n_steps=5",
                "checkpoint=off",
                "trainer.enable_progress_bar=false",
                "measure.console_table=false",
                *ema,
            ]
            tuneup.run(tuneup.compose(overrides), run_dir=run_dir)
            summary = json.loads((run_dir / "summary.json").read_text())
            found.setdefault(" ".join(ema) or "ema=off", []).append(
                (summary["steps_to_target"], summary["val"]["acc"])
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "small_resnet"])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--accuracy", action="store_true", help="val acc with ema off | on")
    args = parser.parse_args()
    if args.accuracy:
        print("| scheduler | ema | steps to 95% (seeds 0, 1, 2) | final val acc |")
        print("|---|---|---|---|")
        for scheduler in ("cosine", "constant"):
            for setting, runs in race(scheduler).items():
                steps = ", ".join(str(s) for s, _ in runs)
                accs = ", ".join(f"{a:.3f}" for _, a in runs)
                print(f"| {scheduler} | {setting} | {steps} | {accs} |")
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"device: {name}, {torch.get_num_threads()} threads, batch {args.batch_size}")
    print("| model | EMA values | step (ms) | EMA update (ms) | update / step |")
    print("|---|---|---|---|---|")
    for model_name in args.models:
        r = measure(model_name, args.batch_size, args.image_size, args.steps, device)
        print(
            f"| {r['model']} | {r['values']:,} | {r['step_ms']:.2f} | {r['update_ms']:.3f} "
            f"| {100 * r['share']:.1f}% |"
        )


if __name__ == "__main__":
    main()
