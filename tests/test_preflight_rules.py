"""One test group per preflight rule id that tests/test_preflight.py does not already cover, and a check that every
registered rule id is exercised by a test in tests/test_preflight*.py."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT, composed, planned

from grpo_lab.checks.preflight import run_preflight
from grpo_lab.checks.rules import Ctx, ids, run_rules
from grpo_lab.facts import load_yaml
from grpo_lab.memory import memplan, timeplan
from grpo_lab.memory.run import Run

MOE = ROOT / "tests" / "fixtures" / "synthetic" / "qwen3_30b_a3b"


def check(verl, lab, launching=False, environ=None):
    return run_preflight(Run.build(verl, lab, {} if environ is None else environ), launching=launching)


def rules(problems):
    return [p.rule for p in problems]


def only(problems, rule):
    found = [p for p in problems if p.rule == rule]
    assert len(found) == 1, (rule, [(p.rule, p.message) for p in problems])
    return found[0]


def put(d, dotted, value):
    *head, last = dotted.split(".")
    for part in head:
        d = d.setdefault(part, {})
    d[last] = value


def test_every_rule_id_has_a_test():
    text = "".join(p.read_text() for p in (ROOT / "tests").glob("test_preflight*.py"))
    untested = [r for r in ids() if f'"{r}"' not in text]
    assert untested == []


def test_rules_cannot_change_the_config():
    verl, lab = composed()
    c = Ctx.of(verl, lab, launching=False, environ={})
    with pytest.raises(TypeError):
        c.verl["data"]["train_batch_size"] = 1  # type: ignore[index]
    run_rules(c)
    assert verl == composed()[0]


# ---- value_types / value_range / group_size ------------------------------------------------------------------------

@pytest.mark.parametrize("override,key", [("train_batch_size=abc", "data.train_batch_size"),
                                          ("actor_lr=abc", "actor_rollout_ref.actor.optim.lr"),
                                          ("rollout_n=five", "actor_rollout_ref.rollout.n")])
def test_value_types(override, key):
    r = check(*composed(override))
    p = only(r.errors, "value_types")
    assert key in p.message and "is not a" in p.message
    assert not any("internal error" in n for n in r.notes)  # named, not read as 0


@pytest.mark.parametrize("override,fix,why", [
    ("ngpus_per_node=0", "ngpus_per_node=1", "Bundles must be a non-empty list"),
    ("actor_lr=-1e-6", "actor_lr=1e-06", "'ValueError: Invalid learning rate'"),
    ("total_epochs=-1", "total_epochs=1", "no training step runs"),
    ("max_response_length=0", "max_response_length=1024", "empty"),
])
def test_value_range(override, fix, why):
    p = only(check(*composed(override)).errors, "value_range")
    assert p.fix == fix and why in p.message


def test_learning_rate_zero_runs_and_learns_nothing():
    """torch's AdamW takes lr=0 (it refuses a negative one: value_range): verl runs, the actor never changes."""
    r = check(*composed("actor_lr=0"))
    assert not r.errors
    p = only(r.warnings, "learning_rate_zero")
    assert "the actor never changes" in p.message and p.fix == "actor_lr=1e-06"
    assert "learning_rate_zero" not in rules(_all(check(*composed("actor_lr=1e-7"))))


@pytest.mark.parametrize("estimator,says", [
    ("grpo", "the raw score as the advantage, no baseline"),
    ("rloo", "no leave-one-out baseline"),
    ("rloo_vectorized", "zero advantages for every answer"),
    ("reinforce_plus_plus_baseline", "no group baseline, whitened over the batch"),
])
def test_group_size_runs_without_a_baseline(estimator, says):
    """verl 0.9.1 runs these estimators with one answer per prompt (core_algos.py): a warning naming what it does."""
    r = check(*composed("rollout_n=1", f"algorithm.adv_estimator={estimator}"))
    assert "group_size" not in rules(r.errors)
    p = only(r.warnings, "group_size")
    assert "rollout.n=1" in p.message and says in p.message and p.fix == "rollout_n=5"


def test_group_size_pass_at_k_is_refused():
    p = only(check(*composed("rollout_n=1", "algorithm.adv_estimator=grpo_passk")).errors, "group_size")
    assert "'ValueError: Pass@k requires at least 2 samples per group." in p.message and p.fix == "rollout_n=5"
    assert "group_size" not in rules(_all(check(*composed("rollout_n=1", "algorithm.adv_estimator=gae"))))


# ---- Ray: several nodes, joining a cluster -------------------------------------------------------------------------

def test_ray_cpus_counts_per_node():
    """4 nodes x 4 GPUs with 16 CPUs each: 12 per node + (1 + 1 + 2) / 4 = 13 <= 16, not 52 > 16."""
    verl, lab = composed("nnodes=4")
    r = check(verl, lab)
    assert "ray_cpus" not in rules(r.errors)
    assert r.batch["ray_cpus"]["needed"] == 13 and r.batch["ray_cpus"]["per_node"]
    put(verl, "ray_kwargs.ray_init.num_cpus", None)  # Ray takes each node's cores (the hardware file's 16)
    assert "ray_cpus" not in rules(check(verl, lab).errors)
    put(verl, "ray_kwargs.ray_init.num_cpus", 12)  # 12 per GPU workers + a share of the rest > 12
    p = only(check(verl, lab).errors, "ray_cpus")
    assert "per node" in p.message and "ray_kwargs.ray_init.num_cpus=13" in p.fix


def test_ray_join_num_cpus():
    verl, lab = composed()
    assert "ray_join_num_cpus" not in rules(check(verl, lab).errors)
    p = only(check(verl, lab, environ={"RAY_ADDRESS": "10.0.0.1:6379"}).errors, "ray_join_num_cpus")
    assert "RAY_ADDRESS=10.0.0.1:6379" in p.message and p.fix == "ray_kwargs.ray_init.num_cpus=null"
    put(verl, "ray_kwargs.ray_init.address", "local")  # starts its own Ray: num_cpus is fine
    assert "ray_join_num_cpus" not in rules(check(verl, lab, environ={"RAY_ADDRESS": "x:1"}).errors)


def test_ray_nnodes_without_cluster(tmp_path):
    """Ray's own lookup (grpo_lab/checks/ray_lookup.py): an environment check, a note when not launching."""
    verl, lab = composed("nnodes=2")  # the course machine's own Ray, asked for two nodes
    r = check(verl, lab)  # planning: nothing of this machine's Ray is read
    assert "ray_nnodes_without_cluster" not in rules(r.errors)
    assert any("trainer.nnodes=2: the Ray cluster is not checked here (not launching)" in n for n in r.notes)
    no_ray = {"RAY_TMPDIR": str(tmp_path)}  # no `ray start` record there
    p = only(check(verl, lab, launching=True, environ=no_ray).errors, "ray_nnodes_without_cluster")
    assert "2 nodes (8 GPUs)" in p.message and f"{tmp_path}/ray/ray_current_cluster is absent" in p.message
    assert "ray start --head" in p.fix
    # joining a cluster (RAY_ADDRESS, or the one `ray start` recorded on this node) is what it asks for
    env = {**no_ray, "RAY_ADDRESS": "10.0.0.1:6379"}
    assert "ray_nnodes_without_cluster" not in rules(check(verl, lab, launching=True, environ=env).errors)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.1:6379\n")
    r = check(verl, lab, launching=True, environ=no_ray)
    assert "ray_nnodes_without_cluster" not in rules(r.errors)
    assert "10.0.0.1:6379" in only(r.errors, "ray_join_num_cpus").message  # and then Ray refuses num_cpus
    verl, lab = composed()
    assert "ray_nnodes_without_cluster" not in rules(check(verl, lab, launching=True, environ=no_ray).errors)


def test_ray_no_cluster_to_join(tmp_path):
    """address=auto (hardware=ray_cluster) where no cluster runs: ray.init raises ConnectionError at once."""
    verl, lab = composed("hardware=ray_cluster")
    assert "ray_no_cluster_to_join" not in rules(check(verl, lab).errors)  # planning: not read
    p = only(check(verl, lab, launching=True, environ={"RAY_TMPDIR": str(tmp_path)}).errors, "ray_no_cluster_to_join")
    assert "ConnectionError" in p.message and "ray start --head" in p.fix
    env = {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": "10.0.0.1:6379"}
    assert "ray_no_cluster_to_join" not in rules(check(verl, lab, launching=True, environ=env).errors)


def _all(r):
    return r.errors + r.warnings


def test_dapo_overlong_buffer():
    # the variant's ramp is a quarter of the limit, whichever the limit: 256 of 1024, 64 of 256
    for length, ramp in ((1024, 256), (256, 64)):
        verl, lab = composed("variant=dapo", f"max_response_length={length}")
        assert verl["reward"]["reward_kwargs"]["overlong_buffer_cfg"]["len"] == ramp
        assert "dapo_overlong_buffer" not in rules(_all(check(verl, lab)))
    len_key = "reward.reward_kwargs.overlong_buffer_cfg.len"
    verl, lab = composed("variant=dapo", "max_response_length=256", f"{len_key}=256")  # the ramp is the whole answer
    r = check(verl, lab)  # verl's assert (max_resp_len >= len) passes: it runs, every answer penalised
    assert "dapo_overlong_buffer" not in rules(r.errors)
    p = only(r.warnings, "dapo_overlong_buffer")
    assert "in proportion to its length" in p.message and p.fix == f"{len_key}=64"
    # verl asserts max_resp_len >= len
    verl, lab = composed("variant=dapo", "max_response_length=256", f"{len_key}=300")
    p = only(check(verl, lab).errors, "dapo_overlong_buffer")
    assert "'max_resp_len must be larger than overlong_buffer.len'" in p.message and p.fix == f"{len_key}=64"
    verl, lab = composed("variant=dapo", "max_response_length=384", f"{len_key}=256")
    assert only(check(verl, lab).warnings, "dapo_overlong_buffer").fix.endswith("len=96")


def test_rollout_tp_heads():
    verl, lab = composed("model=smollm2_135m", "hardware=rtx4080x4", "rollout_tp=2")  # 9 heads
    p = only(check(verl, lab).errors, "rollout_tp_heads")
    assert "9 attention heads" in p.message and p.fix == "rollout_tp=1"
    verl, lab = composed("model=qwen3_1_7b", "rollout_tp=2")  # 16 heads
    assert "rollout_tp_heads" not in rules(check(verl, lab).errors)


# ---- Ulysses sequence parallelism ----------------------------------------------------------------------------------

def test_token_budget_with_sequence_parallelism():
    """verl packs max_token_len_per_gpu x SP size tokens (verl/workers/engine/utils.py): 1000 x 2 >= 1536."""
    verl, lab = composed("ppo_max_token_len_per_gpu=1000")
    assert "token_budget" in rules(check(verl, lab).errors)
    put(verl, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 2)
    r = check(verl, lab)
    assert "token_budget" not in rules(r.errors)
    assert r.batch["sequence_parallel_size"] == 2 and r.batch["data_parallel_size"] == 2


def test_data_parallel_size_reads_the_non_deprecated_key():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 4)
    assert check(verl, lab).batch["data_parallel_size"] == 1
    put(verl, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 2)  # deprecated, wins when > 1 (as verl)
    assert check(verl, lab).batch["data_parallel_size"] == 2


def notes_of(rule_id, *overrides):
    c = Ctx.of(*composed(*overrides), launching=False, environ={})
    return [p.message for p in run_rules(c, only=[rule_id]) if p.level == "note"]


def test_token_budget_advice():
    # the guide's budgets (speed=guide: 3000, 4096, 8192) draw the note; the default's 16384 does not
    assert any("below 2 x (prompt + response)" in n for n in notes_of("token_budget_advice", "speed=guide"))
    assert notes_of("token_budget_advice") == []
    assert notes_of("token_budget_advice", "ppo_max_token_len_per_gpu=4096", "actor_rollout_ref.rollout."
                    "log_prob_max_token_len_per_gpu=4096", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=4096"
                    ) == []
    r = check(*composed("speed=guide"))  # the script's actor budget (3000) draws the note, 4096 does not
    assert any("below 2 x" in n for n in r.notes if n.startswith("actor.ppo_max_token_len_per_gpu"))
    assert not any("below 2 x" in n for n in check(*composed("ppo_max_token_len_per_gpu=4096")).notes
                   if n.startswith("actor.ppo_max_token_len_per_gpu"))


def test_environment_skipped():
    assert any("environment checks skipped" in n for n in notes_of("environment_skipped"))


# ---- memory: several nodes, MoE, the model named -------------------------------------------------------------------

def test_memory_host_ram_per_node():
    """Host RAM is per node: 4 nodes do not put four nodes' reference models into one node's RAM."""
    one = check(*composed("model=qwen3_4b")).memory["host_ram"]
    four = check(*composed("model=qwen3_4b", "nnodes=4")).memory["host_ram"]
    assert four["per_node"] and four["components_gb"]["processes"] == one["components_gb"]["processes"]
    # the reference model is sharded over all 16 GPUs: a quarter of it on each node
    assert four["components_gb"]["reference_model"] == pytest.approx(one["components_gb"]["reference_model"] / 4,
                                                                      abs=0.05)
    verl, lab = composed("lab.hardware.host_ram_gb=34")
    p = only(check(verl, lab).errors, "memory_host_ram")
    assert "host RAM" in p.message and p.fix.startswith("ngpus_per_node=")


def notes_of_ctx(verl, lab, rule_id):
    return [p.message for p in run_rules(Ctx.of(verl, lab, launching=False, environ={}), only=[rule_id])]


def test_moe_fixture_counts_total_and_active_parameters():
    import json

    arch = memplan.Arch.from_mapping(json.loads((MOE / "config.json").read_text()))
    assert arch.is_moe and arch.sparse_layers == 48
    assert arch.params / 1e9 == pytest.approx(30.5, abs=0.15)
    assert arch.active_params / 1e9 == pytest.approx(3.3, abs=0.1)
    assert arch.active_intermediate == 8 * 768


def test_memory_notes_moe_planned_with_all_experts():
    verl, lab = composed()
    put(verl, "actor_rollout_ref.model.path", str(MOE))
    r = check(verl, lab)
    m = r.memory
    assert m["params_b"] == pytest.approx(30.5, abs=0.15) and m["moe"]["active_params_b"] == pytest.approx(3.3, abs=0.1)
    # the state is the whole model's: 16 B x 30.5B / 4 GPUs = 122 GB per card, not a 3.3B dense plan's 13 GB
    assert m["actor_state_gb_per_gpu"] == pytest.approx(16 * m["params"] / 4 / 1e9, abs=0.05)
    assert any("mixture of experts" in n and "30.5B" in n for n in notes_of_ctx(verl, lab, "memory_notes"))
    assert "full_finetune_too_big" in rules(r.errors)
    assert "mixture of experts: 128 experts" in r.format(verbose=True)


def test_memory_weight_sync_tight_is_a_warning():
    verl, lab = composed("model=qwen3_4b")
    put(verl, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes", 16384)
    r = check(verl, lab)
    p = only(r.warnings + r.errors, "memory_weight_sync")
    assert "weight-sync" in p.message and "bucket" in p.message


def test_memory_training_oom_fix_is_rechecked():
    verl, lab = composed("model=qwen3_4b", "speed=guide", "ppo_max_token_len_per_gpu=32768")  # unfused logits
    r = check(verl, lab)
    p = only(r.errors, "memory_training")
    assert p.fix and p.checked.startswith("re-checked: the preflight passes")


# ---- lora_layered_summon_one_gpu, lora_fsdp1_adapter ----------------------------------------------------------------
# seen on the GPU test machine (benchmarks/gpu/results/2026-12-03-smollm2-variants-lora/lora/ and
# benchmarks/gpu/results/2026-12-03-smollm2-recheck/): LoRA with FSDP1 on one GPU failed at the first weight sync,
# with layered_summon=true (NO_SHARD) and with layered_summon=false (vLLM's add_lora got an empty adapter)

LORA_ONE_GPU = ("experiment=smoke_smollm2", "hardware=h200x1", "actor_rollout_ref.model.lora_rank=64",
                "actor_rollout_ref.model.lora_alpha=32", "actor_rollout_ref.model.target_modules=all-linear",
                "actor_rollout_ref.rollout.layered_summon=true", "actor_rollout_ref.rollout.load_format=safetensors")
FSDP2 = "actor_rollout_ref.actor.strategy=fsdp2"


def test_lora_layered_summon_on_one_gpu_is_refused_with_a_fix_that_passes():
    r = check(*composed(*LORA_ONE_GPU))
    p = only(r.errors, "lora_layered_summon_one_gpu")
    assert "NO_SHARD" in p.message and "lora_rank=64" in p.message
    assert p.fix == FSDP2
    assert "passes" in p.checked
    assert not rules(check(*composed(*LORA_ONE_GPU, FSDP2)).errors)


@pytest.mark.parametrize("other", ["hardware=rtx4080x4", FSDP2, "actor_rollout_ref.model.lora_rank=0",
                                   "actor_rollout_ref.model.lora.merge=true"])
def test_lora_layered_summon_is_fine_sharded_on_fsdp2_merged_or_without_lora(other):
    r = check(*composed(*LORA_ONE_GPU, other))
    assert "lora_layered_summon_one_gpu" not in rules(r.errors + r.warnings)


@pytest.mark.parametrize("hardware", ["hardware=h200x1", "hardware=rtx4080x4"])
def test_lora_adapter_with_fsdp1_is_refused_with_layered_summon_off_too(hardware):
    # the CPU venv has peft >= 0.21, as the GPU test machine did: the adapter verl collects under FSDP1 is empty
    r = check(*composed(*LORA_ONE_GPU[:-2], "actor_rollout_ref.rollout.layered_summon=false", LORA_ONE_GPU[-1],
                        hardware))
    p = only(r.errors, "lora_fsdp1_adapter")
    assert "StopIteration" in p.message and "peft 0.2" in p.message
    assert p.alternatives == [FSDP2, "actor_rollout_ref.model.lora.merge=true"]
    assert "passes" in p.checked


@pytest.mark.parametrize("other", [FSDP2, "actor_rollout_ref.model.lora.merge=true",
                                   "actor_rollout_ref.model.lora_rank=0"])
def test_lora_adapter_is_fine_with_fsdp2_or_merged(other):
    r = check(*composed(*LORA_ONE_GPU[:-2], "actor_rollout_ref.rollout.layered_summon=false", LORA_ONE_GPU[-1],
                        other))
    assert "lora_fsdp1_adapter" not in rules(r.errors + r.warnings)


def test_lora_on_one_gpu_through_run_py(tmp_path):
    from conftest import run_py

    proc = run_py(*LORA_ONE_GPU, "preflight.only=true", f"hydra.run.dir={tmp_path / 'job'}")
    out = proc.stdout + proc.stderr
    assert "lora_layered_summon_one_gpu" in out and "lora_fsdp1_adapter" in out and FSDP2 in out
    assert "nothing was started" in out


def test_verls_own_lora_example_settings_on_one_gpu_are_refused_as_they_failed(tmp_path):
    """issue 28 item 9: examples/tuning/lora's settings (FSDP1, layered_summon=True, safetensors) on Qwen3-0.6B, as
    speed_session.sh's lora_fsdp1 ran them through raw verl on one H100: the run failed at the first weight sync
    (benchmarks/gpu/results/2026-12-06-h100/lora_fsdp1.tgz, tests/test_doctor.py); run.py refuses the same command."""
    from conftest import run_py

    proc = run_py("experiment=smoke", "hardware=h100x1", "dataset=arith_tiny",
                  "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                  "actor_rollout_ref.model.lora_rank=64", "actor_rollout_ref.model.lora_alpha=32",
                  "actor_rollout_ref.model.target_modules=all-linear", "actor_rollout_ref.actor.strategy=fsdp",
                  "actor_rollout_ref.rollout.layered_summon=true", "actor_rollout_ref.rollout.load_format=safetensors",
                  "preflight.only=true", f"hydra.run.dir={tmp_path / 'job'}")
    errors = {e["rule"]: e for e in json.loads((tmp_path / "job" / "plan.json").read_text())["errors"]}
    assert proc.returncode == 2 and {"lora_layered_summon_one_gpu", "lora_fsdp1_adapter"} <= errors.keys(), proc.stdout
    assert errors["lora_layered_summon_one_gpu"]["fix"] == FSDP2


def test_qwen3_8b_lora_on_one_gpu_passes_the_lora_rules_through_run_py(tmp_path):
    from conftest import run_py

    proc = run_py("model=qwen3_8b_lora", "hardware=h200x1", "rollout_tp=1", "preflight.only=true",
                  f"hydra.run.dir={tmp_path / 'job'}")
    out = proc.stdout + proc.stderr
    assert "lora_fsdp1_adapter" not in out and "lora_layered_summon_one_gpu" not in out, out


# ---- side_by_side_jobs -----------------------------------------------------------------------------------------------
# hydra/launcher=side_by_side (Hydra's joblib launcher): up to n_jobs jobs at once on the same GPU, through run.py

def _side_by_side(tmp_path, *extra):
    from conftest import run_py

    sweep = tmp_path / "sweep"
    proc = run_py("-m", "hydra/launcher=side_by_side", "experiment=learn_smollm2", "hardware=h200x1",
                  "preflight.only=true", "actor_lr=1e-6,2e-6,3e-6", f"hydra.sweep.dir={sweep}", *extra, timeout=300)
    plans = [json.loads(p.read_text()) for p in sorted(sweep.glob("job*/plan.json"))]
    return proc, plans


def test_side_by_side_jobs_refused_when_three_vllm_shares_exceed_the_card(tmp_path):
    proc, plans = _side_by_side(tmp_path)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "3 sweep job(s) refused" in proc.stderr
    assert len(plans) == 3
    for plan in plans:
        e = next(e for e in plan["errors"] if e["rule"] == "side_by_side_jobs")
        assert "3 x 63.8 GB (generation" in e["message"] and "> the 139.8 GB card" in e["message"]
        # the engine's share is of the card's real bytes (150.1e9 for the H200's 139.8 GiB)
        assert "each job's vLLM share rollout_gpu_mem_util=0.4 (60.0 GB of the card) would have to go down to " \
               "0.26, or 2 job(s) at once fit" in e["message"]
        assert e["fix"] == "rollout_gpu_mem_util=0.26  or  hydra.launcher.n_jobs=2"
        assert e["checked"] == "re-checked: the preflight passes this rule with it"


def test_side_by_side_jobs_that_no_vllm_share_fits_get_fewer_jobs_at_once(tmp_path):
    """n_jobs=16 on a sweep of 4 runs 4 at once: no vLLM share fits them on a 32 GB card (each job's weight sync alone
    is 9.1 GB) and 40 GB of host RAM does not hold them: each refusal prints the value that fits (fewer jobs at once),
    re-checked, never an empty `try:`; the printed `fix all`, appended to the same command, passes."""
    import re

    from conftest import run_py

    args = ["-m", "hydra/launcher=side_by_side", "experiment=learn_smollm2", "hardware=h200x1", "preflight.only=true",
            "actor_lr=1e-6,2e-6,3e-6,4e-6", "hydra.launcher.n_jobs=16", "lab.hardware.gpu_memory_gb=32",
            "lab.hardware.host_ram_gb=40"]
    proc = run_py(*args, f"hydra.sweep.dir={tmp_path / 'a'}", timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    plan = json.loads((tmp_path / "a" / "job0" / "plan.json").read_text())
    gpu, ram = [e for e in plan["errors"] if e["rule"] == "side_by_side_jobs"]
    assert "runs up to 4 jobs at once" in gpu["message"] and "no vLLM share lets 4 fit" in gpu["message"]
    assert gpu["fix"] == "hydra.launcher.n_jobs=1" and "4 x 12.5 GB of host RAM" in ram["message"]
    assert ram["fix"] == "hydra.launcher.n_jobs=3"
    for e in (gpu, ram):
        assert e["checked"] == "re-checked: the preflight passes this rule with it"
    assert not re.search(r"try:\s*$", text, re.M), text[-3000:]
    fix_all = plan["fix_all"]
    assert fix_all["passes"] and "hydra.launcher.n_jobs=" in fix_all["overrides"], fix_all
    again = run_py(*args, *fix_all["overrides"].split(), f"hydra.sweep.dir={tmp_path / 'b'}", timeout=300)
    assert planned(again), (again.stdout + again.stderr)[-3000:]


def test_side_by_side_jobs_count_the_sweeps_jobs_and_plan_their_time_shared(tmp_path):
    """n_jobs=4 on a sweep of 2 runs 2 at once (issue 44 item 5: it was refused for 4): 2 x 63.8 GB fits the card;
    the time plan says the card is shared and scales the step by the calibration's growth per extra job."""
    from conftest import run_py

    args = ["-m", "hydra/launcher=side_by_side", "experiment=learn_smollm2", "hardware=h200x1", "preflight.only=true",
            "actor_lr=1e-6,3e-6", "hydra.launcher.n_jobs=4"]
    proc = run_py(*args, f"hydra.sweep.dir={tmp_path / 'a'}", timeout=300)
    assert planned(proc), (proc.stdout + proc.stderr)[-3000:]
    alone = run_py("experiment=learn_smollm2", "hardware=h200x1", "preflight.only=true", "actor_lr=1e-6",
                   f"hydra.run.dir={tmp_path / 'alone'}")
    solo = json.loads((tmp_path / "alone" / "plan.json").read_text())["time"]
    k = timeplan.table()["sharing"]["per_extra_job"]
    for plan in (json.loads(p.read_text()) for p in sorted((tmp_path / "a").glob("job*/plan.json"))):
        assert not [e for e in plan["errors"] if e["rule"] == "side_by_side_jobs"], plan["errors"]
        t = plan["time"]
        assert t["sharing"]["jobs_on_card"] == 2 and t["sharing"]["factor"] == pytest.approx(1 + k, abs=1e-3)
        assert t["step_s"] == pytest.approx(solo["step_s"] * (1 + k), abs=0.3) and solo["sharing"] is None
        assert "recorded runs that shared the card" in t["sharing"]["source"]
    assert planned(alone) and f"a step {t['step_s']:.0f} s" in proc.stdout
    # the recorded side-by-side sweep of the README (three jobs on one H200) is planned within 25% of its steps
    rows = [j for j in timeplan.table()["sharing"]["jobs"] if "2026-12-03-smollm2-lr-sweep" in j["job"]]
    assert len(rows) == 3 and all(j["jobs_on_card"] == 3 and abs(j["ratio"] - 1) <= 0.25 for j in rows), rows


def test_side_by_side_jobs_with_a_fifth_each_run_at_once(tmp_path):
    proc, plans = _side_by_side(tmp_path, "rollout_gpu_mem_util=0.2")
    assert planned(proc), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Joblib.Parallel(n_jobs=3" in proc.stdout + proc.stderr  # Hydra's joblib launcher ran them
    assert len(plans) == 3 and all(p["errors"] == [] for p in plans)
    # docs/time_plan.md quotes this plan (the README's sweep at today's default speed): alone, and shared by three
    t = plans[0]["time"]
    doc = " ".join((ROOT / "docs" / "time_plan.md").read_text().split())
    assert f"plans that sweep at {t['step_s'] / t['sharing']['factor']:.1f} s a step alone and {t['step_s']:.1f} s " \
           f"shared by {t['sharing']['jobs_on_card']}" in doc.replace("shared by three", "shared by 3")
    # each job's vLLM cache pinned to the plan's size without typing it, so neighbours starting at once cannot shrink
    # it: in the config verl gets, and the plan (plan.json and the console) says so
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
    for plan, verl_yaml in zip(plans, sorted((tmp_path / "sweep").glob("job*/verl_config.yaml"))):
        assert not [w for w in plan["warnings"] if w["rule"] == "side_by_side_jobs"]
        assert plan["memory"]["kv_cache"]["kv_cache_gb"] == 29.49
        verl = load_yaml(verl_yaml)
        assert verl["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["kv_cache_memory_bytes"] == 29490000000
        assert any(n.startswith("hydra/launcher=side_by_side: each job's vLLM KV cache is pinned to the plan's "
                                "29.49 GB (+" + key + "=29490000000 in verl_config.yaml, set by the launcher)")
                   for n in plan["notes"]), plan["notes"]
        changed = next(c for c in plan["changed_defaults"] if c["key"] == key)
        assert changed["ours"] == 29490000000 and changed["set_by"].startswith("hydra/launcher=side_by_side")
    assert len(re.findall(r"^grpo-lab job\d+: ", proc.stdout, re.M)) == 3  # a line per job; the pin: plan.json


def test_side_by_side_jobs_keep_the_users_own_kv_pin(tmp_path):
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"
    proc, plans = _side_by_side(tmp_path, "rollout_gpu_mem_util=0.2", f"+{key}=20000000000")
    assert planned(proc), proc.stdout[-2000:] + proc.stderr[-2000:]
    verls = [load_yaml(p) for p in sorted((tmp_path / "sweep").glob("job*/verl_config.yaml"))]
    assert len(plans) == len(verls) == 3
    for plan, verl in zip(plans, verls):
        assert verl["actor_rollout_ref"]["rollout"]["engine_kwargs"]["vllm"]["kv_cache_memory_bytes"] == 20000000000
        assert plan["memory"]["kv_cache"]["kv_cache_gb"] == 20.0
        assert any("pinned to your 20.00 GB" in n for n in plan["notes"]), plan["notes"]
        changed = next(c for c in plan["changed_defaults"] if c["key"] == key)
        assert "side_by_side" not in changed["set_by"]  # the command line set it


def test_side_by_side_jobs_counts_only_the_joblib_launcher():
    from grpo_lab.launch.prepare import side_by_side_jobs

    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    assert side_by_side_jobs({"_target_": joblib, "n_jobs": 4}) == 4
    assert side_by_side_jobs({"_target_": joblib, "n_jobs": -1}) >= 1
    assert side_by_side_jobs({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}) == 1
    assert side_by_side_jobs(None) == 1
    verl, lab = composed("experiment=learn_smollm2", "hardware=h200x1")
    assert "side_by_side_jobs" not in rules(check(verl, lab).errors)
    lab.side_by_side_jobs = 2
    assert "side_by_side_jobs" not in rules(check(verl, lab).errors)  # 2 x 58.8 GB fits the 139.8 GB card
    lab.side_by_side_jobs = 3
    assert "side_by_side_jobs" in rules(check(verl, lab).errors)
    # a pinned KV cache takes away the warning, and sizes the plan's generation phase
    lab.side_by_side_jobs = 2
    verl["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"] = 0.2
    assert "side_by_side_jobs" in rules(check(verl, lab).warnings)
    verl["actor_rollout_ref"]["rollout"].setdefault("engine_kwargs", {}).setdefault("vllm", {})[
        "kv_cache_memory_bytes"] = 10_000_000_000
    pinned = check(verl, lab)
    assert "side_by_side_jobs" not in rules(pinned.warnings) + rules(pinned.errors)
    assert pinned.memory["kv_cache"]["kv_cache_gb"] == 10.0
    assert "pins its KV cache at 10.00 GB" in pinned.memory["kv_cache"]["budget_rule"]


# ---- learning_rate_high, micro_batch_explicit (issue 19; through run.py in tests/test_preflight_readiness.py) --------

def test_learning_rate_high_from_1e_3():
    verl, lab = composed()
    verl["actor_rollout_ref"]["actor"]["optim"]["lr"] = 1e-3
    (w,) = [w for w in check(verl, lab).warnings if w.rule == "learning_rate_high"]
    assert "1e-06 (conf/config.yaml)" in w.message
    assert w.fix.split("  or  ")[0] == "actor_rollout_ref.actor.optim.lr=1e-06"
    verl["actor_rollout_ref"]["actor"]["optim"]["lr"] = 9.99e-4
    assert "learning_rate_high" not in rules(check(verl, lab).warnings)


def _settled(*task_overrides):
    """(verl, lab) with grpo_lab.launch.prepare.settle for these command-line overrides, as launch.py makes it."""
    from grpo_lab.cli.provenance import Layers
    from grpo_lab.launch.prepare import settle

    verl, lab = composed(*task_overrides)
    lab.micro_batch = settle(verl, Layers({}, list(task_overrides)))
    return verl, lab


def test_micro_batch_explicit_turns_the_default_off_or_warns():
    A = "actor_rollout_ref."
    verl, lab = _settled(A + "actor.ppo_micro_batch_size_per_gpu=2")
    assert [verl["actor_rollout_ref"][p][k] for p, k in (("actor", "use_dynamic_bsz"),
            ("rollout", "log_prob_use_dynamic_bsz"), ("ref", "log_prob_use_dynamic_bsz"))] == [False] * 3
    r = check(verl, lab)
    assert r.ok and any(n.startswith("your micro-batch size wins") for n in r.notes)
    verl, lab = _settled(A + "actor.ppo_micro_batch_size_per_gpu=2", A + "actor.use_dynamic_bsz=true")
    assert verl["actor_rollout_ref"]["actor"]["use_dynamic_bsz"] is True and lab.micro_batch["turned_off"] == []
    (w,) = [w for w in check(verl, lab).warnings if w.rule == "micro_batch_explicit"]
    assert "is IGNORED" in w.message and w.checked.startswith("re-checked")
    verl, lab = _settled()  # no micro-batch of the user's: nothing to say, dynamic batching stays on
    assert lab.micro_batch == {} and verl["actor_rollout_ref"]["actor"]["use_dynamic_bsz"] is True


def test_experiment_name_folder():
    """A run name the command line does not spell out (an interpolation here; a config file alike) is the rule's:
    refused with the safe spelling, and that override passes."""
    r = check(*composed("experiment_name='${lab.model.name} x'"))
    p = only(r.errors, "experiment_name_folder")
    assert "trainer.experiment_name='qwen3_1_7b x' names the run's folders" in p.message
    assert p.fix == "experiment_name=qwen3_1_7b_x" and p.checked.startswith("re-checked: the preflight passes")
    assert "experiment_name_folder" not in rules(check(*composed("experiment_name=qwen3_1_7b_x")).errors)
