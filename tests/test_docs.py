"""README.md, the docs/ pages its sections moved to, and benchmarks/gpu/README.md against the recorded files they quote:
a measured figure names the file it comes from, every file named exists, and the claims issue 28 corrected read what
their files (or the plan) say. README's first screen (issue 44): what to type on a CPU box and on GPUs, and a verdict
that is run.py's own output."""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, fresh_clone, planned, run_py

from grpo_lab.after_run import metrics as M
from grpo_lab.facts import load_yaml

README = ROOT / "README.md"
GPU_README = ROOT / "benchmarks" / "gpu" / "README.md"
# every docs/ page, with measured figures (docs/time_plan.md's figures are also read from their files below:
# test_the_time_plans_figures_are_its_calibration_tables; docs/presets.md's learn_smollm2 figures: test_learn_*)
PAGES = sorted((ROOT / "docs").glob("*.md"))
RESULTS = ROOT / "benchmarks" / "gpu" / "results"
# a number with a unit of time, memory or share, or an accuracy going from one value to another
FIGURE = re.compile(r"\d[\d,.]*\s?(?:ms|s|min|GB|GiB|MB|MiB|%|tokens/s)(?![\w/])|\d\.\d+\s?->\s?\d\.\d+")
MEASURED = re.compile(r"(?<!not )(?<!un)\bmeasured\b", re.I)
CITED = re.compile(r"(?<![\w/$.<-])((?:benchmarks|results)/[\w./-]*[\w/])")


def paragraphs(doc: Path) -> list[tuple[str, str]]:
    """(section heading, paragraph) of a markdown file, outside code blocks; a list item is a paragraph of its own."""
    out, heading, fenced = [], "", False
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:- |\d+\. ))", doc.read_text()):
        kept = []
        for line in block.splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif line.startswith("#") and not fenced:
                heading = line
            elif not fenced and not line.startswith("    "):
                kept.append(line)
        if kept:
            out.append((heading, " ".join(x.strip() for x in kept)))
    return out


def resolve(cited: str, doc: Path) -> Path:
    return (ROOT if cited.startswith("benchmarks/") else doc.parent) / cited


@pytest.mark.parametrize("doc", [README, GPU_README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_measured_figure_names_its_recorded_file(doc):
    seen = 0
    for heading, para in paragraphs(doc):
        if not (MEASURED.search(para) and FIGURE.search(para)):
            continue
        seen += 1
        cited = [resolve(c, doc) for c in CITED.findall(para + " " + heading)]
        assert any(p.exists() for p in cited), (f"{doc.name}, {heading!r}: measured figures without a recorded file: "
                                                f"{para}")
    assert seen >= (3 if doc in (README, GPU_README) else 0)


def test_a_planted_unrecorded_measurement_is_found(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("# x\n\nMeasured on the 2-core CPU machine: the tests took 8 min 16 s.\n\n"
                   "Measured on one H200: 436 s "
                   "(`benchmarks/gpu/results/2026-12-03-qwen3-random/smoke/status.json`).\n")
    flagged = [p for _, p in paragraphs(doc) if MEASURED.search(p) and FIGURE.search(p)
               and not any(resolve(c, README).exists() for c in CITED.findall(p))]
    assert flagged == ["Measured on the 2-core CPU machine: the tests took 8 min 16 s."]


@pytest.mark.parametrize("doc", [README, GPU_README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_file_exists(doc):
    cited = {c for _, para in paragraphs(doc) for c in CITED.findall(para)}
    missing = sorted(c for c in cited if not resolve(c, doc).exists())
    assert not missing, missing


def _flat(doc: Path) -> str:
    return " ".join(doc.read_text().split())


def test_the_headline_is_the_readme_commands_own_run():
    text = _flat(README)
    m = re.search(r"then `(python run\.py [^`]+)` \(that command alone, measured on one H200: validation accuracy "
                  r"(\d\.\d+) -> (\d\.\d+) at step (\d+), (\d\.\d+) at step (\d+),"
                  r"[^`]*`(benchmarks/gpu/results/[^`]+)`",
                  text)
    assert m, "the headline sentence"
    command, first, at_a, step_a, at_b, step_b, folder = m.groups()
    folder = ROOT / folder
    # the recorded run is that command, alone on the card, to its end
    assert command.replace("python ", "python3 ") in (folder / "README.md").read_text()
    job = folder / "learn"
    assert json.loads((job / "status.json").read_text())["status"] == "ok"
    assert not (job / "SIDE_BY_SIDE").exists() and not (folder / "SIDE_BY_SIDE").exists()
    df = M.read_metrics(job)
    val = df[M.primary_val_column(df)].dropna()
    assert f"{val.loc[0]:.3f}" == first
    assert (f"{val.loc[int(step_a)]:.3f}", f"{val.loc[int(step_b)]:.3f}") == (at_a, at_b)
    assert int(step_a) == val.index.max(), "the last validated step"


def test_the_smoke_time_is_its_status_json():
    m = re.search(r"2\. Smoke test, Qwen3-0\.6B;.*?: (\d+) s, `(benchmarks/gpu/results/[^`]+/status\.json)`",
                  _flat(README))
    assert m
    assert round(json.loads((ROOT / m.group(2)).read_text())["wall_s"]) == int(m.group(1))


def test_the_side_by_side_sweeps_kv_caches_are_its_logs():
    """README: one job of the recorded side-by-side sweep got a small KV cache while the others got the planned size."""
    m = re.search(r"That sweep ran so on one H200 \(`(benchmarks/gpu/results/[^`]+)`\)\. There one job's vLLM measured "
                  r"the card while its neighbours were loading and got a ([\d.]+) GiB KV cache instead of ~(\d+) "
                  r"\(`(sweep/job\d)/train\.log`\)", _flat(README))
    assert m, "the sweep's sentence"
    sweep = ROOT / m.group(1)
    kv = {j.name: float(re.search(r"Available KV cache memory: ([\d.]+) GiB", (j / "train.log").read_text())[1])
          for j in sorted((sweep / "sweep").glob("job*"))}
    small = kv.pop(m.group(4).split("/")[1])
    assert (f"{small:.2f}", f"{min(kv.values()):.0f}") == m.group(2, 3) and len(kv) == 2
    # docs/after_run.md quotes the same run for make report's KV cache check
    assert f"one got {small:.2f} GiB instead of ~{min(kv.values()):.0f} (`{m.group(1).rstrip('/')}/`)" \
        in _flat(ROOT / "docs" / "after_run.md")


def test_the_emulated_oom_names_its_phase_and_that_phases_verdict():
    para = next(p for _, p in paragraphs(GPU_README) if "The emulated 32 GB card stopped" in p)
    m = re.search(r"stopped the 1\.7B smoke in the (optimizer step) of (training), a phase the plan called `(\w+)`",
                  para)
    assert m, para
    step, phase, verdict = m.groups()
    job = RESULTS / "2026-12-04-qwen3-random" / "side_by_side" / "emu_oom"
    plan = json.loads((job / "plan.json").read_text())["memory"]
    assert plan["phases"][phase]["peak_of"] == step and plan["phases"][phase]["verdict"] == verdict
    assert plan["verdict"]["overall"] == "oom" != verdict
    oom_from = re.search(r"Its `overall: oom` was the (\w+) phase's", para).group(1)
    assert plan["phases"][oom_from]["verdict"] == "oom"
    log = (job / "train.log").read_text(errors="replace")
    tail = log[log.index("OutOfMemoryError"):]
    assert "optimizer_step" in tail and "_foreach_sqrt" in tail


def _phases(tmp_path: Path, name: str, *overrides: str) -> dict:
    out = tmp_path / name
    proc = run_py("experiment=qwen3_4b_gsm8k", *overrides, "preflight.only=true", f"hydra.run.dir={out}")
    assert planned(proc), proc.stdout[-2000:] + proc.stderr[-2000:]
    mem = json.loads((out / "plan.json").read_text())["memory"]
    assert mem["card_gb"] == 32
    return {**{k: v["peak_gb_per_gpu"] for k, v in mem["phases"].items()}, "peak_of": mem["phases"]["training"].get(
        "peak_of"), "host": mem["host_ram_gb"], "verdicts": mem["verdict"]}


LORA = ("actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=32",
        "actor_rollout_ref.rollout.load_format=safetensors", "actor_rollout_ref.actor.strategy=fsdp2")


def test_the_4b_advice_is_what_the_plan_says(tmp_path):
    base = _phases(tmp_path, "base")
    offload = _phases(tmp_path, "offload", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    tokens = _phases(tmp_path, "tokens", "ppo_max_token_len_per_gpu=8192")
    util = _phases(tmp_path, "util", "rollout_gpu_mem_util=0.3")
    tp2 = _phases(tmp_path, "tp2", "rollout_tp=2")
    lora = _phases(tmp_path, "lora", *LORA)
    # what the README's words rest on
    assert base["verdicts"]["training"] == "fits" and base["peak_of"] == "update (backward start)"
    assert base["training"] == offload["training"] > tokens["training"] > lora["training"]
    assert tokens["peak_of"] == "optimizer step"
    assert base["verdicts"]["generation"] == base["verdicts"]["weight_sync"] == "tight"
    assert offload["verdicts"]["overall"] == "fits"
    assert util["generation"] < base["generation"] and util["weight_sync"] == base["weight_sync"]
    assert tp2["weight_sync"] < base["weight_sync"] and tp2["generation"] == base["generation"]
    para = next(p for _, p in paragraphs(README) if p.startswith("4. Qwen3-4B"))
    for quoted in (f"training fits, {base['training']:.2f} GB at the update",
                   f"({tokens['training']:.2f} GB at the optimizer step with `ppo_max_token_len_per_gpu=8192`",
                   f"generation ({base['generation']:.2f} GB) and the weight sync ({base['weight_sync']:.2f} GB) are "
                   "`tight`",
                   f"to {offload['generation']:.2f} and {offload['weight_sync']:.2f} GB",
                   f"host RAM {base['host']:.2f} -> {offload['host']:.2f} GB",
                   f"relieves generation only ({util['generation']:.2f} GB)",
                   f"the weight sync only ({tp2['weight_sync']:.2f} GB)",
                   f"Only LoRA lowers the training phase below the optimizer step ({lora['training']:.2f} GB"):
        assert quoted in para, (quoted, para)


# ---- README's first screen (issue 44, item 1) ----

FIRST_SCREEN = 45


def test_the_readme_is_short_and_its_first_screen_says_what_to_type():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "Two commands on a fresh machine do everything" in first
    assert re.search(r"^make test +# CPU", first, re.M) and re.search(r"^make smoke +# GPUs", first, re.M)
    for cmd in ("make plan", "make fit", "make capacity", "make doctor", "make report", "python run.py",
                "preflight: OK", "```\n$ python run.py"):
        assert cmd in first, cmd


def test_the_first_screens_verdict_is_run_pys_own_output(tmp_path):
    """The example's lines, less those left out ("..."), are what the command prints in a fresh clone, in order."""
    text = README.read_text()
    block = text[text.index("```\n$ python run.py") + 4:]
    block = block[:block.index("```")].splitlines()
    typed = block[0].removeprefix("$ ").split("#")[0].split()
    assert typed[:2] == ["python", "run.py"] and "preflight.only=true" in typed
    clone = fresh_clone(tmp_path / "clone")
    proc = run_py(*typed[2:], f"hydra.run.dir={tmp_path / 'run'}", cwd=clone, root=clone)
    assert planned(proc), proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = iter(proc.stdout.splitlines())
    for line in block[1:]:
        if line != "...":
            assert line in printed, f"README's first screen shows {line!r}, not in run.py's output (in this order)"
    assert any(line.startswith("preflight: ") for line in block)



# ---- docs/presets.md's learn_smollm2 figures (issue 44 item 11): each read from the recorded run it names ----

PRESETS = ROOT / "docs" / "presets.md"


def _section(doc: Path, heading: str) -> str:
    text = doc.read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return " ".join(text[start:end if end > 0 else None].split())


def _val(job: Path):
    """The validation metric the run follows, by step (step 0 included)."""
    df = M.read_metrics(job)
    return df[M.primary_val_column(df)].dropna()


def _steps(job: Path, metric: str = "timing_s/step"):
    """The metric at each trained step."""
    return M.train_series(M.read_metrics(job), metric).dropna()


def _arrow(values: str) -> list[str]:
    return [v.strip() for v in values.split("->")]


def _stamp(log: Path, marker: str) -> list[float]:
    """Seconds since launch (stamp.py) of each console line holding `marker`."""
    with gzip.open(log, "rt", errors="replace") as f:
        return [float(line.split()[0]) for line in f if marker in line]


def _speed(job: Path) -> tuple[bool, bool]:
    """(use_fused_kernels, use_remove_padding) of the run's verl config."""
    model = load_yaml(job / "verl_config.yaml")["actor_rollout_ref"]["model"]
    return model["use_fused_kernels"], model["use_remove_padding"]


def test_learn_smollm2s_figures_are_its_recorded_runs():
    text = _section(PRESETS, "## `conf/experiment/learn_smollm2.yaml`")
    # the default's learning, and the guide's settings' on the same preset
    m = re.search(r"at the default speed: validation accuracy ([\d. >-]+?) at steps ([\d/]+) "
                  r"\(`(benchmarks/gpu/results/[^`]+)`, (\d+) steps\), as with the guide's speed settings: "
                  r"([\d. >-]+?) at steps ([\d/]+) \(`(benchmarks/gpu/results/[^`]+)`", text)
    assert m, text
    default, guide = ROOT / m.group(3), ROOT / m.group(7)
    for values, steps, job in ((m.group(1), m.group(2), default), (m.group(5), m.group(6), guide)):
        val = _val(job)
        assert _arrow(values) == [f"{val.loc[int(s)]:.3f}" for s in steps.split("/")], job
        assert [int(s) for s in steps.split("/")] == list(val.index), f"{job}: every validation it made"
        assert json.loads((job / "status.json").read_text())["status"] == "ok"
    assert int(m.group(4)) == _steps(default).index.max()
    # the default is the preset with nothing else: no speed= override, the fused log-prob and padded micro-batches;
    # the guide's run neither
    overrides = (default / ".hydra" / "overrides.yaml").read_text()
    assert "experiment=learn_smollm2" in overrides and "speed=" not in overrides
    assert _speed(default) == (True, False) and _speed(guide) == (False, True)
    assert "H200" in (default.parent / "gpu.txt").read_text()
    # seconds a step: steps 2 on (step 1 carries the warm-up), and the first
    m = re.search(r"at the default speed a step took (\d+\.\d) s on one H200 \(steps 2-(\d+), (\d+\.\d) s the first; "
                  r"`(benchmarks/gpu/results/[^`]+)`\), start-up to \"ready to fit\" (\d+) s; with `speed=guide` "
                  r"(\d+\.\d) s \(steps 2-(\d+), (\d+\.\d) s the first; (\d+\.\d) s over steps 2-(\d+); "
                  r"`(benchmarks/gpu/results/[^`]+)`", text)
    assert m, text
    assert (ROOT / m.group(4), ROOT / m.group(11)) == (default, guide)
    for steady, last, first, job in ((m.group(1), m.group(2), m.group(3), default),
                                     (m.group(6), m.group(7), m.group(8), guide)):
        s = _steps(job)
        assert int(last) == s.index.max() and f"{s.loc[2:].mean():.1f}" == steady and f"{s.loc[1]:.1f}" == first, job
    assert f"{_steps(guide).loc[2:int(m.group(10))].mean():.1f}" == m.group(9)
    assert int(m.group(10)) == _steps(default).index.max(), "the guide over the default's steps"
    ready = _stamp(default.parent / f"{default.name}.log.gz", "ready to fit")
    assert len(ready) == 1 and f"{ready[0]:.0f}" == m.group(5)
    # side by side: every step of the sweep's three jobs, and their start-up to the validation at step 0
    m = re.search(r"with two other jobs side by side \(`speed=guide`\) (\d+)-(\d+) s, ~(\d+) min to the validation at "
                  r"step 0 \(`(benchmarks/gpu/results/[^`]+)`\)", text)
    assert m, text
    sweep = ROOT / m.group(4)
    jobs = sorted((sweep / "sweep").glob("job*"))
    times = [t for j in jobs for t in _steps(j)]
    assert len(jobs) == 3 and (f"{min(times):.0f}", f"{max(times):.0f}") == m.group(1, 2)
    val0 = _stamp(sweep / "sweep.log.gz", "step:0 ")
    assert len(val0) == 3 and {f"{t / 60:.0f}" for t in val0} == {m.group(3)}
    # the sweep's learning rates
    by_lr = {load_yaml(j / "verl_config.yaml")["actor_rollout_ref"]["actor"]["optim"]["lr"]: j
             for j in jobs}
    m = re.search(r"validation at step 10: 3e-5 (\S+), 3e-6 (\S+), 1e-5 (\S+) \(from (\S+)\); 3e-5 reached (\S+) at "
                  r"step 15, reward (\S+) -> (\S+)$", text.split("- `actor_lr`:")[1].split(" - `")[0].strip())
    assert m, text
    at10 = [f"{_val(by_lr[lr]).loc[10]:.3f}" for lr in (3e-5, 3e-6, 1e-5)]
    assert list(m.group(1, 2, 3)) == at10 and {f"{_val(j).loc[0]:.3f}" for j in jobs} == {m.group(4)}
    reward = _steps(by_lr[3e-5], "critic/score/mean")
    assert (f"{_val(by_lr[3e-5]).loc[15]:.3f}", f"{reward.iloc[0]:.2f}", f"{reward.iloc[-1]:.2f}") == m.group(5, 6, 7)
    # the preset's 20 steps, run alone
    m = re.search(r"20 steps at 3e-5 were measured alone: (\S+) at step 20 against (\S+) at step 15, entropy "
                  r"(\S+) -> (\S+) \(`(benchmarks/gpu/results/[^`]+)`\)", text)
    assert m and ROOT / m.group(5) == guide, text
    entropy = _steps(guide, "actor/entropy")
    assert (f"{_val(guide).loc[20]:.3f}", f"{_val(guide).loc[15]:.3f}") == m.group(1, 2)
    assert (f"{entropy.iloc[0]:.2f}", f"{entropy.iloc[-1]:.2f}") == m.group(3, 4)
    # the config file's own comments quote the page
    conf = (ROOT / "conf" / "experiment" / "learn_smollm2.yaml").read_text()
    steady = re.search(r"a step took (\d+\.\d) s on one H200", text).group(1)
    assert f"# 64 prompts x 8 answers: {steady} s a step on one H200 at the default speed (docs/presets.md)" in conf
    assert f"# 20 at 3e-5 measured alone: {_val(guide).loc[20]:.3f} at step 20;" in conf


def test_the_same_hold_pair_is_its_recorded_files():
    """Issue 44 item 11: learn_smollm2 with the default and with speed=guide in one hold, each alone on the card."""
    text = _section(PRESETS, "## `conf/experiment/learn_smollm2.yaml`")
    m = re.search(r"The pair in one hold, one job after the other, each alone on one (\w+) \(`(benchmarks/gpu/results/"
                  r"[^`]+)`\): the default ([\d. >-]+?) at steps ([\d/]+), `speed=guide` ([\d. >-]+?) at steps "
                  r"([\d/]+) \(the hold ended after its step (\d+)\); ([\d.]+) against ([\d.]+) s a step over steps "
                  r"2-(\d+)\.", text)
    assert m, text
    folder = ROOT / m.group(2)
    default, guide = folder / "smol_default", folder / "smol_guide"
    assert m.group(1) in (folder / "gpu.txt").read_text()
    for values, steps, job in ((m.group(3), m.group(4), default), (m.group(5), m.group(6), guide)):
        val = _val(job)
        assert _arrow(values) == [f"{val.loc[int(s)]:.3f}" for s in steps.split("/")], job
        assert [int(s) for s in steps.split("/")] == list(val.index), f"{job}: every validation it made"
    assert "speed=" not in (default / ".hydra" / "overrides.yaml").read_text() and _speed(default) == (True, False)
    assert "- speed=guide" in (guide / ".hydra" / "overrides.yaml").read_text()
    # one after the other: the guide's job started after the default's ended; the guide's was cut off by the hold
    status = {j.name: json.loads((j / "status.json").read_text()) for j in (default, guide)}
    assert status["smol_default"]["status"] == "ok" and status["smol_guide"]["status"] == "running"
    assert status["smol_default"]["ended"] < status["smol_guide"]["started"]
    last = int(m.group(7))
    assert _steps(guide).index.max() == last == int(m.group(10))
    assert (f"{_steady(default, last):.1f}", f"{_steady(guide, last):.1f}") == m.group(8, 9)


# ---- docs/time_plan.md's figures (issue 44 item 11): each from the calibration table or the recorded run it comes
# from (`make calibrate` writes benchmarks/gpu/timeplan_calibration.json; the doc rounds as below) ----

def _steady(job: Path, upto: int) -> float:
    """A run's steady step as benchmarks/gpu/speed_pair.py takes it: the mean of steps 2 to `upto`."""
    return _steps(job).loc[2:upto].mean()


def test_the_variants_smoke_figures_are_their_recorded_runs():
    """docs/presets.md's smoke_smollm2: the variants' steps, DAPO's evicted groups and the generation times."""
    text = _section(PRESETS, "## `conf/experiment/smoke_smollm2.yaml`")
    m = re.search(r"\(`(benchmarks/gpu/results/[^`]+)`\): grpo, dr_grpo and gspo exit 0 in (\d) steps; dapo's first "
                  r"step evicted (\d+) groups whose (\d) answers all scored the same .*?\(gen (\d+) s against "
                  r"(\d+)-(\d+) s\)", text)
    assert m, text
    jobs = {}
    for cfg in (ROOT / m.group(1)).glob("*/job*/verl_config.yaml"):
        verl = load_yaml(cfg)
        actor = verl["actor_rollout_ref"]["actor"]
        name = ("dapo" if verl["algorithm"]["filter_groups"]["enable"] else "gspo"
                if actor["policy_loss"]["loss_mode"] == "gspo" else "dr_grpo"
                if actor["loss_agg_mode"] == "seq-mean-token-sum-norm" else "grpo")  # each variant's own setting
        jobs[name] = (cfg.parent, verl)
    others = [jobs[k][0] for k in ("grpo", "dr_grpo", "gspo")]
    assert all(json.loads((j / "status.json").read_text())["status"] == "ok" and len(_steps(j)) == int(m.group(2))
               for j in others)
    dapo, verl = jobs["dapo"]
    gen = [t for j in others for t in _steps(j, "timing_s/gen")]
    evicted, dapo_gen = (_steps(dapo, k).loc[1] for k in ("training/filter_groups/evicted_samples", "timing_s/gen"))
    assert m.group(3, 4, 5, 6, 7) == (f"{evicted:.0f}", f"{verl['actor_rollout_ref']['rollout']['n']}",
                                      f"{dapo_gen:.0f}", f"{min(gen):.0f}", f"{max(gen):.0f}")


def test_the_temperature_figures_are_their_files():
    """docs/presets.md's smoke_smollm2: learn_smollm2 at temperature 1 on a GPU, and the CPU probe at 0.7."""
    text = _section(PRESETS, "## `conf/experiment/smoke_smollm2.yaml`")
    m = re.search(r"validation accuracy ([\d.]+) -> ([\d.]+) in (\d+) steps at lr (\S+), "
                  r"`(benchmarks/gpu/results/[^`]+)`\).*?more mixed groups at ([\d.]+) \((\d+)% of prompts\)", text)
    assert m, text
    job = ROOT / m.group(5)
    verl = load_yaml(job / "verl_config.yaml")
    val = _val(job)
    assert m.group(1, 2, 3) == (f"{val.iloc[0]:.3f}", f"{val.iloc[-1]:.3f}", f"{val.index.max()}")
    assert float(m.group(4)) == verl["actor_rollout_ref"]["actor"]["optim"]["lr"]
    assert verl["actor_rollout_ref"]["rollout"]["temperature"] == 1.0
    probe = json.loads((ROOT / "benchmarks" / "smollm2_probe.json").read_text())["results"]
    row = next(r for r in probe if (r["task"], r["style"], r["temperature"]) == ("mixed", "oneshot", float(m.group(6))))
    assert f"{row['mixed_score']:.0%}" == m.group(7) + "%"


def _says_otherwise(text: str, pattern: str, expected: tuple) -> str | None:
    """None where `text` gives the figures `expected` (compared as strings) at `pattern`; else what it says there (the
    pattern itself where it is not found)."""
    m = re.search(pattern, text)
    if m and m.groups() == tuple(f"{e}" for e in expected):
        return None
    return m.group(0) if m else repr(pattern)


def smoke_start_up_disagreements(text: str) -> dict[str, str]:
    """{figure: what docs/presets.md's smoke_tiny start-up note says against its recorded files}."""
    m = re.search(r"run\.py's smoke_tiny on the H200, with these settings: \"ready to fit\" at (\d+) s of (\d+) s, "
                  r"`(benchmarks/gpu/results/[^`]+\.log)`\).*?Before/after, on a warm machine: (\d+) s with these "
                  r"settings against (\d+) s with verl's defaults, no measurable gain "
                  r"\(`(benchmarks/gpu/results/[^`]+)/README\.md`", " ".join(text.split()))
    if not m:
        return {"start-up": "the smoke_tiny start-up sentence"}
    log, folder = ROOT / m[3], ROOT / m[6]
    ready = [float(line.split()[0]) for line in log.read_text(errors="replace").splitlines() if "ready to fit" in line]
    smoke = json.loads((log.with_suffix("") / "status.json").read_text())["wall_s"]
    warm = json.loads((folder / "make_smoke_tiny" / "status.json").read_text())["wall_s"]
    raw = float(re.search(r"wall_s=([\d.]+)", (folder / "raw_before_times.txt").read_text())[1])
    wrong = {}
    if len(ready) != 1 or m.group(1, 2) != (f"{ready[0]:.0f}", f"{smoke:.0f}"):
        wrong["start-up"] = f"{m.group(1, 2)}: {log.name} and its status.json give {ready}, {smoke}"
    if m.group(4, 5) != (f"{warm:.0f}", f"{raw:.0f}") or abs(warm - raw) > 0.05 * raw:
        wrong["before/after"] = f"{m.group(4, 5)}: {folder.name} gives {warm} and {raw}"
    return wrong


def test_the_smoke_start_up_figures_are_their_files():
    assert smoke_start_up_disagreements(PRESETS.read_text()) == {}
    # the figure the page quoted before, with no recorded run behind it, and wrong values planted: each is found
    text = " ".join(PRESETS.read_text().split())
    assert smoke_start_up_disagreements(text.replace('"ready to fit" at 162 s of 218 s',
                                                     "about 3.5 of 5.3 minutes")) != {}
    assert list(smoke_start_up_disagreements(text.replace("at 162 s of 218 s", "at 162 s of 318 s"))) == ["start-up"]
    assert list(smoke_start_up_disagreements(text.replace("machine: 130 s", "machine: 110 s"))) == ["before/after"]


def guide_run_disagreements(readme: str, presets: str) -> dict[str, str]:
    """{figure: what README.md's "3. The real run" and docs/presets.md's qwen3_1_7b_gsm8k say against the composed
    `experiment=qwen3_1_7b_gsm8k` (its batch, group, mini-batch, epochs, GPUs and the dataset option's train_rows)}."""
    from conftest import compose_split

    verl, lab = compose_split("experiment=qwen3_1_7b_gsm8k")
    tb, n = verl["data"]["train_batch_size"], verl["actor_rollout_ref"]["rollout"]["n"]
    mb, gpus = verl["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"], verl["trainer"]["n_gpus_per_node"]
    wrong = {}

    def check(name: str, text: str, pattern: str, *expected: int):
        if (said := _says_otherwise(" ".join(text.split()), pattern, expected)) is not None:
            wrong[name] = f"{said}: the composed config gives {expected}"

    check("README: real run", readme, r"3\. The real run, Qwen3-1\.7B, (\d+) epochs \((\d+) prompts x (\d+) answers = "
          r"(\d+) trajectories a step, (\d+) actor updates, ~(\d+) steps an epoch\)", verl["trainer"]["total_epochs"],
          tb, n, tb * n, tb // mb, lab.dataset.train_rows // tb)
    check("presets: guide's numbers", presets, r"guide's 1\.7B numbers: (\d+) x (\d+) = (\d+) trajectories a step, "
          r"(\d+) actor updates of (\d+), (\d+) per card per mini-batch", tb, n, tb * n, tb // mb, mb * n,
          mb * n // gpus)
    return wrong


def test_the_guide_runs_batch_arithmetic_is_its_config():
    readme, presets = _flat(README), _flat(PRESETS)
    assert guide_run_disagreements(readme, presets) == {}
    # wrong values planted: each is found
    assert list(guide_run_disagreements(readme.replace("~58 steps", "~60 steps"), presets)) == ["README: real run"]
    assert list(guide_run_disagreements(readme, presets.replace("80 per card", "160 per card"))) == [
        "presets: guide's numbers"]


@functools.cache
def _budgets(*overrides: str) -> tuple[int, int, int]:
    """The update's, the old log-prob's and the reference's token budgets of the composed config."""
    arr = _verl_of(*overrides)["actor_rollout_ref"]
    return (arr["actor"]["ppo_max_token_len_per_gpu"], arr["rollout"]["log_prob_max_token_len_per_gpu"],
            arr["ref"]["log_prob_max_token_len_per_gpu"])


def options_disagreements(readme: str, presets: str) -> dict[str, str]:
    """{figure: what README.md's config-group table and first lines, and docs/presets.md's hardware and rollout
    sections, say against the option files they describe (conf/hardware/, conf/rollout/, conf/speed/)}."""

    course, small = _hardware("rtx4080x4"), _hardware("rtx4080_16gbx4")
    hw = course["lab"]["hardware"]
    gpus, card, ram = course["ngpus_per_node"], hw["gpu_memory_gb"], hw["host_ram_gb"]
    pcie = hw["interconnect"] == "pcie4" and not hw["nvlink"]  # "PCIe (4.0), no NVLink"
    rollout = {o: load_yaml(ROOT / "conf" / "rollout" / f"{o}.yaml") for o in ("tp1_mem04", "tp2_mem06", "tp2_mem04")}
    tp_util = [f"{x}" for o in rollout.values() for x in (o["rollout_tp"], o["rollout_gpu_mem_util"])]
    wrong = {}

    def check(name: str, text: str, pattern: str, *expected):
        if (said := _says_otherwise(" ".join(text.split()), pattern, expected)) is not None:
            wrong[name] = f"{said}: the option files give {expected}"

    check("README: reference", readme, r"the reference: (\d+)x RTX 4080 with (\d+) GB each, (PCIe, no NVLink), "
          r"(\d+) GB RAM", gpus, card, "PCIe, no NVLink" if pcie else "?", ram)
    check("README: hardware", readme, r"`rtx4080x4` \((\d+)x (\d+) GB, PCIe, NCCL P2P (\w+)\), `rtx4080_16gbx4` "
          r"\(stock (\d+) GB cards\)", gpus, card, "on" if hw["p2p"] else "off",
          small["lab"]["hardware"]["gpu_memory_gb"])
    check("README: rollout", readme, r"`tp1_mem04` \(the guide: TP (\d+), util ([\d.]+)\), `tp2_mem06` \(the official "
          r"script: TP (\d+), util ([\d.]+)\), `tp2_mem04` \(TP (\d+) at ([\d.]+):", *tp_util)
    check("README: speed", readme, r"`fast` \(verl's fused log-prob, token budgets of ([\d,]+), .*?`guide` \(the "
          r"script's exact settings: per-token log-prob loop without flash-attn, budgets ([\d,]+) / ([\d,]+) / "
          r"([\d,]+)\)", *(f"{b:,}" for b in set(_budgets())), *(f"{b:,}" for b in _budgets("speed=guide")))
    check("presets: defaults", presets, r"GRPO on GSM8K, Qwen3-1\.7B, (\d+)x RTX 4080 (\d+) GB, vLLM rollout with "
          r"TP (\d+) and gpu_memory_utilization ([\d.]+)\.", gpus, card, *tp_util[:2])
    check("presets: course machine", presets, r"The guide's course machine: (\d+)x RTX 4080 with (\d+) GB each, (PCIe "
          r"4\.0 between the cards, no NVLink), (\d+) GB RAM\. CPU cores are not stated by the guide; (\d+) is a "
          r"typical desktop", gpus, card, "PCIe 4.0 between the cards, no NVLink" if pcie else "?", ram,
          hw["cpu_cores"])
    s = small["lab"]["hardware"]
    check("presets: 16 GB cards", presets, r"(\w+) stock RTX 4080 cards \((\d+) GB each; the guide's machine has (\d+) "
          r"GB variants\), PCIe 4\.0, no NVLink, (\d+) GB RAM", WORDS[gpus].capitalize(), s["gpu_memory_gb"], card,
          s.get("host_ram_gb", ram))
    check("presets: tp1_mem04", presets, r"vLLM rollout with tensor parallel (\d+) and gpu_memory_utilization "
          r"([\d.]+): the guide's choice for (\d+) GB PCIe cards", *tp_util[:2], card)
    return wrong


def test_the_options_figures_are_their_files():
    readme, presets = _flat(README), _flat(PRESETS)
    assert options_disagreements(readme, presets) == {}
    # wrong values planted: each is found
    for page, now, then, name in (
            ("README", "32 GB each, PCIe, no NVLink, 128 GB RAM", "32 GB each, PCIe, no NVLink, 64 GB RAM",
             "README: reference"),
            ("README", "NCCL P2P off", "NCCL P2P on", "README: hardware"),
            ("README", "official script: TP 2, util 0.6", "official script: TP 2, util 0.7", "README: rollout"),
            ("README", "budgets 3,000 / 4,096 / 8,192", "budgets 3,072 / 4,096 / 8,192", "README: speed"),
            ("presets", "TP 1 and gpu_memory_utilization 0.4.", "TP 2 and gpu_memory_utilization 0.4.",
             "presets: defaults"),
            ("presets", "16 is a typical desktop", "32 is a typical desktop", "presets: course machine"),
            ("presets", "(16 GB each; the guide's", "(12 GB each; the guide's", "presets: 16 GB cards"),
            ("presets", "choice for 32 GB PCIe", "choice for 24 GB PCIe", "presets: tp1_mem04")):
        texts = {"README": readme, "presets": presets}
        assert now in texts[page], now
        texts[page] = texts[page].replace(now, then, 1)
        assert list(options_disagreements(texts["README"], texts["presets"])) == [name], name


@functools.cache
def _verl_of(*overrides: str) -> dict:
    """The verl config of the composed overrides (read only)."""
    from conftest import compose_split

    return compose_split(*overrides)[0]


def smollm2_presets_disagreements(presets: str) -> dict[str, str]:
    """{figure: what docs/presets.md says of the SmolLM2 presets, their datasets, rewards and DAPO's ramp against the
    composed presets, the generators' default sizes (what `make` writes) and conf/reward_fn/}."""
    from grpo_lab.tasks import arith, countdown

    text = " ".join(presets.split())
    learn, cd = (_verl_of(f"experiment={e}") for e in ("learn_smollm2", "countdown_smollm2"))
    ramp = {k: _verl_of("variant=dapo", *e)
            for k, e in (("guide", ()), ("smoke", ("experiment=smoke_smollm2",)))}
    cd_reward, strict = _reward_kwargs("countdown"), _reward_kwargs("strict_format")
    wrong = {}

    def check(name: str, pattern: str, *expected):
        if (said := _says_otherwise(text, pattern, expected)) is not None:
            wrong[name] = f"{said}: the config and code give {expected}"

    def steps(verl: dict) -> tuple:
        t = verl["trainer"]
        return t["total_training_steps"], t["test_freq"] if t["val_before_train"] else "?"

    check("learn_smollm2", r"better at the one-shot arithmetic: (\d+) steps, validation \(greedy, (\d+) test prompts\) "
          r"before training and every (\d+) steps", steps(learn)[0], arith.TEST_ROWS, steps(learn)[1])
    check("learn_smollm2 batch", r"- `train_batch_size`: (\d+) prompts x (\d+) answers: at the default speed",
          learn["data"]["train_batch_size"], learn["actor_rollout_ref"]["rollout"]["n"])
    check("countdown_smollm2", r"learn_smollm2's settings \((\d+) steps, validation before training and every (\d+) "
          r"steps\)", *steps(cd))
    check("countdown_smollm2 length", r"; (\d+) leaves room for a little working and halves the rollout of "
          r"learn_smollm2's (\d+)", cd["data"]["max_response_length"], learn["data"]["max_response_length"])
    check("arith_oneshot rows", r"answer format in each prompt; (\d+) train rows, (\d+) test rows, data_source "
          r"arith_mixed_oneshot", arith.TRAIN_ROWS, arith.TEST_ROWS)
    check("countdown rows", r"reach the target with (\d+) or (\d+) given numbers from 1\.\.(\d+) and .*?; (\d+) train "
          r"rows, (\d+) test rows, data_source countdown", *countdown.SIZES, countdown.MAX_NUMBER, countdown.TRAIN_ROWS,
          countdown.TEST_ROWS)
    one = {k: f"{v:.1f}" for k, v in cd_reward.items()}
    check("countdown reward", r"keys: ([\d.]+) for an expression in <answer></answer> that reaches the target .*?, "
          r"([\d.]+) for a valid expression with another value, ([\d.]+) for one that breaks the rules .*?, "
          r"([\d.-]+) when the tag is missing", one["correct_score"], one["format_score"], one["invalid_score"],
          f"{-cd_reward['missing_penalty']:.1f}")
    check("countdown steps", r"the reward's ([\d.-]+)/([\d.-]+)/([\d.-]+) steps give GRPO the format",
          f"{-cd_reward['missing_penalty']:.1f}", one["invalid_score"], one["format_score"])
    check("strict_format", r"custom reward function keys: ([\d.]+) for the right number after \"####\", ([\d.]+) for a "
          r"wrong one in the format, ([\d.-]+) when \"####\" is missing", f"{strict['correct_score']:.1f}",
          f"{strict['format_score']:.1f}", f"{-strict['missing_penalty']:.1f}")
    buf = {k: (v["reward"]["reward_kwargs"]["overlong_buffer_cfg"]["len"], v["data"]["max_response_length"])
           for k, v in ramp.items()}
    check("dapo ramp", r"\(DAPO used 4k of 20k\): (\d+) of the guide's (\d+), (\d+) of smoke_smollm2's (\d+)",
          *buf["guide"], *buf["smoke"])
    return wrong


SMOLLM2_STALE = {"learn_smollm2": ("arithmetic: 20 steps, validation", "arithmetic: 30 steps, validation"),
                 "learn_smollm2 batch": ("64 prompts x 8 answers: at", "64 prompts x 5 answers: at"),
                 "countdown_smollm2": ("settings (20 steps, validation", "settings (60 steps, validation"),
                 "countdown_smollm2 length": ("; 128 leaves room", "; 192 leaves room"),
                 "arith_oneshot rows": ("2048 train rows, 128 test rows, data_source arith",
                                        "2048 train rows, 256 test rows, data_source arith"),
                 "countdown rows": ("with 3 or 4 given numbers", "with 3 or 5 given numbers"),
                 "countdown reward": ("0.1 for a valid expression", "0.2 for a valid expression"),
                 "countdown steps": ("reward's -0.1/0.0/0.1 steps", "reward's -0.2/0.0/0.1 steps"),
                 "strict_format": ("keys: 1.0 for the right", "keys: 2.0 for the right"),
                 "dapo ramp": ("64 of smoke_smollm2's 256", "32 of smoke_smollm2's 256")}


def test_the_smollm2_presets_figures_are_their_config():
    text = _flat(PRESETS)
    assert smollm2_presets_disagreements(text) == {}


@pytest.mark.parametrize("name", SMOLLM2_STALE)
def test_a_planted_wrong_smollm2_preset_figure_is_found(name):
    now, then = SMOLLM2_STALE[name]
    text = _flat(PRESETS)
    assert now in text, name
    assert list(smollm2_presets_disagreements(text.replace(now, then, 1))) == [name]


def test_the_presets_memory_arithmetic_is_the_plans():
    """docs/presets.md's vLLM shares and weights are what the memory plan computes for those options (GB = 1e9 bytes;
    a card of `gpu_memory_gb: 32` is 32 GiB, as CUDA reports it)."""
    from conftest import compose_split

    from grpo_lab.memory.run import Run

    text = " ".join(PRESETS.read_text().split())
    guide = Run.build(*compose_split())  # 4x RTX 4080 32 GB, rollout=tp1_mem04
    small = Run.build(*compose_split("hardware=rtx4080_16gbx4"))
    lora = Run.build(*compose_split("model=qwen3_8b_lora"))
    card = small.settings.card_gb * 2**30 / 1e9  # the 16 GiB card in GB, as vLLM's budget takes it
    assert small.memory["kv_cache"]["budget_gb"] == round(0.4 * card, 2)
    for quoted in (f"0.4 x 32 GiB = {guide.memory['kv_cache']['budget_gb']:.2f} GB for vLLM's weights",
                   f"the guide's util 0.4 leaves {card * 0.6:.2f} GB for training",
                   f"8B in bf16 is {2 * lora.model.arch.params / 1e9:.1f} GB: more than one card's 0.4 x 32 GiB = "
                   f"{guide.memory['kv_cache']['budget_gb']:.2f} GB for vLLM",
                   f"8B weights split over 2 cards: {lora.memory['kv_cache']['vllm_weights_gb']:.1f} GB each"):
        assert quoted in text, quoted
    assert lora.settings.tp == 2 and guide.settings.tp == 1


def test_the_engines_budgets_are_the_plans():
    """docs/sglang.md's vLLM and SGLang budgets for Qwen3-1.7B on the course machine are what the plan computes."""
    from conftest import compose_split

    from grpo_lab.memory.run import Run

    vllm, sglang = (Run.build(*compose_split("model=qwen3_1_7b", *extra)).memory["kv_cache"]
                    for extra in ((), ("rollout=sglang_tp1_mem04",)))
    rule = re.search(r"free at engine start \(([\d.]+) GB card - ([\d.]+) GB already held\)", sglang["budget_rule"])
    card, held = (float(x) for x in rule.groups())
    said = (f"vLLM 0.4 x {card:.2f} = {vllm['budget_gb']:.2f} GB with its activations inside; SGLang 0.4 x "
            f"({card:.2f} - {held:.2f} GB held) = {sglang['budget_gb']:.1f} GB for weights and KV, plus "
            f"~{sglang['vllm_activation_gb'] + sglang['cudagraph_gb']:.1f} GB of activations on top")
    assert said in _flat(ROOT / "docs" / "sglang.md"), said
    assert sglang["engine"] == "sglang" and vllm["engine"] == "vllm"


def test_the_speed_settings_figures_are_their_recorded_pairs():
    text = _section(PRESETS, "## `conf/speed/guide.yaml`")
    pairs = {"h200": ("2026-12-06-h200-speed/q17lora_guide", "2026-12-06-h200-speed/q17lora_fast"),
             "17": ("2026-12-06-h100-speed/q17lora_guide", "2026-12-06-h100-speed/q17lora_fit"),
             "06": ("2026-12-06-h100-speed/q06_guide", "2026-12-06-h100-speed/q06_fit"),
             "padded": ("2026-12-06-h100-padded/q17lora_guide", "2026-12-06-h100-padded/q17lora_fast"),
             "06 fast": ("2026-12-06-h100-speed/q06_guide", "2026-12-06-h100-padded/q06_fast")}

    def steady(pair: str) -> list[str]:
        guide, fast = (RESULTS / j for j in pairs[pair])
        upto = min(_steps(guide).index.max(), _steps(fast).index.max())
        g, f = _steady(guide, upto), _steady(fast, upto)
        return [f"{g:.1f}", f"{f:.1f}", f"{g / f:.2f}"]

    def found(pattern: str) -> list[str]:
        m = re.search(pattern, text)
        assert m, pattern
        return list(m.groups())

    n = r"([\d.]+)"
    assert found(rf"one H200, back to back with the guide's: {n} -> {n} s steady \({n}x") == steady("h200")
    assert found(rf"the 1.7B LoRA smoke {n} -> {n} s a step \({n}x\), the 0.6B smoke {n} -> {n} s \({n}x\)") \
        == steady("17") + steady("06")
    assert found(r"smoke ran ([\d.]+) -> ([\d.]+) s a step on one\s+H100 \(([\d.]+)x, "
                 r"`benchmarks/gpu/results/2026-12-06-h100-padded/`") == steady("padded")
    assert found(r"The 0.6B smoke ran ([\d.]+) -> ([\d.]+) s a step with `speed=fast` \(([\d.]+)x, two holds") \
        == steady("06 fast")
    # the preset's pair: its first steps, and the fast side's second
    guide = _steps(RESULTS / "2026-12-06-h100-preset-guide/p17_guide")
    fast = _steps(RESULTS / "2026-12-06-h100-preset/p17_fit")
    assert found(rf"the guide's settings {n} s and `make fit`'s command {n} s for the first step \({n}x; .*?"
                 rf"the fast side's second step {n} s") == [f"{guide[1]:.1f}", f"{fast[1]:.1f}",
                                                          f"{guide[1] / fast[1]:.2f}", f"{fast[2]:.1f}"]
    # the token entropy at step 1 of the two pairs above, and what random weights give: every reward, advantage and
    # loss 0, so the text compares no loss
    entropy = [f"{_steps(RESULTS / j, 'actor/entropy').loc[1]:.2f}" for pair in ("17", "06") for j in pairs[pair]]
    assert found(r"step 1: ([\d.]+) against ([\d.]+), ([\d.]+) against ([\d.]+)\)") == entropy
    for job in {j for pair in pairs.values() for j in pair}:
        for metric in ("critic/score/mean", "critic/advantages/max", "actor/pg_loss"):
            assert (_steps(RESULTS / job, metric) == 0).all(), (job, metric)
    assert "every reward, advantage and loss in them is 0" in text and "first loss" not in text
    # the learning it points to is learn_smollm2's, as that section gives it
    smol = _section(PRESETS, "## `conf/experiment/learn_smollm2.yaml`")
    default, guide_, start = found(r"validation ([\d.]+) at step 10 at the default speed, ([\d.]+) with `speed=guide`, "
                                   r"from ([\d.]+)\)")
    assert f"{start} -> 0.156 -> {default} at steps 0/5/10" in smol and f"{start} -> 0.156 -> {guide_}" in smol


def _planned_step_s(tmp_path: Path, *args: str) -> float:
    """The steady step the time plan gives `python run.py ARGS preflight.only=true` (its plan.json)."""
    p = run_py(*args, "preflight.only=true", cwd=tmp_path)
    assert planned(p), p.stdout + p.stderr
    plan = Path(re.search(r"plan written to (\S+/plan\.json)", p.stdout).group(1))
    return json.loads(plan.read_text())["time"]["step_s"]


def test_the_speed_defaults_planned_steps_are_the_time_plans(tmp_path):
    """docs/presets.md's planned steps of the default against the guide's settings with larger budgets (flash-attn
    assumed, as verl's default attention is), as the time plan gives them through run.py."""
    text = " ".join(_section(PRESETS, "## `conf/speed/guide.yaml`").split())
    budgets = ("ppo_max_token_len_per_gpu={0}", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={0}",
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={0}")
    guide = lambda n: ["speed=guide", *(b.format(n) for b in budgets)]  # noqa: E731
    small, preset = ("model=qwen3_0_6b", "hardware=h100x1"), ("experiment=qwen3_1_7b_gsm8k", "hardware=rtx4080x4")
    fast_s, guide_s = _planned_step_s(tmp_path, *small), _planned_step_s(tmp_path, *small, *guide(16384))
    m = re.search(r"those budgets ~(\d+)% shorter \(`model=qwen3_0_6b hardware=h100x1`: (\d+) against (\d+) s a step\)",
                  text)
    assert m and m.groups() == (f"{5 * round(20 * (1 - guide_s / fast_s))}", f"{guide_s:.0f}", f"{fast_s:.0f}"), m
    fast_s, guide_s = _planned_step_s(tmp_path, *preset), _planned_step_s(tmp_path, *preset, *guide(8192))
    m = re.search(r"`experiment=qwen3_1_7b_gsm8k hardware=rtx4080x4`: (\d+) s a step against (\d+) s for the guide's "
                  r"settings with the largest budget that fits, ([\d,]+)\)", text)
    assert m and m.groups() == (f"{fast_s:.0f}", f"{guide_s:.0f}", "8,192"), m


def test_the_fused_and_padded_figures_are_their_recorded_files():
    """docs/presets.md's passes alone and per phase with the fused log-prob, the packed attention's share, and
    docs/memory_plan.md's padding, each from the recorded run it names."""
    text = _section(PRESETS, "## `conf/speed/guide.yaml`")
    ratios = [p["ratio"] for f in (RESULTS / "2026-12-06-h100").glob("pass_bench_*.json")
              for p in json.loads(f.read_text())["passes"].values()]
    said = f"the three training passes alone, {min(ratios):.1f}-{max(ratios):.1f}x " \
           "(`benchmarks/gpu/results/2026-12-06-h100/README.md`)"
    assert len(ratios) == 9 and said in text, said
    guide, fast = (RESULTS / "2026-12-06-h200-speed" / j for j in ("q17lora_guide", "q17lora_fast"))
    upto = min(_steps(guide).index.max(), _steps(fast).index.max())
    each = [_steps(guide, f"timing_s/{k}").loc[2:upto].mean() / _steps(fast, f"timing_s/{k}").loc[2:upto].mean()
            for k in ("old_log_prob", "ref", "update_actor")]
    said = "old log-prob {:.2f}x, reference {:.2f}x, update {:.2f}x;".format(*each)
    assert said in text, said
    padded = RESULTS / "2026-12-06-h100-padded"
    bench = json.loads((padded / "budget_bench_1_7b_lora.json").read_text())
    kernels = re.search(r"([\d.]+) s of the ([\d.]+) s that the top 25 kernels took",
                        (padded / "README.md").read_text())
    share = re.search(r"\(~(\d+)% of a packed update's kernel time at ([\d,]+) tokens\)", text)
    assert share and _about(share[1], 100 * float(kernels[1]) / float(kernels[2])), share
    assert share[2] == f"{bench['args']['profile']:,}"
    more = max(r["padded_tokens"] / r["tokens"] - 1 for r in bench["rows"])
    said = f"(the bench's evenly spread lengths: {more:.0%} more, `benchmarks/gpu/results/2026-12-06-h100-padded/`)"
    assert said in _flat(MEMORY_PLAN), said

def test_the_moved_pages_measured_figures_are_their_files():
    """The measured figures of docs/tasks.md, docs/emulation.md and docs/verl_schema.md, read from their files."""
    warmup = RESULTS / "2026-12-02" / "warmup"
    run, vllm = (json.loads((warmup / f).read_text()) for f in ("grpo_lab_warmup.json", "vllm_tiny-qwen3-sft.json"))
    wall = re.search(r"real\s+(\d+)m([\d.]+)s", (warmup / "warmup.log").read_text())
    after = run["after"]
    said = f"{run['steps']} steps of {run['batch_size']}, {run['train_seconds']:.0f} s of training " \
           f"({60 * int(wall[1]) + float(wall[2]):.0f} s with start-up): greedy accuracy {after['greedy_acc']:.2f}, " \
           f"sampled {after['sampled_acc']:.2f}, {after['mixed_groups']:.0%} of prompts with mixed draws " \
           f"(vLLM agrees: {vllm['greedy']['acc']:.2f} / {vllm['sampled']['acc']:.2f})"
    assert said in _flat(ROOT / "docs" / "tasks.md"), said
    # the emulation: the H200 as its hardware option gives it, the trainer's memory outside torch's allocator
    from grpo_lab.memory import calibration

    real = load_yaml(ROOT / "conf" / "hardware" / "h200x4_as_rtx4080x4.yaml")
    real = real["lab"]["hardware"]["emulate"]["real_gpu_memory_gb"]
    ctx = calibration.table()["trainer_context_gb"]
    emulation = _flat(ROOT / "docs" / "emulation.md")
    for quoted in (f"runs on four H200 ({real} GB)", f"0.4 x 32 / {real} = {0.4 * 32 / real:.4f}",
                   f"i.e. {0.4 * 32:.1f} GiB", f"per_process_memory_fraction:{32 / real:.6f}",
                   f"the trainer's measured {ctx['min']:.2f}-{ctx['max']:.2f} GB on the H200"):
        assert quoted in emulation, quoted
    # the schema cache: the recorded table of benchmarks/README.md
    row = re.search(r"\| before \| ([\d.]+) s \|.*?\| after \| ([\d.]+) s \| ([\d.]+) s",
                    (ROOT / "benchmarks" / "README.md").read_text(), re.S)
    said = f"waits {float(row[3]):.1f} s for the child; a later `python run.py` with a mistake is refused as fast as " \
           f"before ({row[2]} against {row[1]} s"
    assert said in _flat(ROOT / "docs" / "verl_schema.md"), said


MEMORY_PLAN = ROOT / "docs" / "memory_plan.md"


def memory_plan_disagreements(text: str) -> dict[str, str]:
    """{figure: what docs/memory_plan.md says against what its file or constant gives}, as time_plan_disagreements."""
    from grpo_lab.memory import calibration, memplan

    text = " ".join(text.split())
    table = calibration.table()
    wrong = {}

    def check(name: str, pattern: str, *expected: str):
        if (said := _says_otherwise(text, pattern, expected)) is not None:
            wrong[name] = f"{said}: the file gives {expected}"

    check("margins", r"UNMEASURED_MARGIN, (\d+)%, where no run measured it; .*?`tight` above (\d+)% of the card",
          f"{calibration.UNMEASURED_MARGIN:.0%}"[:-1], f"{memplan.TIGHT_FRACTION:.0%}"[:-1])
    # reserved above allocated: the largest share over the recorded runs, and the model it was
    over = max((j["training"]["reserved_gb"] / j["training"]["allocated_gb"] - 1, j["model"]) for j in table["jobs"]
                if (j.get("training") or {}).get("allocated_gb"))
    check("reserved", r"what it reserves above, up to (\d+)% on the ([\d.]+)B preset", f"{over[0]:.0%}"[:-1],
          over[1].removeprefix("qwen3_").replace("_", ".").upper().removesuffix("B"))
    margins = [calibration.margin_of(q["training"]) for q in table["regimes"].values()
               if (q.get("training") or {}).get("runs")]
    check("unmeasured", r"is about (\w+) the largest margin of a measured regime \((\d+)% today",
          "twice" if round(calibration.UNMEASURED_MARGIN / max(margins)) == 2 else "?", f"{max(margins):.0%}"[:-1])
    update = [b["ratio"] for b in table["bench"] if b["what"] == "update"]
    check("update peaks", r"the update peak ([\d.]+)-([\d.]+) of measured, `bench`", f"{min(update):.3f}",
          f"{max(update):.3f}")
    # the reference left on the card: the SmolLM2 variants' first-step allocated peaks, with a reference and without
    first = {}
    for cfg in (RESULTS / "2026-12-03-smollm2-variants-lora").glob("*/job*/verl_config.yaml"):
        verl = load_yaml(cfg)
        ref = verl["actor_rollout_ref"]["actor"]["use_kl_loss"] or verl["algorithm"]["use_kl_in_reward"]
        first.setdefault(bool(ref), []).append(_steps(cfg.parent, "actor/perf/max_memory_allocated_gb").loc[1])
    check("reference", r"with a reference is ([\d.]+) GiB \(its fp32 weights\) above the (\w+) without",
          f"{first[True][0] - max(first[False]):.2f}", WORDS[len(first[False])] if len(set(first[False])) == 1 else "?")
    # reserved over allocated on the recorded runs: the range, Qwen3-1.7B's full fine-tuning, the emulated 0.6B smoke
    ratio = {j["job"]: (j["training"]["reserved_gb"] / j["training"]["allocated_gb"], j) for j in table["jobs"]
             if (j.get("training") or {}).get("allocated_gb")}
    full17 = [r for r, j in ratio.values() if j["model"] == "qwen3_1_7b" and "LoRA" not in j["regime"]]
    emulated = [r for k, (r, j) in ratio.items() if "/emu_" in k and j["model"] == "qwen3_0_6b"]
    check("reserved range", r"reserved was ([\d.]+)-([\d.]+) x allocated \(([\d.]+): one step of Qwen3-1\.7B's full "
          r"fine-tuning; ([\d.]+): the 0\.6B smoke under a 32 GB emulation\)",
          *(f"{f(r for r, _ in ratio.values()):.2f}" for f in (min, max)), f"{max(full17):.2f}",
          f"{emulated[0]:.2f}" if len(emulated) == 1 else "?")
    check("trainer context", r"CUDA context and NCCL buffers \(([\d.]+) GB measured on the H200",
          f"{table['trainer_context_gb']['max']:.2f}")
    # the plan's own constants (grpo_lab/memory/memplan_phases.py, fit_search.py) and conf/config.yaml's bucket
    from grpo_lab.memory import fit_search
    from grpo_lab.memory import memplan_phases as P

    check("contexts", r"\(trainer process and vLLM worker process: ~([\d.]+) GB and ~([\d.]+) GB",
          f"{P.TRAINER_CUDA_CONTEXT_GB:g}", f"{P.VLLM_CUDA_CONTEXT_GB:g}")
    check("graph pool", r"CUDA graph pool \(~([\d.]+) GB unless", f"{P.VLLM_CUDAGRAPH_GB:g}")
    check("logits", r"\(the guide's \"bf16 \+ fp32\"\), (\d+) B x T x V in the update\. Entropy in the update "
          r"\(entropy_coeff != 0\) adds a fp32 softmax, (\d+) B x T x V, .*?keep the bf16 logits \((\d+) B x T x V\); "
          r".*?eager it would add (\d+) B x T x V", *(f"{b:g}" for b in (
              P.LOGITS_UPDATE_BYTES, P.ENTROPY_BYTES, P.LOGITS_FORWARD_BYTES, P.ENTROPY_EAGER_BYTES)))
    check("fused", r"takes the LM head (\d+) tokens at a time .*?: (\d+) B x min\((\d+), T\) x V in a forward .*?, "
          r"(\d+) B in the update's backward .*?\+ (\d+) B with the entropy in the loss",
          *(f"{b:g}" for b in (P.FUSED_CHUNK, P.FUSED_FORWARD_BYTES, P.FUSED_CHUNK, P.FUSED_BACKWARD_BYTES,
                               P.ENTROPY_EAGER_BYTES)))
    check("host processes", r"\(~(\d+) GB per trainer worker and per vLLM worker, ~(\d+) GB for Ray",
          f"{P.HOST_PER_GPU_WORKER_GB:g}" if P.HOST_PER_GPU_WORKER_GB == P.HOST_PER_VLLM_WORKER_GB else "?",
          f"{P.HOST_BASE_GB:g}")
    bucket = load_yaml(ROOT / "conf" / "config.yaml")["actor_rollout_ref"]["rollout"]["checkpoint_engine"][
        "update_weights_bucket_megabytes"]
    check("bucket", r"\(update_weights_bucket_megabytes, (\d+) GiB in conf/config\.yaml\)", f"{bucket / 1024:g}")
    check("cuBLAS", r"and keep them \((\d+) MiB on the H200\)", f"{P.CUBLAS_WORKSPACE_GB * 1e9 / 2**20:g}")
    spare = f"{100 * (1 - P.GB / P.CARD_UNIT_BYTES):.0f}"
    check("card unit", r"leaves a ~(\d+)% margin on the safe side.*?leaves ~(\d+)% of the card spare", spare, spare)
    check("fit", r"every phase below TIGHT_FRACTION \((\d+)%\) of the card.*?every combination of up to (\w+) "
          r"\(applied", f"{memplan.TIGHT_FRACTION:.0%}"[:-1], WORDS.get(fit_search.MAX_COMBO, "?"))
    return wrong


def test_the_memory_plans_figures_are_its_files():
    assert memory_plan_disagreements(MEMORY_PLAN.read_text()) == {}


MEMORY_STALE = {"margins": ("UNMEASURED_MARGIN, 25%", "UNMEASURED_MARGIN, 20%"), "reserved": ("up to 24%", "up to 18%"),
                "unmeasured": ("(12% today", "(15% today"), "update peaks": ("0.987-1.027", "0.98-1.02"),
                "reference": ("is 0.51 GiB", "is 0.55 GiB"), "reserved range": ("1.00-1.24 x", "1.00-1.20 x"),
                "trainer context": ("(1.24 GB measured", "(1.20 GB measured"),
                "contexts": ("~1.25 GB and ~0.9 GB", "~1.2 GB and ~0.9 GB"),
                "graph pool": ("(~0.4 GB unless", "(~0.5 GB unless"),
                "logits": ("fp32 softmax, 4 B x T x V", "fp32 softmax, 8 B x T x V"),
                "fused": ("20 B in the update's backward", "16 B in the update's backward"),
                "host processes": ("~6 GB for Ray", "~4 GB for Ray"), "bucket": ("4 GiB in conf", "1 GiB in conf"),
                "cuBLAS": ("(64 MiB on", "(32 MiB on"), "card unit": ("a ~7% margin", "a ~5% margin"),
                "fit": ("up to three (applied", "up to two (applied")}


@pytest.mark.parametrize("name", MEMORY_STALE)
def test_a_planted_wrong_memory_plan_figure_is_found(name):
    now, then = MEMORY_STALE[name]
    text = " ".join(MEMORY_PLAN.read_text().split())
    assert now in text, name
    assert list(memory_plan_disagreements(text.replace(now, then, 1))) == [name]


TIME_PLAN = ROOT / "docs" / "time_plan.md"
CALIBRATION = ROOT / "benchmarks" / "gpu" / "timeplan_calibration.json"
WORDS = dict(enumerate(("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")))


def _overrides(job: str) -> str:
    return (ROOT / job / ".hydra" / "overrides.yaml").read_text()


def _span(values) -> tuple[str, str]:
    return f"{min(values):.2f}", f"{max(values):.2f}"


def time_plan_disagreements(text: str, table: dict) -> dict[str, str]:
    """{figure: what the doc says against what its file gives} for docs/time_plan.md's text; a figure not found at its
    phrase counts as wrong."""
    text = " ".join(text.split())
    jobs = {j["job"].split("results/", 1)[1]: j for j in table["jobs"]}
    steady = {k: j for k, j in jobs.items() if "ratio" in j}
    coef, shared = table["coefficients"], table["sharing"]
    wrong = {}

    def check(name: str, pattern: str, *expected: str):
        if (said := _says_otherwise(text, pattern, expected)) is not None:
            wrong[name] = f"{said}: the file gives {expected}"

    from grpo_lab.memory import timeplan  # the assumed shares: the time plan's own constants

    check("assumed", r"(\d+)% of its dense bf16 FLOP/s .*?(\d+)% of its memory bandwidth \(`BW_SHARE`\), PCIe 4\.0 x16 "
          r"at (\d+) GB/s .*?NVLink at (\d+) GB/s", f"{timeplan.MFU:.0%}"[:-1], f"{timeplan.BW_SHARE:.0%}"[:-1],
          f"{timeplan.PCIE_DEFAULT[1]:.0f}", f"{timeplan.NVLINK_GB_S:.0f}")
    us = {p: coef[p]["loop_tokens"] * 1e6 for p in ("old_log_prob", "reference", "update")}
    five = [f"{5 * round(us[p] / 5)}" for p in us]  # to the nearest 5 µs
    check("loop", r"~(\d+)-(\d+) µs a token in each forward pass and ~(\d+) µs in the update",
          min(five[:2], key=int), max(five[:2], key=int), five[2])
    h100, h200 = (jobs[f"2026-12-06-{c}-speed/q17lora_guide"]["step_s"] for c in ("h100", "h200"))
    check("host", r"ran (\d+)% shorter on the H100 test machine than on the H200", f"{100 * (1 - h100 / h200):.0f}")
    check("same job", r"ran ([\d.]+) s a step on the H100 and ([\d.]+) s on the H200 \(the guide's 1\.7B LoRA smoke",
          f"{h100:.1f}", f"{h200:.1f}")
    preset = jobs["2026-12-06-h100-preset/p17_fit"]
    check("preset generation", r"(\d+) s of a (\d+) s step, generation's largest share",
          f"{preset['measured_s']['generation']:.0f}", f"{preset['step_s']:.0f}")
    check("preset step", r"`2026-12-06-h100-preset/p17_fit`, (\d+) s a step", f"{preset['step_s']:.0f}")
    full = table["full_steps_with"]["fused_chunks"]
    check("full steps", r"full steps with it \((\w+) since", WORDS[len(full)])
    start = table["startup_measured_s"]
    check("start-up", r"measured (\d+)-(\d+) s to \"ready to fit\"", f"{min(start):.0f}", f"{max(start):.0f}")
    guide = [j["ratio"] for k, j in steady.items() if j["card"] == "H100" and "speed=guide" in _overrides(j["job"])]
    check("H100 guide", r"plans the H100's guide steps ([\d.]+)-([\d.]+)x long", *_span(guide))
    smokes = [j["ratio"] for j in steady.values() if j["card"] == "H100" and "experiment=smoke" in _overrides(j["job"])]
    check("H100 smokes", r"the H100's short-answer smokes are planned ([\d.]+)-([\d.]+)x long", *_span(smokes))
    chunk = {p: sorted(v)[len(v) // 2] * 1e3 for p, v in table["fused_from_passes"]["per_run_s"].items()}
    check("fused chunks", r"\(([\d.]+) ms old log-prob, ([\d.]+) ms reference, ([\d.]+) ms update",
          *(f"{chunk[p]:.1f}" for p in ("old_log_prob", "reference", "update")))
    pairs = ["2026-12-06-h200-speed/q17lora_fast", "2026-12-06-h100-speed/q17lora_fit", "2026-12-06-h100-speed/q06_fit"]
    assert all(f"benchmarks/gpu/results/{k}" in full for k in pairs), "full steps with the fused log-prob"
    check("fused pairs", r"one H200, 2026-12-06: planned ([\d.]+) s, measured ([\d.]+) s steady; with the fit's "
          r"budgets too, one H100: the 1\.7B LoRA smoke ([\d.]+) / ([\d.]+) s, the 0\.6B smoke ([\d.]+) / ([\d.]+) s",
          *(f"{jobs[k][s]:.1f}" for k in pairs for s in ("predicted_step_s", "step_s")))
    check("measured range", r"\(([\d,]+) today: `measured_range`", f"{table['measured_range']['update_tokens'][1]:,}")
    micro = f"{coef['update']['micro_batches']:.2f}"
    check("micro-batch", r"fitted seconds per micro-batch \(([\d.]+) s on the recorded runs", micro)
    check("micro-batch (capacity)", r"micro-batch \(([\d.]+) s fitted\)", micro)
    check("sharing", r"\): ([\d.]+) today, from (\d+) runs", f"{shared['per_extra_job']:.3f}", f"{len(shared['jobs'])}")
    sweep = [j for j in shared["jobs"] if "2026-12-03-smollm2-lr-sweep/" in j["job"]]
    check("sweep", r"planned at its own lengths (\d+)-(\d+) s a step shared, "
          r"measured (\d+)-(\d+) s \(([\d.]+)-([\d.]+)\)",
          *(f"{f([j[s] for j in sweep]):.0f}" for s in ("planned_shared_s", "step_s") for f in (min, max)),
          *_span([j["ratio"] for j in sweep]))
    m = re.search(r"the others of the \d+ lie [\d.-]+ but for two: `([^`]+)` \(.*?`([^`]+)` \(", text)
    named = m.groups() if m else ()
    ratio = {j["job"].split("results/", 1)[1]: j["ratio"] for j in shared["jobs"]}
    others = [r for k, r in ratio.items() if k not in named and "lr-sweep/" not in k]
    check("sharing others", r"the others of the (\d+) lie ([\d.]+)-([\d.]+) but for two: `[^`]+` \(([\d.]+):.*?"
          r"`[^`]+` \(([\d.]+):", f"{len(shared['jobs'])}", *_span(others),
          *(f"{ratio.get(k, 0):.2f}" for k in named or ("", "")))
    acc, stated = table["accuracy"], table["stated"]
    outside = sorted((k for k, j in steady.items() if abs(j["ratio"] - 1) > stated), key=lambda k: steady[k]["ratio"])
    check("accuracy", r"(\d+) runs, ([\d.]+)-([\d.]+) of measured, (\w+) outside it",
          f"{acc['runs']}", f"{acc['step_ratio_min']:.2f}", f"{acc['step_ratio_max']:.2f}", WORDS[len(outside)])
    named = re.search(r"outside it: (.*?) is just inside", text)
    named = re.findall(r"`([^`]+)` \(([\d.]+)", named.group(1)) if named else []
    if named != [(k, f"{steady[k]['ratio']:.2f}") for k in outside]:  # each run outside, by its ratio
        wrong["outside"] = f"{named}: the file gives {[(k, steady[k]['ratio']) for k in outside]}"
    q06 = steady["2026-12-06-h100-padded/q06_fast"]
    passes = [q06[s][p] for p in ("old_log_prob", "reference") for s in ("measured_s", "predicted_s")]
    check("q06_fast", r"its ([\d.]+) s generation planned ([\d.]+) s, "
          r"its ([\d.]+) s log-prob passes ([\d.]+)-([\d.]+) s",
          *(f"{q06[s]['generation']:.1f}" for s in ("measured_s", "predicted_s")), f"{passes[0]:.1f}",
          f"{min(passes[1], passes[3]):.1f}", f"{max(passes[1], passes[3]):.1f}")
    check("just inside", r"`2026-12-03-smollm2-recheck/learn` is just inside \(([\d.]+)\)",
          f"{steady['2026-12-03-smollm2-recheck/learn']['ratio']:.3f}")
    smol = steady["2026-12-06-h200-smol-default/smol_default"]
    check("smol_default", r"`2026-12-06-h200-smol-default/smol_default`, ([\d.]+)\)", f"{smol['ratio']:.2f}")
    check("smol passes", r"log-prob passes of ~(\d+) s",
          *{f"{smol['measured_s'][p]:.0f}" for p in ("old_log_prob", "reference")})
    check("fixed passes", r"a fixed cost each \(([\d.]+) s old log-prob, ([\d.]+) s reference",
          *(f"{coef[p]['fixed']:.2f}" for p in ("old_log_prob", "reference")))
    # the preset's rounds of answers: its plan's KV cache, its trajectories and its answers' measured lengths
    p17 = RESULTS / "2026-12-06-h100-preset/p17_fit"
    kv = json.loads((p17 / "plan.json").read_text())["memory"]["kv_cache"]
    lengths = {m: _steps(p17, f"{m}_length/mean").mean() for m in ("prompt", "response")}
    from grpo_lab.memory.memplan_phases import answer_rounds

    at_once, rounds = answer_rounds(kv["trajectories_per_replica"], kv["tokens"], sum(lengths.values()), 10**6)
    check("rounds", r"(\d+) answers of ~([\d,]+) tokens in a ([\d,]+)-token cache, ~(\d+) at once: (\d+) rounds",
          f"{kv['trajectories_per_replica']}", f"{lengths['response']:,.0f}", f"{kv['tokens']:,}", f"{at_once}",
          f"{rounds}")
    # the log-prob passes' seconds a token of the run outside the goal, against the later SmolLM2 runs with verl's
    # per-token loop, to the nearest 5 µs
    per_token = {k: [5 * round(j["measured_s"][p] / j["tokens_per_gpu"] * 2e5) for p in ("old_log_prob", "reference")]
                 for k, j in steady.items() if j["model"] == "smollm2_135m" and not j["fused"]}
    first = per_token.pop("2026-12-03-smollm2/sweep/job0")
    later = [v for vals in per_token.values() for v in vals]
    check("loop first", r"log-prob passes ran at ~(\d+) µs a token where the later SmolLM2 runs with the same loop "
          r"took (\d+)-(\d+),",
          *(f"{v}" for v in {*first}), f"{min(later)}", f"{max(later)}")
    # the profiler's share of a packed update's card time, as the padded pair's results give it
    got = re.search(r"([\d.]+) s of the ([\d.]+) s that the top 25 kernels took",
                    (RESULTS / "2026-12-06-h100-padded" / "README.md").read_text())
    check("packed share", r"~(\d+)% of a packed update's kernel time", f"{float(got[1]) / float(got[2]):.0%}"[:-1])
    validation = [j["validation_s"] for j in jobs.values() if "validation_s" in j]
    check("validation", r"look (\d+)-(\d+) s shorter than it was", f"{min(validation):.0f}", f"{max(validation):.0f}")
    # the plan's and the fit's own constants
    from grpo_lab.checks.fit import FASTER
    from grpo_lab.memory import memplan, memplan_phases

    chunk = f"{memplan_phases.FUSED_CHUNK}"
    check("chunks", r"per (\d+)-token chunk of the fused log-prob.*?seconds per (\d+)-token chunk in each training "
          r"pass", chunk, chunk)
    check("flash-attn chunk", r"With flash-attn there is no loop to compare with: (\d+) ms per chunk is assumed",
          f"{1e3 * timeplan.UNMEASURED['fused_chunks_flash_attn']:g}")
    check("loading", r"the weights' loading three times \(actor, reference, vLLM\) at (\d+) GB/s",
          f"{timeplan.DISK_GB_S:g}")
    check("tenth", r"the planned step is a (\w+) or more shorter", {0.1: "tenth"}.get(FASTER, "?"))
    check("goal", r"The goal is every run within (\d+)%", f"{timeplan.STATED:.0%}"[:-1])
    check("fits", r"\*\*fits\*\* is the memory plan's verdict, every phase below (\d+)% of the card",
          f"{memplan.TIGHT_FRACTION:.0%}"[:-1])
    return wrong


def test_the_time_plans_figures_are_its_calibration_tables():
    table = json.loads(CALIBRATION.read_text())
    assert time_plan_disagreements(TIME_PLAN.read_text(), table) == {}


# the figures the page quoted before issue 44 item 11, planted back: each is found
STALE = {"loop": ("~60-65 µs a token in each forward pass and ~145 µs",
                  "~75 µs a token in each forward pass and ~175 µs"),
         "start-up": ("162-387 s", "162-296 s"),
         "H100 guide": ("1.10-1.21x", "1.20-1.22x"), "fused chunks": ("(10.9 ms old", "(12.3 ms old"),
         "fused pairs": ("smoke 26.1 / 23.6 s", "smoke 21.9 / 23.6 s"), "sharing others": ("(1.49:", "(1.51:"),
         "H100 smokes": ("1.10-1.37x long", "1.10-1.32x long"), "full steps": ("(eight since", "(seven since"),
         "sharing": ("0.294 today", "0.303 today"), "validation": ("2-8 s shorter", "2-9 s shorter"),
         "assumed": ("35% of its dense", "40% of its dense"), "rounds": ("~74 at once", "~75 at once"),
         "loop first": ("took 75-105,", "took ~80-95,"), "packed share": ("~59% of a packed", "~65% of a packed"),
         "chunks": ("seconds per 512-token chunk", "seconds per 256-token chunk"),
         "flash-attn chunk": ("compare with: 2 ms per chunk", "compare with: 3 ms per chunk"),
         "loading": ("vLLM) at 2 GB/s", "vLLM) at 3 GB/s"), "tenth": ("a tenth or more", "a fifth or more"),
         "goal": ("every run within 25%", "every run within 20%"),
         "fits": ("every phase below 80% of the card", "every phase below 90% of the card"),
         "outside": ("h100-padded/q17lora_fast` (1.26), `", "h100-padded/q17lora_fast` (1.24), `")}


@pytest.mark.parametrize("name", STALE)
def test_a_planted_wrong_time_plan_figure_is_found(name):
    table = json.loads(CALIBRATION.read_text())
    now, then = STALE[name]
    text = TIME_PLAN.read_text()
    assert now in " ".join(text.split()), name
    planted = " ".join(text.split()).replace(now, then, 1)
    assert list(time_plan_disagreements(planted, table)) == [name]


# ---- design constants stated in docs/ prose (issue 44 item 11): each figure held to the constant (or the recorded
# file) it states; docs/memory_plan.md's and docs/time_plan.md's are in their own checks above ----

def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _g(x: float) -> str:
    return f"{x:g}"


def _hardware(name: str) -> dict:
    """conf/hardware/NAME.yaml as written (the course machine's option has no defaults list)."""

    return load_yaml(ROOT / "conf" / "hardware" / f"{name}.yaml")


def _reward_kwargs(name: str) -> dict[str, float]:
    """conf/reward_fn/NAME.yaml's reward amounts; the reward function's own defaults must be the same."""
    import inspect

    from grpo_lab.tasks.rewards import countdown, strict_format

    conf = load_yaml(ROOT / "conf" / "reward_fn" / f"{name}.yaml")["reward"]["custom_reward_function"]["reward_kwargs"]
    fn = {"countdown": countdown, "strict_format": strict_format}[name].compute_score
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items() if k in conf}
    assert defaults == conf, (name, defaults, conf)
    return conf


@functools.cache
def _recorded_fit_max() -> float:
    """The latest recorded `fit_speed.py` maximum of benchmarks/README.md's table (its last column)."""
    row = re.search(r"\| `python benchmarks/fit_speed\.py`, \d+ configs: median, max \|[^\n]*", (
        ROOT / "benchmarks" / "README.md").read_text())
    return float(re.findall(r"[\d.]+ s, ([\d.]+) s", row[0])[-1])


@functools.cache
def _killed_after() -> float:
    """The LoRA job docs/launch.md names: seconds from its fatal line (the recorded log's last stamp) to the chain's
    timeout that killed it."""
    folder = RESULTS / "2026-12-03-smollm2-recheck"
    timeout = float(re.search(r"no output until the (\d+) s timeout", _flat(folder / "README.md"))[1])
    last = float((folder / "lora_safetensors.errors.txt").read_text().splitlines()[-1].split()[1])
    return timeout - last


@functools.cache
def _smollm2_probs_diff() -> tuple[float, ...]:
    """The largest steady (step 2 on) training/rollout_probs_diff_mean of each recorded SmolLM2 run."""

    out = []
    for cfg in sorted(RESULTS.rglob("verl_config.yaml")):
        if "smollm2" in load_yaml(cfg)["actor_rollout_ref"]["model"]["path"]:
            steady = _steps(cfg.parent, "training/rollout_probs_diff_mean").loc[2:]
            out += [float(steady.max())] if len(steady) else []
    return tuple(out)


@functools.cache
def _countdown_share(size: int) -> float:
    """The share of `make countdown`'s problems (its default sizes) with `size` numbers."""
    from grpo_lab.tasks import countdown

    made = [r for split in countdown.rows(2048, 128).values() for r in split]
    return sum(len(r["reward_model"]["ground_truth"]["numbers"]) == size for r in made) / len(made)


def design_disagreements(pages: dict[str, str]) -> dict[str, str]:
    """{figure: what the page says against what its constant gives} for the design figures of docs/ pages
    ({page name: its text}); a figure not found at its phrase counts as wrong."""
    from dataclasses import asdict

    from grpo_lab import facts, progress
    from grpo_lab.after_run import report_checks as RC
    from grpo_lab.checks import fit, fixes, plan_text, reward_probe
    from grpo_lab.cli.overrides import NEAR_MISS
    from grpo_lab.launch import fatal
    from grpo_lab.memory import calibration, memplan, memplan_phases, timeplan
    from grpo_lab.memory.memplan_arch import Arch
    from grpo_lab.tasks import arith, countdown, own_data, qwen3_random, tiny, warmup
    from grpo_lab.tasks.rewards import countdown as countdown_reward
    from grpo_lab.verl_schema.api import schema

    flat = {name: " ".join(text.split()) for name, text in pages.items()}
    wrong = {}

    def check(name: str, page: str, pattern: str, *expected: str):
        if (said := _says_otherwise(flat[page], pattern, expected)) is not None:
            wrong[name] = f"{page}: {said}: the code gives {expected}"

    # docs/fit.md: the fit's choice, the verdicts' line and the calibration's margins
    check("fit: within", "fit.md", r"the guide's order decides between those within (\d+)% of it", _pct(fit.FASTER))
    check("fit: fits", "fit.md", r"\"Fits\" is the planner's verdict: every phase below (\d+)% of the card",
          _pct(memplan.TIGHT_FRACTION))
    check("fit: stated", "fit.md", r"the stated accuracy \((\d+)%\) is held to", _pct(calibration.STATED["training"]))
    check("fit: unmeasured", "fit.md", r"refused only above the card by more than (\d+)%",
          _pct(calibration.UNMEASURED_MARGIN))
    # the calibration's other one-GPU regimes the page quotes (benchmarks/gpu/memplan_calibration.json)
    lora, big = (calibration.entry(f"one GPU, {r}", "training") for r in ("10M-1B parameters, vLLM, LoRA, FSDP2",
                                                                          "1B-10B parameters, vLLM"))
    check("fit: LoRA regime", "fit.md", r"with LoRA on FSDP2 \(one GPU, Qwen3-0\.6B and SmolLM2\) ([\d.]+)-([\d.]+) on "
          r"(\d+) runs", *_span([lora["ratio_min"], lora["ratio_max"]]), f"{lora['runs']}")
    check("fit: 1.7B regime", "fit.md", r"for Qwen3-1\.7B on one GPU \((\w+) runs?\) exactly its allocated peak "
          r"\(([\d.]+)\), .*? \(plan ([\d.]+) of the reserved peak there\)", WORDS[big["runs"]],
          f"{big['allocated_ratio_min']:.2f}" if big["allocated_ratio_min"] == big["allocated_ratio_max"] else "?",
          f"{big['ratio_max']:.2f}" if big["ratio_min"] == big["ratio_max"] else "?")
    m = re.search(r"The search takes at most ([\d.]+) s per config", flat["fit.md"])
    if not m or float(m[1]) < _recorded_fit_max():
        wrong["fit: search time"] = f"fit.md: {m and m[0]}: benchmarks/README.md records {_recorded_fit_max()} s"
    # docs/launch.md: the dead-engine watcher, and SLURM's jobs
    check("fatal: watcher", "launch.md", r"as it grows \(once a (\w+)\) and, on a fatal line, gives verl "
          r"GRACE_S \((\d+)\) seconds", {1.0: "second"}.get(fatal.INTERVAL_S, "?"), _g(fatal.GRACE_S))
    check("fatal: ends", "launch.md", r"exits non-zero, within (\d+) s of the line", _g(fatal.ENDS_WITHIN_S))
    check("fatal: recorded", "launch.md", r"until the job was killed (\d+) s later",
          f"{10 * round(_killed_after() / 10)}")
    slurm_conf = facts.load_yaml(ROOT / "conf" / "config.yaml")["lab"]["slurm"]
    launcher = facts.load_yaml(ROOT / "conf" / "hydra" / "launcher" / "slurm.yaml")
    check("slurm: ray", "launch.md", r"The port is `lab\.slurm\.ray_port=(\d+)`; a node that has not joined after "
          r"`lab\.slurm\.ray_wait_s=(\d+)` seconds", f"{slurm_conf['ray_port']}", f"{slurm_conf['ray_wait_s']}")
    check("slurm: hours", "launch.md", r"`timeout_min`: (\d+) hours: .*?`lab\.hardware\.host_ram_gb` GB; (\d+) hours\.",
          *[_g(launcher["timeout_min"] / 60)] * 2)
    cluster = facts.conf_option("hardware", "ray_cluster")
    cpus = cluster["ray_kwargs"]["ray_init"]["num_cpus"] or cluster["lab"]["hardware"]["cpu_cores"]
    check("slurm: ray start", "launch.md", r"runs `ray start --head --port=(\d+) --num-cpus=(\d+) --num-gpus=(\d+)`",
          f"{slurm_conf['ray_port']}", f"{cpus}", f"{cluster['ngpus_per_node']}")
    check("slurm: ray join", "launch.md", r"the task on each other node waits for that port and runs `ray start "
          r"--address=<first node>:(\d+) --num-cpus=(\d+) --num-gpus=(\d+) --block`", f"{slurm_conf['ray_port']}",
          f"{cpus}", f"{cluster['ngpus_per_node']}")
    # docs/cli.md: progress, the reward probe's time, near misses, the plan's console and Ray's CPUs
    check("progress", "cli.md", r"What can take more than (\d+) s shows progress .*? a whole line at most every "
          r"(\d+) s, .*?still running \(gives up at (\d+) s\)", _g(progress.DELAY_S), _g(progress.LINE_EVERY_S),
          _g(reward_probe.TIMEOUT_S))
    check("near miss", "cli.md", r"difflib ratio >= ([\d.]+)", _g(NEAR_MISS))
    check("plan lines", "cli.md", r"A plan prints at most (\d+) lines when it is OK", f"{plan_text.OK_LINES}")
    units = schema().defaults["transfer_queue"]["backend"]["SimpleStorage"]["num_data_storage_units"]
    check("ray cpus", "cli.md", r"per GPU, for (\d+) CPUs in its worker placement groups .*?once per job (\d+) for the "
          r"TaskRunner; the V1 trainer adds (\d+) TransferQueue controller and one CPU per SimpleStorage storage unit "
          r"\(verl's default (\d+)\)", f"{facts.CPUS_PER_GPU}", f"{facts.TASK_RUNNER_CPUS}",
          f"{facts.TQ_CONTROLLER_CPUS}", f"{units}")
    # the H200 observation (no recorded log): the CPUs that hung are below what the rule asks, those that ran not
    m = re.search(r"Seen on the H200: num_cpus=(\d+) with (\d+) GPU and (\d+) units hung silently, (\d+) ran",
                  flat["cli.md"])
    hung, g, u, ran = (int(x) for x in m.groups()) if m else (0, 0, 0, 0)
    if not m or not hung < facts.ray_cpus_needed(g, True, u) <= ran:
        wrong["ray cpus seen"] = f"cli.md: {m and m[0]}: facts.ray_cpus_needed({g}, True, {u}) is not between them"
    # docs/presets.md and docs/emulation.md: the course machine's option
    course = _hardware("rtx4080x4")
    hw = course["lab"]["hardware"]
    n_units = course["transfer_queue"]["backend"]["SimpleStorage"]["num_data_storage_units"]
    need = facts.ray_cpus_needed(course["ngpus_per_node"], True, n_units)
    check("presets: ray cpus", "presets.md", r"`num_cpus`: (\d+) x (\d+) GPUs \+ (\d+) TaskRunner \+ (\d+) "
          r"TransferQueue controller \+ (\d+) storage units = (\d+)", f"{facts.CPUS_PER_GPU}",
          f"{course['ngpus_per_node']}", f"{facts.TASK_RUNNER_CPUS}", f"{facts.TQ_CONTROLLER_CPUS}", f"{n_units}",
          f"{need}" if course["ray_kwargs"]["ray_init"]["num_cpus"] == need else "?")
    check("cli: units", "cli.md", r"as CUDA and `free -g` report them \(an H200 is ([\d.]+)\)",
          _g(_hardware("h200x1")["lab"]["hardware"]["gpu_memory_gb"]))
    check("emulation: outside the cap", "emulation.md", r"the plan counts ([\d.]+) GB for an FSDP worker's and "
          r"([\d.]+) GB for vLLM's", *map(_g, (memplan_phases.TRAINER_CUDA_CONTEXT_GB,
                                                memplan_phases.VLLM_CUDA_CONTEXT_GB)))
    check("emulation: course machine", "emulation.md", r"`rtx4080x4`: the course machine's facts, Ray's (\d+) CPUs, .*?"
          r"(\d+) storage units - `gpu_name`: .*?gpu_memory_gb \((\d+)\), p2p \((\w+)\), cpu_cores \((\d+)\) and "
          r"host_ram_gb \((\d+)\) come from rtx4080x4", f"{course['ray_kwargs']['ray_init']['num_cpus']}",
          f"{n_units}", f"{hw['gpu_memory_gb']}", f"{hw['p2p']}".lower(), f"{hw['cpu_cores']}", f"{hw['host_ram_gb']}")
    check("presets: fused chunk", "presets.md", r"chunks of (\d+) tokens from the hidden states.*?the time plan "
          r"assumes (\d+) ms a (\d+)-token chunk", f"{memplan_phases.FUSED_CHUNK}",
          _g(1e3 * timeplan.UNMEASURED["fused_chunks_flash_attn"]), f"{memplan_phases.FUSED_CHUNK}")
    # docs/preflight.md
    speed = _benchmark("preflight_speed")
    check("preflight: target", "preflight.md", r"must refuse within ~(\d+) s\)", _g(speed.TARGET_S))
    check("fix rounds", "preflight.md", r"at most (\d+) rounds, each re-checked", f"{fixes.MAX_ROUNDS}")
    check("prompt rows", "preflight.md", r"on the first ([\d,]+) rows, when both are local", f"{facts.PROMPT_ROWS:,}")
    # docs/after_run.md: make report's lines
    check("report: room", "after_run.md", r"Below (\w+) the card the check points at",
          {0.5: "half"}.get(RC.MEM_ROOM, "?"))
    check("report: step plan", "after_run.md", r"held to the time plan's stated (\d+)%", _pct(timeplan.STATED))
    top, job = RC.recorded_probs_diff()
    warn, bad, _ = RC.probs_diff_thresholds()
    smol = _smollm2_probs_diff()
    check("report: probs diff", "after_run.md", r"verl's FAQ puts the line at ([\d.]+), but every SmolLM2 run on the "
          r"H100/H200 test cards measures ([\d.]+)-([\d.]+), so the check warns (\d+)% above the largest steady value "
          r"\(step 2 on\) of the recorded runs' metrics\.jsonl \(`recorded_probs_diff`: ([\d.]+), `([^`]+)`, so "
          r"([\d.]+); bad at (\w+) that; the FAQ's ([\d.]+) where", _g(RC.PROBS_DIFF_FAQ), f"{min(smol):.3f}",
          f"{max(smol):.4f}", _pct(RC.PROBS_DIFF_MARGIN), f"{top:.4f}",
          job.removeprefix(f"{RESULTS.relative_to(ROOT)}/"), _g(warn), "twice" if bad == 2 * warn else "?",
          _g(RC.PROBS_DIFF_FAQ))
    # docs/tasks.md: the data generators, the rewards, the reward probe's time
    check("own data", "tasks.md", r"# (\d+)% held out as test", _pct(own_data.TEST_FRACTION))
    check("tasks: probe", "tasks.md", r"in a child process bounded to (\d+) s", _g(reward_probe.TIMEOUT_S))
    sizes = [f"{n}" for n in countdown.SIZES]
    check("countdown", "tasks.md", r"countdown\.py` builds each problem from a random expression over (\d+) or (\d+) "
          r"numbers.*?Each problem is made from a random expression over (\d+) or (\d+) numbers from 1\.\.(\d+) \(each "
          r"step's value a whole number from 1 to (\d+)", *sizes, *sizes, f"{countdown.MAX_NUMBER}",
          f"{countdown.MAX_VALUE}")
    fewest = min(countdown.SIZES)
    check("countdown share", "tasks.md", r"About (\d+)% of the problems have (\d+) numbers",
          f"{10 * round(10 * _countdown_share(fewest))}", f"{fewest}")
    check("mixed", "tasks.md", r"(\d+)% bare expressions and (\d+)% short word problems", _pct(tiny.BARE_SHARE),
          _pct(1 - tiny.BARE_SHARE))
    strict = _reward_kwargs("strict_format")
    check("strict_format", "tasks.md", r"strict_format\.py`: ([\d.]+) for the right `#### n`, ([\d.]+) for a wrong "
          r"number in the format, ([\d.-]+) without `####`", _g(strict["correct_score"]), _g(strict["format_score"]),
          _g(-strict["missing_penalty"]))
    check("strict_format table", "tasks.md", r"n equals the ground truth score = correct_score \(([\d.-]+)\) acc 1 "
          r"\"#### n\" present, n wrong score = format_score \(([\d.-]+)\) acc 0 no \"#### n\" at all score = "
          r"-missing_penalty \(([\d.-]+)\)", f"{strict['correct_score']:.1f}", f"{strict['format_score']:.1f}",
          f"{-strict['missing_penalty']:.1f}")
    cd = _reward_kwargs("countdown")
    check("countdown reward", "tasks.md", r"in the answer's last (\d+) characters: E uses only given numbers, each at "
          r"most once, and equals the target score = correct_score \(([\d.-]+)\) .*? score = format_score "
          r"\(([\d.-]+)\) .*?longer than (\d+) characters score = invalid_score \(([\d.-]+)\) .*? score = "
          r"-missing_penalty \(([\d.-]+)\)", f"{countdown_reward._TAIL_CHARS}", f"{cd['correct_score']:.1f}",
          f"{cd['format_score']:.1f}", f"{countdown_reward._MAX_EXPR_CHARS}", f"{cd['invalid_score']:.1f}",
          f"{-cd['missing_penalty']:.1f}")
    check("warm-up rows", "tasks.md", r"by default, --synthetic (\d+) fresh problems", f"{warmup.SYNTHETIC_ROWS}")
    q = qwen3_random
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    added = len(tiny.ADDED_TOKENS)
    check("qwen3 tokenizer", "tasks.md", r"a byte-level BPE of ([\d,]+) tokens, .*? up to ([\d,]+) regular tokens; "
          r"Qwen3's (\d+) added tokens at their real ids (\d+)-(\d+) .*?special tokens at (\d+)-(\d+)",
          f"{q.VOCAB_SIZE:,}", f"{q.REGULAR_TOKENS:,}", f"{added}", f"{q.REGULAR_TOKENS}",
          f"{q.REGULAR_TOKENS + added - 1}", f"{q.REGULAR_TOKENS + added}", f"{q.VOCAB_SIZE - 1}")
    check("qwen3 rows", "tasks.md", r"as Qwen3's own do \((\d+) tokens, (\d+) rows\)", f"{q.REGULAR_TOKENS + added}",
          f"{q.VOCAB_SIZE}")
    check("qwen3 shards", "tasks.md", r"sharded at (\d+) GB like Qwen's", q.SHARD_SIZE.removesuffix("GB"))
    small, learn = (tiny.VARIANTS[v][1] for v in ("tiny", "learn"))
    params = {v: Arch.from_mapping(asdict(a)).params for v, a in (("tiny", small), ("learn", learn))}
    check("tiny models", "tasks.md", r"tiny_qwen3\.yaml; ([\d.]+)M parameters, ([\d.]+) MB\), .*? the same with (\d+) "
          r"layers of width (\d+) \(([\d.]+)M parameters\)", f"{params['tiny'] / 1e6:.2f}",
          f"{2 * params['tiny'] / 1e6:.1f}", f"{learn.num_hidden_layers}", f"{learn.hidden_size}",
          f"{params['learn'] / 1e6:.1f}")
    check("tiny vocab", "tasks.md", r"below the model's vocab_size \((\d+)\)", f"{small.vocab_size}")
    check("qwen3 bytes", "tasks.md", r"so every id a random model samples decodes: (\d+) byte tokens",
          f"{len(bytes_to_unicode())}")  # the byte map qwen3_random.full_vocab_bpe builds its first tokens from
    check("random init", "tasks.md", r"seeded random init \(transformers' own: normal\(0, ([\d.]+)\)",
          _g(tiny.INIT_STD))
    check("sums", "tasks.md", r"sums a \+ b, a and b in (\d+)\.\.(\d+)", *map(str, arith.SUMS))
    return wrong


def _benchmark(name: str):
    """benchmarks/NAME.py as a module (the scripts import their heavy parts inside their functions)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DESIGN_PAGES = ("fit.md", "launch.md", "cli.md", "presets.md", "emulation.md", "preflight.md", "after_run.md",
                "tasks.md")


def _design_pages() -> dict[str, str]:
    return {p: (ROOT / "docs" / p).read_text() for p in DESIGN_PAGES}


def test_the_design_figures_are_the_constants_they_state():
    from grpo_lab.launch import fatal

    assert design_disagreements(_design_pages()) == {}
    # the bound holds the watcher's own waits, with room for Ray's shutdown
    assert fatal.INTERVAL_S + fatal.GRACE_S + fatal.KILL_WAIT_S < fatal.ENDS_WITHIN_S


DESIGN_STALE = {
    "fit: within": ("fit.md", "within 10% of it", "within 5% of it"),
    "fit: fits": ("fit.md", "every phase below 80% of the card and of host RAM (`grpo",
                  "every phase below 85% of the card and of host RAM (`grpo"),
    "fit: stated": ("fit.md", "the stated accuracy (15%)", "the stated accuracy (10%)"),
    "fit: unmeasured": ("fit.md", "by more than 25%", "by more than 20%"),
    "fit: LoRA regime": ("fit.md", "1.01-1.07 on 3 runs", "1.01-1.05 on 3 runs"),
    "fit: 1.7B regime": ("fit.md", "(plan 0.80 of the reserved", "(plan 0.85 of the reserved"),
    "fit: search time": ("fit.md", "at most 0.4 s per config", "at most 0.2 s per config"),
    "fatal: watcher": ("launch.md", "GRACE_S (5)", "GRACE_S (10)"),
    "fatal: ends": ("launch.md", "within 30 s of the line", "within 10 s of the line"),
    "fatal: recorded": ("launch.md", "killed 200 s later", "killed 400 s later"),
    "slurm: ray": ("launch.md", "`lab.slurm.ray_wait_s=300`", "`lab.slurm.ray_wait_s=600`"),
    "slurm: hours": ("launch.md", "GB; 4 hours.", "GB; 8 hours."),
    "slurm: ray start": ("launch.md", "runs `ray start --head --port=6379 --num-cpus=16",
                         "runs `ray start --head --port=6379 --num-cpus=32"),
    "slurm: ray join": ("launch.md", "--num-cpus=16 --num-gpus=4 --block", "--num-cpus=32 --num-gpus=4 --block"),
    "progress": ("cli.md", "at most every 15 s", "at most every 10 s"),
    "near miss": ("cli.md", "difflib ratio >= 0.8", "difflib ratio >= 0.6"),
    "plan lines": ("cli.md", "at most 25 lines", "at most 20 lines"),
    "ray cpus": ("cli.md", "(verl's default 8)", "(verl's default 4)"),
    "ray cpus seen": ("cli.md", "8 units hung silently, 16 ran", "8 units hung silently, 12 ran"),
    "presets: ray cpus": ("presets.md", "2 storage units = 16", "2 storage units = 15"),
    "cli: units": ("cli.md", "(an H200 is 139.8)", "(an H200 is 141)"),
    "emulation: outside the cap": ("emulation.md", "counts 1.25 GB for an FSDP", "counts 1.5 GB for an FSDP"),
    "emulation: course machine": ("emulation.md", "cpu_cores (16)", "cpu_cores (32)"),
    "presets: fused chunk": ("presets.md", "assumes 2 ms a 512-token", "assumes 5 ms a 512-token"),
    "preflight: target": ("preflight.md", "within ~2 s)", "within ~1 s)"),
    "fix rounds": ("preflight.md", "at most 3 rounds", "at most 2 rounds"),
    "prompt rows": ("preflight.md", "first 5,000 rows", "first 1,000 rows"),
    "report: room": ("after_run.md", "Below half the card", "Below a third of the card"),
    "report: step plan": ("after_run.md", "stated 25%", "stated 20%"),
    "report: probs diff": ("after_run.md", "so 0.0102;", "so 0.0100;"),
    "own data": ("tasks.md", "# 10% held out", "# 20% held out"),
    "tasks: probe": ("tasks.md", "bounded to 60 s", "bounded to 30 s"),
    "countdown": ("tasks.md", "whole number from 1 to 999", "whole number from 1 to 99"),
    "countdown share": ("tasks.md", "About 70% of the problems", "About 50% of the problems"),
    "mixed": ("tasks.md", "60% bare expressions and 40%", "50% bare expressions and 50%"),
    "strict_format": ("tasks.md", "0.1 for a wrong number", "0.2 for a wrong number"),
    "strict_format table": ("tasks.md", 'at all score = -missing_penalty (-0.1) acc 0 ```',
                            'at all score = -missing_penalty (-0.2) acc 0 ```'),
    "countdown reward": ("tasks.md", "longer than 200 characters", "longer than 100 characters"),
    "warm-up rows": ("tasks.md", "--synthetic 20000 fresh", "--synthetic 10000 fresh"),
    "qwen3 tokenizer": ("tasks.md", "Qwen3's 26 added tokens", "Qwen3's 22 added tokens"),
    "qwen3 rows": ("tasks.md", "(151669 tokens, 151936 rows)", "(151665 tokens, 151936 rows)"),
    "qwen3 shards": ("tasks.md", "sharded at 5 GB", "sharded at 4 GB"),
    "tiny models": ("tasks.md", "(4.2M parameters)", "(4.0M parameters)"),
    "tiny vocab": ("tasks.md", "vocab_size (4096)", "vocab_size (8192)"),
    "qwen3 bytes": ("tasks.md", "decodes: 256 byte tokens", "decodes: 128 byte tokens"),
    "random init": ("tasks.md", "normal(0, 0.02)", "normal(0, 0.01)"),
    "sums": ("tasks.md", "a and b in 0..99", "a and b in 1..99"),
}


@pytest.mark.parametrize("name", DESIGN_STALE)
def test_a_planted_wrong_design_figure_is_found(name):
    page, now, then = DESIGN_STALE[name]
    pages = {p: " ".join(t.split()) for p, t in _design_pages().items()}
    assert now in pages[page], name
    assert list(design_disagreements({**pages, page: pages[page].replace(now, then, 1)})) == [name]


# ---- micro-timings docs/ quotes (issue 44 item 11): each read from benchmarks/micro_timings.json, which
# `python benchmarks/micro_timings.py --out` writes; no test measures them ----

MICRO = ROOT / "benchmarks" / "micro_timings.json"
MICRO_PAGES = ("verl_schema.md", "cli.md", "preflight.md", "memory_plan.md")


def _about(said: str, value: float) -> bool:
    """Whether `value` rounds to the figure as written, at its own precision ("45": 44.5-45.5, "120": 115-125,
    "0.08": 0.075-0.085)."""
    s = said.replace(",", "")
    if "." in s:
        return round(value, len(s.split(".")[1])) == float(s)
    zeros = len(s) - len(s.rstrip("0")) if s.strip("0") else 0
    return round(value, -zeros) == int(s)


def micro_timing_disagreements(pages: dict[str, str], recorded: dict) -> dict[str, str]:
    """{figure: what the page says against the recorded file} for the micro-timings of docs/ pages ({page name: its
    text}); a figure matches when the recorded value rounds to it, a count when it is the same."""
    flat = {name: " ".join(text.split()) for name, text in pages.items()}
    r, cores = recorded["results"], f"{recorded['cpus']}"
    wrong = {}

    def check(name: str, page: str, pattern: str, *expected: float | str):
        m = re.search(pattern, flat[page])
        if not m or len(m.groups()) != len(expected) or not all(
                _about(g, e) if isinstance(e, float) else g == e for g, e in zip(m.groups(), expected)):
            wrong[name] = f"{page}: {m.group(0) if m else pattern!r}: {MICRO.name} gives {expected}"

    where = r"measured on the (\d+)-core CPU machine"
    file = r"`benchmarks/micro_timings\.json`"
    check("verl's files", "verl_schema.md", r"composing ppo_trainer from its config folder \((\d+) YAML files\) "
          rf"~([\d.]+) s \({where}, {file}\); .*? every later process reads one file \(~([\d.]+) ms\)",
          f"{r['verl_config_files']}", r["verl_compose_s"]["median"], cores, r["schema_file_ms"]["median"])
    check("tree copies", "verl_schema.md", rf"unpickling makes one in ~([\d.]+) ms \(deepcopy ~([\d.]+) ms, "
          rf"OmegaConf\.create ~([\d.]+) ms; {where}, {file}\)", r["tree_unpickle_ms"]["median"],
          r["tree_deepcopy_ms"]["median"], r["tree_create_ms"]["median"], cores)
    check("conf option", "cli.md", rf"~([\d.]+) ms an option, once per process \(the first ~([\d.]+) ms, with Hydra's "
          rf"set-up; {where}, {file}\)", r["conf_option_ms"]["median"], r["conf_first_option_ms"]["median"], cores)
    probe = [v["median"] for v in r["reward_probe_s"].values()]
    check("reward probe", "preflight.md", rf"reward_probe\.py: ([\d.]+)-([\d.]+) s {where}, .*?{file}; once per file "
          r"version\)", min(probe), max(probe), cores)
    fits = r["fit_evaluations"]
    check("fit evaluations", "memory_plan.md", r"(\d+)-(\d+) evaluations of the plan for a config that already fits, "
          rf"up to (\d+) for one that needs LoRA .*?, ~([\d.]+) ms each \(every model option on every hardware option, "
          rf"{where}, {file}\)", *(f"{n}" for n in (*fits["fitting_as_composed"], fits["max"])),
          r["fit_evaluation_ms"]["median"], cores)
    return wrong


def _micro_pages() -> dict[str, str]:
    return {p: (ROOT / "docs" / p).read_text() for p in MICRO_PAGES}


def test_the_micro_timings_are_the_recorded_files():
    recorded = json.loads(MICRO.read_text())
    assert recorded["cpus"] == 2 and re.fullmatch(r"\d{4}-\d\d-\d\d", recorded["date"]) and recorded["commit"]
    assert micro_timing_disagreements(_micro_pages(), recorded) == {}
    # the largest search is docs/fit.md's example, which needs LoRA
    fits = recorded["results"]["fit_evaluations"]
    top = max(fits["rows"], key=lambda row: row["evaluations"])
    assert top["lora"] and f"({fits['max']} plans evaluated)" in (ROOT / "docs" / "fit.md").read_text()
    # benchmarks/README.md's entry quotes the same file
    readme = _flat(ROOT / "benchmarks" / "README.md")
    assert f"python benchmarks/micro_timings.py --repeat {recorded['repeat']}" in readme


MICRO_STALE = {"verl's files": ("verl_schema.md", "one file (~1.3 ms)", "one file (~5 ms)"),
               "tree copies": ("verl_schema.md", "(deepcopy ~20 ms", "(deepcopy ~60 ms"),
               "conf option": ("cli.md", "(the first ~120 ms", "(the first ~50 ms"),
               "reward probe": ("preflight.md", "0.07-0.17 s", "0.1-0.4 s"),
               "fit evaluations": ("memory_plan.md", "~0.08 ms each", "~0.2 ms each")}


@pytest.mark.parametrize("name", MICRO_STALE)
def test_a_planted_wrong_micro_timing_is_found(name):
    recorded = json.loads(MICRO.read_text())
    page, now, then = MICRO_STALE[name]
    pages = {p: " ".join(t.split()) for p, t in _micro_pages().items()}
    assert now in pages[page], name
    assert list(micro_timing_disagreements({**pages, page: pages[page].replace(now, then, 1)}, recorded)) == [name]
