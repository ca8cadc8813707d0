"""autotune.md: the answer first, then the path the search took, then every trial."""

from __future__ import annotations

from pathlib import Path

from tuneup.report.cells import MIB, code, escape

MARKDOWN_FILE = "autotune.md"
LAUNCHED = ("accepted", "rejected")


def render_markdown(record: dict, sweep_dir: Path) -> str:
    settings = record["settings"]
    lines = [
        f"# Autotune: {Path(sweep_dir).name}",
        "",
        f"On {record['device']}: {record['elapsed_seconds'] / 60:.1f} min of a "
        f"{settings['budget_minutes']:g}-minute budget, {len(record['trials'])} trials of "
        f"{settings['trial_steps']} steps.",
        "",
        answer_line(record),
        "",
        f"Run it: `{record['recipe']['command']}` (the preset is "
        f"`{record['recipe']['file']}`; or copy it into your own `conf/experiment/`).",
        "",
        projection_line(record["projection"]),
        "",
        "## The path",
        "",
        *path_table(record),
    ]
    lines += unlaunched_and_batch(record)
    lines += ["", "## Trials", "", *_trial_table(record), "", *_method(settings)]
    return "\n".join(lines) + "\n"


def answer_line(record: dict) -> str:
    found = record["recipe"]["found"]
    if not found:
        return (
            "**Recipe: your command as it is.** No candidate was faster than it beyond the "
            "noise (see the path)."
        )
    facts = []
    speed_up = record["speed_up"]
    if speed_up:
        facts.append(
            f"{interval_text(speed_up)} the baseline's speed ({speed_up['verdict']}; "
            f"{speed_up['confidence']:.0%} interval, {speed_up['repeats']} interleaved rounds)"
        )
    base, mine = record["baseline_peak_memory_bytes"], record["recipe_peak_memory_bytes"]
    if base and mine:
        facts.append(
            f"peak memory {mine / MIB:,.0f} MiB against {base / MIB:,.0f} MiB (same rounds)"
        )
    return f"**Recipe: {code(' '.join(found))}**: {'; '.join(facts)}."


def projection_line(projection: dict) -> str:
    if "baseline" not in projection:
        return f"**Your full run**: no projection ({projection['from']})."
    unit, base, mine = projection["unit"], projection["baseline"], projection["recipe"]
    spread = mine.get("device_hours_range")
    text = (
        f"**Your full run** ({projection['samples']:,} samples: {projection['from']}; "
        f"{projection['world_size']} device(s)): {base['device_hours']:.3g} {unit} with your "
        f"command, {mine['device_hours']:.3g}"
        + (f" [{spread[0]:.3g}, {spread[1]:.3g}]" if spread else "")
        + f" with the recipe, {projection['saved_device_hours']:.3g} saved"
    )
    if base.get("energy_kwh") and mine.get("energy_kwh"):
        text += (
            f"; energy {base['energy_kwh']:.3g} kWh -> {mine['energy_kwh']:.3g} kWh (mean GPU "
            f"power {base['gpu_power_w']:.0f} W -> {mine['gpu_power_w']:.0f} W, NVML)"
        )
    else:
        text += "; no energy figure (needs an NVIDIA GPU and nvidia-ml-py: tuneup[power])"
    return text + ". Training steps only, at the trials' speeds."


def interval_text(interval: dict | None) -> str:
    if not interval:
        return "-"
    high = "inf" if interval["high"] is None else f"{interval['high']:.3g}"
    return f"{interval['estimate']:.3g}x [{interval['low']:.3g}, {high}]"


def unlaunched_and_batch(record: dict) -> list[str]:
    """The candidates never launched and why, and the batch-size search's notes (both
    objectives' autotune.md)."""
    lines = []
    never = [o for o in record["path"] if not o["trials"]]
    if never:
        lines += ["", "## Never launched", "", "| dimension | candidate | why |", "|---|---|---|"]
        lines += [
            f"| {o['dimension']} | {code(' '.join(o['candidate']) or '-')} | "
            f"{o['verdict']}: {escape(o['reason'])} |"
            for o in never
        ]
    if record["batch_notes"]:
        lines += ["", "## Batch size", "", *(f"- {note}" for note in record["batch_notes"])]
    return lines


def path_table(record: dict) -> list[str]:
    """The candidates launched, each against the recipe it was measured with (also the speed
    stage's path in the time-to-target autotune.md: report/stages_markdown.py)."""
    rows = [
        "| # | dimension | candidate | against | speed-up [interval] | rounds | peak memory "
        "(against's) | loss gap | outcome |",
        "|---:|---|---|---|---:|---:|---:|---:|---|",
    ]
    launched = [o for o in record["path"] if o["trials"]]
    for number, o in enumerate(launched, start=1):
        memory, gap, ref = o["peak_memory_bytes"], o["loss_gap"], o["reference_peak_memory_bytes"]
        rows.append(
            f"| {number} | {o['dimension']} | {code(o['label'])} | {code(o['against'])} | "
            f"{interval_text(o['interval'])} | {(o['interval'] or {}).get('repeats', 0)} | "
            f"{_memory(memory, ref)} | {'-' if gap is None else f'{gap * 100:.3g}%'} | "
            f"**{o['verdict']}**: {escape(o['reason'])} |"
        )
    if not launched:
        rows.append("| - | - | - | - | - | - | - | - | no candidate was launched |")
    return rows


def _trial_table(record: dict) -> list[str]:
    settings = record["settings"]
    rows = [
        "| job | configuration | speed (fastest window) | samples/s | windows | peak memory "
        "| seconds | status |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for t in record["trials"]:
        windows = [w for w in t["samples_per_s_windows"] or [] if w]
        spread = f"{min(windows):,.0f}-{max(windows):,.0f}" if windows else "-"
        memory = t["peak_memory_bytes"]
        status = t["status"] if not t["error"] else f"{t['status']}: {t['error']}"
        short = (t["steps"] or 0) < settings["trial_steps"] and not t["label"].startswith("probe")
        if t["status"] == "ok" and t["steps"] is not None and short:
            status += f" (stopped at {t['steps']} steps: autotune.trial_time_factor)"
        rows.append(
            f"| {t['job']} | {code(t['label'])} | {_number(t['speed'])} | "
            f"{_number(t['samples_per_s'])} | {spread} | "
            f"{'-' if memory is None else f'{memory / MIB:,.0f} MiB'} | {t['seconds']:.1f} | "
            f"{escape(status)} |"
        )
    return rows


def _method(settings: dict) -> list[str]:
    return [
        "## How it was measured",
        "",
        f"- Every trial is your command for {settings['trial_steps']} optimizer steps, with "
        "no validation and no checkpoints, on the same data in the same order from the same "
        "seed; trials run one at a time. The first trial (the baseline) also warms the "
        "process up: its speed is not compared.",
        "- A trial's speed is its fastest window of steps (samples/s): other work on the "
        "machine only slows windows down. The windows column shows each trial's spread.",
        "- Each candidate ran in rounds with the recipe so far, the order reversed every "
        f"round; its speed-up is the mean log ratio over the rounds with a "
        f"{settings['confidence']:.0%} Student's t interval. It is claimed only when the "
        f"interval excludes 1.0; at least {settings['min_rounds']} rounds, at most "
        f"{settings['max_rounds']} (more only for a candidate ahead but within noise).",
        f"- Accuracy guard: a candidate is rejected when its loss curve is more than "
        f"{settings['loss_tolerance']:.1%} from the baseline's at equal samples seen.",
        "- Memory: peak memory (CUDA allocator peak on GPU, process peak resident set on CPU), "
        "the median of the candidate's trials and, in brackets, of the recipe's trials in the "
        "same rounds: in one process a trial's resident set includes what earlier trials left.",
    ]


def _memory(peak, reference) -> str:
    if peak is None:
        return "-"
    return f"{peak / MIB:,.0f} MiB" + (f" ({reference / MIB:,.0f})" if reference else "")


def _number(value) -> str:
    return "-" if value is None else f"{value:,.1f}"
